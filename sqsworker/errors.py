"""Every exception sqsworker raises, in one tree.

botocore's errors are translated inside ``transports/sqs.py``; everything above
the transport speaks these.
"""

from __future__ import annotations


class SQSWorkerError(Exception):
    """Base of every error sqsworker raises on its own account."""


class ConfigError(SQSWorkerError):
    """An option has a value that cannot work. The message says which and how to fix it."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class ImportStringError(ConfigError):
    """A ``MODULE:ATTR`` string that does not name a usable handler."""


class HandlerShapeError(ImportStringError, TypeError):
    """A handler that cannot handle a message (async, a generator, a class, the wrong
    arguments), refused before any message is received."""


class StartupError(SQSWorkerError):
    """The worker cannot start: the queue, the credentials or the endpoint are not usable."""


class QueueNotFound(StartupError):
    """The queue named in the configuration does not exist at the endpoint."""


class CredentialsError(StartupError):
    """No usable AWS credentials were found."""


class TransportError(SQSWorkerError):
    """An SQS call failed, after the transport's own retries where the error allowed them.
    ``unapplied``: SQS certainly did not act on it, on any try (it refused it, or it was
    throttled, or no connection was made); else it may have (a timeout, a reset, a 5xx)."""

    def __init__(
        self, message: str, *, code: str = "", retryable: bool = False, unapplied: bool = False
    ) -> None:
        super().__init__(message)
        self.code = code
        self.retryable = retryable
        self.unapplied = unapplied


class LeaseLost(SQSWorkerError):
    """The message's visibility lease can no longer be extended: another consumer may own it."""


class StoreError(SQSWorkerError):
    """A call to the idempotency store failed (unreachable, locked, refused)."""


# Raised by handlers -------------------------------------------------------------


class Retry(Exception):
    """Raise from a handler to return the message to the queue after ``delay`` seconds.

    The attempt uses up a receive (the receive count grows, so a redrive policy still
    applies), and the worker uses this delay instead of its backoff policy. It is
    reported as a retry requested, not as a handler failure.
    """

    def __init__(self, delay: float, reason: str = "") -> None:
        super().__init__(reason or f"retry requested in {delay:g} s")
        if not 0 <= delay <= 43_200:  # also refuses NaN
            raise ValueError(
                f"Retry delay must be from 0 to 43200 seconds (SQS's longest visibility "
                f"timeout); got {delay}."
            )
        self.delay = delay


class Reject(Exception):
    """Raise from a handler when retrying cannot help (a poison message).

    The message skips its remaining attempts: it goes to the queue's dead-letter
    queue when the queue has a redrive policy. See docs/delivery.md.
    """


class MessageDecodeError(Reject):
    """The message body is not what the handler expects (for example, not JSON)."""


class MessageValidationError(MessageDecodeError):
    """The body does not validate as the handler's model: ``errors`` has a "path: reason"
    line for each field (never a value of the body)."""

    def __init__(self, text: str, errors: list[str]) -> None:
        super().__init__(text)
        self.errors = errors


class IdempotencyKeyError(Reject):
    """No idempotency key can be derived from the message (attribute missing, body not JSON).

    A ``Reject``: the same message can never yield a key, so retrying cannot help.
    """


class KeyConflict(Reject):
    """The message's idempotency key was already used by a message with another body."""


class PayloadMissing(Reject):
    """An offloaded body cannot be had from S3, and retrying cannot change that: the
    object or its bucket is gone, the pointer is malformed, or its bucket is not the one
    the worker reads (``--payload-bucket``)."""


class PayloadUnavailable(SQSWorkerError):
    """S3 did not answer a fetch of an offloaded body (throttled, unreachable, denied):
    a failure like any other, retried after the backoff."""
