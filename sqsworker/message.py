"""The message a handler receives."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Mapping
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

import structlog

from .errors import MessageDecodeError
from .parsing import parser
from .pointers import Pointer, pointer_of
from .transports import Envelope

T = TypeVar("T")


class Bodies(Protocol):
    """Where offloaded bodies are fetched from (``payloads.Payloads``)."""

    def fetch(self, pointer: Pointer) -> str: ...


class Claim(Protocol):
    """The idempotency claim of a message's key, as its handler sees it
    (``idempotency.Claim``)."""

    def transaction(self) -> AbstractContextManager[Any]: ...


class Lease(Protocol):
    """The visibility lease of a held message, as its handler sees it."""

    @property
    def seconds_left(self) -> float:
        """Seconds before SQS makes the message visible to other consumers."""
        ...

    @property
    def lost(self) -> bool:
        """True once the lease could not be kept: another consumer may now have the message.
        Also true of a message kept after the worker is done with it (deleted or returned)."""
        ...

    def extend(self, seconds: int) -> float:
        """Ask for ``seconds`` more from now (and at each later renewal); returns seconds left.

        Raises ``LeaseLost`` if the lease is gone. The 12-hour cap still applies.
        """
        ...


class DetachedLease:
    """The lease of a message built by hand, for example in a handler's unit test."""

    seconds_left = float("inf")
    lost = False

    def extend(self, seconds: int) -> float:
        return self.seconds_left


