"""What the worker tells the outside world, through one seam.

The core never logs or counts by itself: it calls an ``Observer``. Logging
(``logs.py``) is an observer, and so will metrics be. Every method here does
nothing; override the ones you need. An observer that raises is reported on the
standard ``logging`` logger "sqsworker.events" and never breaks the worker.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import WorkerConfig
    from .errors import Retry, TransportError
    from .message import Message
    from .transports import QueueInfo


# Why a FIFO group's later messages go back to the queue (the ``returned`` event's reason).
HANDED_BACK_BEHIND = "an earlier message of its group comes back first"


class Observer:
    def worker_started(self, info: QueueInfo, config: WorkerConfig) -> None: ...

    def received(self, messages: Sequence[Message]) -> None: ...

    def receive_empty(self) -> None: ...

    def receive_failed(self, error: TransportError, retry_in: float) -> None: ...

    def sqs_unanswered(self, seconds: float, error: str) -> None:
        """A receive failed: the receives have failed in a row for ``seconds`` (0 for the
        first), the last with ``error``."""

    def sqs_answered_again(self, seconds: float) -> None:
        """A receive succeeded after the receives had failed for ``seconds``."""

    def receive_repeated(self, message_id: str) -> None:
        """A receive's answer named a message with a receipt handle held already (a proxy
        replaying an answer): it is left out."""

    def handler_started(self, message: Message) -> None: ...

    def handler_succeeded(self, message: Message, duration: float) -> None: ...

    def handler_failed(
        self,
        message: Message,
        error: BaseException,
        duration: float,
        retry_in: float,
        last_attempt: bool,
    ) -> None:
        """The handler raised; the message returns to the queue in ``retry_in`` seconds
        (on its ``last_attempt``, SQS moves it to the dead-letter queue instead)."""

    def handler_retry_requested(
        self, message: Message, request: Retry, duration: float, retry_in: float, last_attempt: bool
    ) -> None:
        """The handler raised ``Retry``: returned as asked; not a failure of the handler."""

    def handler_rejected(
        self, message: Message, error: BaseException, duration: float, dead_letter: str | None
    ) -> None:
        """Non-retryable failure: moved to ``dead_letter``, or kept when there is none."""

    def rejected_copy_failed(
        self,
        message: Message,
        error: BaseException,
        duration: float,
        retry_in: float,
        last_attempt: bool,
    ) -> None:
        """Rejected, but its copy to the dead-letter queue failed: it comes back in
        ``retry_in`` seconds and is rejected again, or, on its ``last_attempt``, SQS
        moves it to the dead-letter queue on its next receive."""

    def handler_skipped(self, message: Message, reason: str) -> None:
        """A held message was not run (its lease was lost while it waited)."""

    def step_failed_settled(self, message: Message, error: BaseException) -> None:
        """A step of the worker's own raised after the message was settled (its delete or
        return queued): it goes as decided; the error is reported, nothing more."""

    def dead_letter_notes_cut(self, message: Message, notes: Sequence[str]) -> None:
        """The dead-letter copy of a rejected message cut or left out these notes (message
        attributes) to fit the dead-letter queue's size limit."""

    def rejected_copy_refused(self, message: Message, error: BaseException, reason: str) -> None:
        """Rejected, but the dead-letter queue refuses any copy of it (``reason``): it is
        returned unrun until SQS's own redrive moves it, without the notes."""

    def step_failed(
        self, message: Message, error: BaseException, retry_in: float, last_attempt: bool
    ) -> None:
        """A step of the worker's own around the handler raised (a bug of ours, or input
        no step could read): the message's failure, returned in ``retry_in`` seconds (on
        its ``last_attempt``, SQS moves it to the dead-letter queue instead)."""

    def deleted(self, messages: Sequence[Message]) -> None: ...

    def delete_failed(self, message: Message, reason: str, will_retry: bool) -> None: ...

    def deleted_after_lease_lost(self, message: Message) -> None:
        """SQS took a delete sent with the receipt handle of a lease lost before: it may
        have delivered the message again meanwhile (the loss was reported then)."""

    def returned(self, messages: Sequence[Message], delay: float, reason: str) -> None:
        """Messages made visible again after ``delay`` seconds (retry backoff or hand-back)."""

    def leases_extended(self, messages: Sequence[Message], seconds: int) -> None: ...

    def lease_lost(self, message: Message, reason: str) -> None: ...

    def lease_near_cap(self, message: Message, seconds_left: float) -> None:
        """The message nears SQS's 12-hour visibility cap; it cannot be held past it."""

    def request_failed(self, action: str, error: TransportError) -> None: ...

    def duplicate_suppressed(self, message: Message) -> None:
        """The message's idempotency key was completed before: deleted without running."""

    def duplicate_deferred(self, message: Message, retry_in: float) -> None:
        """The key is in progress under another claim: returned, looked at in ``retry_in`` s."""

    def key_conflict(self, message: Message, outcome: str) -> None:
        """The key is live with another body; ``outcome`` is "reject" or "suppress"."""

    def claim_lost(self, message: Message, reason: str) -> None:
        """The message's idempotency claim passed to another worker while its handler ran."""

    def store_failed(self, operation: str, error: BaseException) -> None:
        """A call to the idempotency store failed (claim, renew, complete, release)."""

    def loop_blocked(self, seconds: float, where: str) -> None:
        """An async handler has blocked the event loop for ``seconds`` so far; ``where``
        is the code the loop thread is running."""

    def loop_unblocked(self, seconds: float) -> None:
        """The event loop runs again after a stall of about ``seconds``."""

    def shutdown_started(self, waiting: int, running: int) -> None: ...

    def receives_awaited(self, receives: int, seconds: float) -> None:
        """Shutdown waits for ``receives`` long polls under way, ending within ``seconds``."""

    def shutdown_finished(self, clean: bool, handed_back: int, unsettled: int) -> None: ...

    def burst_finished(self) -> None: ...


class Observers(Observer):
    """Fans each event out to several observers.

    Nested ``Observers`` are flattened, and each event calls only the observers that
    handle it (a method of their own, not ``Observer``'s no-op): events come several
    times a message, and most observers handle few of them.
    """

    def __init__(self, observers: Sequence[Observer]) -> None:
        self.observers: list[Observer] = []
        for observer in observers:
            nested = isinstance(observer, Observers)
            self.observers.extend(observer.observers if nested else [observer])  # type: ignore[attr-defined]
        for name in _EVENTS:
            handlers = [(o, getattr(o, name)) for o in self.observers if _handles(o, name)]
            setattr(self, name, _fan_out(name, handlers))


def _handles(observer: Observer, name: str) -> bool:
    own = getattr(type(observer), name, None)
    return name in vars(observer) or own is not getattr(Observer, name)


def _fan_out(name: str, handlers: list[tuple[Observer, Any]]) -> Any:
    def call(*args: Any) -> None:
        for observer, handler in handlers:
            try:
                handler(*args)
            except Exception:  # nothing here may raise: the caller is a worker's thread
                _log.exception("observer %s.%s raised", type(observer).__name__, name)

    return call if handlers else _nothing


def _nothing(*args: Any) -> None:
    pass


_log = logging.getLogger("sqsworker.events")
_EVENTS = [n for n in vars(Observer) if not n.startswith("_")]


class Tally(Observer):
    """Counts what happened; the CLI's closing summary and the tests read it.

    Counts only: a worker runs for months, so nothing here may grow per message.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()

    def _add(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.counts[key] += n

    def received(self, messages: Sequence[Message]) -> None:
        self._add("received", len(messages))

    def receive_empty(self) -> None:
        self._add("empty_receives")

    def receive_failed(self, error: TransportError, retry_in: float) -> None:
        self._add("receive_failures")

    def request_failed(self, action: str, error: TransportError) -> None:
        self._add("request_failures")

    def lease_near_cap(self, message: Message, seconds_left: float) -> None:
        self._add("near_cap")

    def handler_succeeded(self, message: Message, duration: float) -> None:
        self._add("succeeded")

    def handler_failed(
        self,
        message: Message,
        error: BaseException,
        duration: float,
        retry_in: float,
        last_attempt: bool,
    ) -> None:
        self._add("failed")
        if last_attempt:  # SQS moves it to the dead-letter queue on its next receive
            self._add("dead_lettered")

    def handler_retry_requested(
        self, message: Message, request: Retry, duration: float, retry_in: float, last_attempt: bool
    ) -> None:
        self._add("retry_requested")
        if last_attempt:
            self._add("dead_lettered")

    def handler_rejected(
        self, message: Message, error: BaseException, duration: float, dead_letter: str | None
    ) -> None:
        self._add("rejected")
        if dead_letter:
            self._add("dead_lettered")

    def rejected_copy_failed(
        self,
        message: Message,
        error: BaseException,
        duration: float,
        retry_in: float,
        last_attempt: bool,
    ) -> None:
        self._add("rejected")
        if last_attempt:
            self._add("dead_lettered")

    def handler_skipped(self, message: Message, reason: str) -> None:
        self._add("skipped")

    def rejected_copy_refused(self, message: Message, error: BaseException, reason: str) -> None:
        self._add("rejected")

    def step_failed_settled(self, message: Message, error: BaseException) -> None:
        self._add("worker_errors")

    def step_failed(
        self, message: Message, error: BaseException, retry_in: float, last_attempt: bool
    ) -> None:
        self._add("worker_errors")
        if last_attempt:
            self._add("dead_lettered")

    def deleted(self, messages: Sequence[Message]) -> None:
        self._add("deleted", len(messages))

    def delete_failed(self, message: Message, reason: str, will_retry: bool) -> None:
        self._add("delete_failures")
        if not will_retry:  # handled (or dropped as a duplicate), and it may run again
            self._add("not_deleted")

    def deleted_after_lease_lost(self, message: Message) -> None:
        self._add("deleted_after_lease_lost")

    def returned(self, messages: Sequence[Message], delay: float, reason: str) -> None:
        self._add("returned", len(messages))
        if reason == "shutdown":
            self._add("handed_back", len(messages))
        elif reason == HANDED_BACK_BEHIND:
            self._add("fifo_handed_back", len(messages))

    def leases_extended(self, messages: Sequence[Message], seconds: int) -> None:
        self._add("lease_extensions", len(messages))

    def lease_lost(self, message: Message, reason: str) -> None:
        self._add("leases_lost")

    def duplicate_suppressed(self, message: Message) -> None:
        self._add("duplicates_suppressed")

    def duplicate_deferred(self, message: Message, retry_in: float) -> None:
        self._add("duplicates_deferred")

    def key_conflict(self, message: Message, outcome: str) -> None:
        self._add("key_conflicts")

    def claim_lost(self, message: Message, reason: str) -> None:
        self._add("claims_lost")

    def store_failed(self, operation: str, error: BaseException) -> None:
        self._add("store_failures")