class Message:
    """One SQS message and its lease. Attributes are read-only views of what SQS sent."""

    __slots__ = (
        "_envelope",
        "_payload",
        "_receive_count",
        "idempotency",
        "idempotency_key",
        "lease",
        "queue",
    )

    def __init__(self, envelope: Envelope, queue: str = "", lease: Lease | None = None) -> None:
        self._envelope = envelope
        self._receive_count: int | None = None  # read from the envelope once, when asked
        self.queue = queue
        self.lease: Lease = lease if lease is not None else DetachedLease()
        # Set by the worker when an idempotency store is configured: the derived key, and
        # the claim on it while this message holds it.
        self.idempotency_key: str | None = None
        self.idempotency: Claim | None = None
        # An offloaded body, once fetched from S3 (see ``payloads``).
        self._payload: str | None = None

    def __repr__(self) -> str:
        return f"<Message {self.message_id} queue={self.queue!r} receive={self.receive_count}>"

    @classmethod
    def build(
        cls,
        body: str | Mapping[str, Any] | list[Any],
        *,
        message_id: str | None = None,
        **attributes: str,
    ) -> Message:
        """A message with no queue behind it, for unit-testing a handler. A dict or list
        body is sent as its JSON text, as a producer would send it. Each gets an id of its
        own (a batch handler's result names messages by it) unless ``message_id`` is given."""
        if not isinstance(body, str):
            try:
                body = json.dumps(body)
            except TypeError as exc:
                raise TypeError(
                    f"Message.build takes a str, or a dict or list as JSON: {exc}"
                ) from None
        message_id = message_id or f"test-{uuid.uuid4()}"
        return cls(Envelope(message_id, "", body, {"ApproximateReceiveCount": "1", **attributes}))

    @property
    def message_id(self) -> str:
        return self._envelope.message_id

    @property
    def receipt_handle(self) -> str:
        return self._envelope.receipt_handle

    @property
    def body(self) -> str:
        """The body the sender sent: for a message whose body was offloaded to S3, the
        worker fetched it before the handler runs (``sent_body`` is the pointer)."""
        return self._envelope.body if self._payload is None else self._payload

    @property
    def sent_body(self) -> str:
        """The body as SQS holds it: for an offloaded message, the S3 pointer."""
        return self._envelope.body

    @property
    def offloaded_to(self) -> Pointer | None:
        """Where the message's body is in S3, for a message whose body was offloaded.

        Raises ``PayloadMissing`` (a ``Reject``) when the message says it was offloaded
        and its body is not a pointer.
        """
        return pointer_of(self._envelope.body, self._envelope.message_attributes)

    def fetch_body(self, payloads: Bodies) -> None:
        """Fetch an offloaded body from S3 (once), so that ``body`` is the sender's."""
        pointer = self.offloaded_to
        if pointer is not None and self._payload is None:
            self._payload = payloads.fetch(pointer)

    @property
    def attributes(self) -> Mapping[str, str]:
        """System attributes: SentTimestamp, ApproximateReceiveCount, MessageGroupId, ..."""
        return self._envelope.attributes

    @property
    def message_attributes(self) -> Mapping[str, str | bytes]:
        """User attributes by name: str for String and Number types, bytes for Binary."""
        values: dict[str, str | bytes] = {}
        for name, value in self._envelope.message_attributes.items():
            if "StringValue" in value:
                values[name] = str(value["StringValue"])
            elif "BinaryValue" in value:
                raw = value["BinaryValue"]
                values[name] = raw if isinstance(raw, bytes) else base64.b64decode(raw)
        return values

    @property
    def raw_message_attributes(self) -> Mapping[str, Mapping[str, Any]]:
        """User attributes in SQS's own shape, with their data types."""
        return self._envelope.message_attributes

    @property
    def receive_count(self) -> int:
        # Read on the handler's side (three or four times a message), not by the receive
        # thread that builds the message: its work and its faults stay where they were.
        count = self._receive_count
        if count is None:
            count = self._receive_count = self._envelope.receive_count
        return count

    @property
    def group_id(self) -> str | None:
        return self.attributes.get("MessageGroupId")

    @property
    def deduplication_id(self) -> str | None:
        return self.attributes.get("MessageDeduplicationId")

    @property
    def sequence_number(self) -> str | None:
        return self.attributes.get("SequenceNumber")

    @property
    def trace_header(self) -> str | None:
        """The AWS X-Ray trace header the producer sent, if any."""
        return self.attributes.get("AWSTraceHeader")

    @property
    def log_context(self) -> dict[str, Any]:
        """The fields every log line about this message carries. Never the body."""
        # Read twice a message (its handler's log fields, its log line): no property twice.
        envelope = self._envelope
        context: dict[str, Any] = {
            "queue": self.queue,
            "message_id": envelope.message_id,
            "receive_count": self.receive_count,
        }
        attributes = envelope.attributes
        group = attributes.get("MessageGroupId")
        if group is not None:  # a FIFO queue's group, or a fair queue's tenant
            context["group_id"] = group
        trace_header = attributes.get("AWSTraceHeader")
        if trace_header:
            context["aws_trace_header"] = trace_header
        if self.idempotency_key is not None:
            context["idempotency_key"] = self.idempotency_key
        return context

    @property
    def log(self) -> Any:
        """A structlog logger bound to ``log_context``, for the handler's own lines."""
        return structlog.get_logger("sqsworker.handler").bind(**self.log_context)

    @property
    def sent_at(self) -> datetime | None:
        """When SQS took the message, from SentTimestamp; None where a server left it out
        or sent something that is not a time."""
        raw = self.attributes.get("SentTimestamp")
        try:
            return datetime.fromtimestamp(int(raw) / 1000, tz=UTC) if raw else None
        except (ValueError, OverflowError, OSError):
            return None

    def transaction(self) -> AbstractContextManager[Any]:
        """A connection to the idempotency store's database, inside one transaction.

        ``with message.transaction() as db: db.execute(...)``: the handler's writes and
        the record that this message's key is completed commit together when the block
        ends, or not at all (an exception rolls both back). So the effect happens once,
        even if the worker is killed before the message is deleted. Needs
        ``--idempotency-store sqlite:///PATH.db``; see docs/idempotency.md.
        """
        if self.idempotency is None:
            raise RuntimeError(
                "message.transaction() needs an idempotency store: run with "
                "--idempotency-store sqlite:///PATH.db (see docs/idempotency.md)"
            )
        return self.idempotency.transaction()

    def parse(self, model: type[T]) -> T:
        """The body as ``model`` (a pydantic model, a dataclass or a TypedDict), validated;
        ``MessageValidationError`` (a ``Reject``) naming each field that is not. For batch
        handlers, whose messages are not parsed for them."""
        value: T = parser(model)(self.body, self.message_id)
        return value

    def json(self) -> Any:
        """The body parsed as JSON; a body that is not JSON raises ``MessageDecodeError``.

        ``MessageDecodeError`` is a ``Reject``: retrying cannot fix the body, so the
        message goes to the dead-letter queue without using up its retries.
        """
        try:
            return json.loads(self.body)
        except ValueError as exc:
            raise MessageDecodeError(
                f"message {self.message_id} has a body that is not valid JSON ({exc})"
            ) from None
        except RecursionError:
            raise MessageDecodeError(
                f"message {self.message_id} has a body of JSON nested deeper than Python's "
                "parser reads"
            ) from None
