"""Settling: where each message goes once its handler, or a step around it, is done.

Two parts. ``decide`` is a function of plain values: (the outcome, what the message
says, what the queue says) -> one ``Decision``: delete it, return it after a delay, or
copy it to the dead-letter queue and then delete it. Every rule of where a message
goes is in it, the containment rule included (a step of the worker's own that fails is
that message's failure, never its thread's). ``Settler`` carries a decision out in
order: the idempotency claim completed or released, the offloaded body kept or let go,
the delete or return queued with the lease keeper, the span and the report.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import batches, tracing
from .deadletter import REFUSED_CONTENT, RecentIds, dead_letter_copy
from .errors import Reject, Retry, StartupError, TransportError
from .transports import send_all

if TYPE_CHECKING:
    from .clock import Clock
    from .config import WorkerConfig
    from .events import Observer
    from .idempotency import Idempotency
    from .inbox import Inbox
    from .lease import Held, LeaseKeeper
    from .message import Message
    from .payloads import RemoveAfterDelete
    from .policies import Backoff
    from .transports import Transport


class Outcome(enum.Enum):
    SUCCEEDED = "succeeded"  # the handler returned
    DUPLICATE = "duplicate"  # its idempotency key was done before
    RETRY = "retry"  # the handler raised Retry
    FAILED = "failed"  # the handler raised, or a step it needs (store, S3) was unavailable
    REJECTED = "rejected"  # it must not run again: Reject, --non-retryable, a conflict
    COPY_FAILED = "copy failed"  # rejected, and its dead-letter copy could not be sent
    COPY_REFUSED = "copy refused"  # rejected, and SQS refuses any copy of it
    STEP_FAILED = "step failed"  # a step of the worker's own raised
    BUSY = "busy"  # its key is in progress elsewhere, and it may not be held meanwhile


class Action(enum.Enum):
    DELETE = "delete"
    RETURN = "return"  # visible again after ``delay``
    DEAD_LETTER = "dead-letter"  # a copy to the dead-letter queue, then delete


@dataclass(frozen=True)
class Decision:
    action: Action
    delay: float = 0.0  # RETURN: seconds before it is visible again
    reason: str = ""  # RETURN: why (the ``returned`` event's reason)
    urgent: bool = False  # DELETE: at once, not with the next batch
    last_attempt: bool = False  # RETURN: SQS dead-letters it on its next receive


WORKER_ERROR = "worker error"
COPY_REFUSED_REASON = "its dead-letter copy was refused"
BUSY_REASON = "its idempotency key is in progress elsewhere"
NO_DEAD_LETTER_QUEUE = "rejected without a dead-letter queue"


def outcome_of(error: BaseException | None, non_retryable: tuple[type, ...]) -> Outcome:
    """What a handler's return (None) or exception means."""
    if error is None:
        return Outcome.SUCCEEDED
    if isinstance(error, Retry):
        return Outcome.RETRY
    if isinstance(error, batches.BatchReportError):  # ours, not the handler's: retried
        return Outcome.FAILED
    if isinstance(error, Exception) and isinstance(error, (Reject, *non_retryable)):
        return Outcome.REJECTED
    return Outcome.FAILED


DELETE = Decision(Action.DELETE)
DELETE_NOW = Decision(Action.DELETE, urgent=True)


def decide_delete(blocks_its_group: bool) -> Decision:
    """Handled (or a duplicate): deleted, at once when SQS holds its FIFO group back until
    then. Nothing else of the message or the queue matters (the hot path asks this alone)."""
    return DELETE_NOW if blocks_its_group else DELETE


def decide(
    outcome: Outcome,
    *,
    receive_count: int,
    max_receive_count: int | None,
    dead_letter_queue: bool,
    backoff: Callable[[int], float],
    backoff_max: float,
    delay: float | None = None,
    blocks_its_group: bool = False,
) -> Decision:
    """Where a message goes.

    Handled (or a duplicate): deleted, at once when SQS holds its FIFO group back until
    then. Failed: returned after ``delay`` (the handler's Retry) or its backoff, at once
    on its last attempt (SQS moves it to the dead-letter queue on its next receive).
    Rejected: copied to the dead-letter queue and deleted; kept, retried after
    ``backoff_max``, when there is none. A step of the worker's own failed, or the copy:
    returned after its backoff, or ``backoff_max`` when the backoff itself fails. A busy
    key's message that may not be held: returned after ``delay``.
    """
    if outcome in (Outcome.SUCCEEDED, Outcome.DUPLICATE):
        return decide_delete(blocks_its_group)
    if outcome is Outcome.REJECTED:
        if dead_letter_queue:  # deleted at once: until then a crash copies it again
            return Decision(Action.DEAD_LETTER, urgent=True)
        return Decision(Action.RETURN, backoff_max, NO_DEAD_LETTER_QUEUE)
    if outcome is Outcome.BUSY:
        assert delay is not None
        return Decision(Action.RETURN, delay, BUSY_REASON)
    if outcome in (Outcome.RETRY, Outcome.FAILED):  # a failing backoff is a step failing
        last = max_receive_count is not None and receive_count >= max_receive_count
        if last:
            delay = 0.0
        elif delay is None:  # the handler's Retry gives its delay as it wrote it
            delay = backoff(receive_count)
        return Decision(Action.RETURN, delay, "retry", last_attempt=last)
    reason = {Outcome.COPY_REFUSED: COPY_REFUSED_REASON, Outcome.STEP_FAILED: WORKER_ERROR}
    try:
        last = max_receive_count is not None and receive_count >= max_receive_count
        delay = 0.0 if last else backoff(receive_count)
    except Exception:
        last, delay = False, backoff_max
    return Decision(Action.RETURN, delay, reason.get(outcome, "retry"), last_attempt=last)


class Settler:
    """Carries out ``decide``'s decisions for one worker's messages."""

    def __init__(
        self,
        keeper: LeaseKeeper,
        clock: Clock,
        transport: Transport,
        inbox: Inbox,
        config: WorkerConfig,
        backoff: Backoff,
        observer: Observer,
        *,
        idempotency: Idempotency | None,
        remover: RemoveAfterDelete | None,
        tracer: Any,
        batch: bool,
    ) -> None:
        self.keeper = keeper
        self.clock = clock
        self.transport = transport
        self.inbox = inbox
        self.config = config
        self.backoff = backoff
        self.observer = observer
        self.idempotency = idempotency
        self.remover = remover
        self.tracer = tracer
        self.batch = batch  # a batch handler's: its span is the batch's
        self._dead_letter_queue: Transport | None = None
        # Messages no copy of which the dead-letter queue takes: returned unrun until SQS's
        # redrive moves them (ids only, the latest few thousand).
        self.refused_copies = RecentIds(4096)

    def _decision(self, outcome: Outcome, held: Held, delay: float | None = None) -> Decision:
        info = self.transport.info
        return decide(
            outcome,
            receive_count=held.message.receive_count,
            max_receive_count=info.max_receive_count,
            dead_letter_queue=info.dead_letter_arn is not None,
            backoff=self.backoff.delay,
            backoff_max=self.config.backoff_max,
            delay=delay,
            blocks_its_group=(
                outcome in (Outcome.SUCCEEDED, Outcome.DUPLICATE)
                and self.inbox.blocks_its_group(held)
            ),
        )

    # -- the handler's outcome ----------------------------------------------------------

    def settle(self, held: Held, started: float, error: BaseException | None) -> None:
        """The handler's outcome: None when it returned. A step of settling that raises is
        the message's failure all the same (``contain``)."""
        try:
            outcome = outcome_of(error, self.config.non_retryable)
            if outcome is Outcome.SUCCEEDED:
                self.succeeded(held, started)
            elif outcome is Outcome.REJECTED:
                assert error is not None
                self.reject(held, error, started)
            else:
                assert error is not None
                self.fail(held, error, started, error.delay if isinstance(error, Retry) else None)
        except Exception as exc:
            self.contain(held, started, exc)

    def blocks(self, error: BaseException | None) -> bool:
        """True when settling ``error`` calls the idempotency store or sends a copy to the
        dead-letter queue: a coroutine handler's is then settled on a helper thread."""
        if self.idempotency is not None:
            return True
        return (
            error is not None and outcome_of(error, self.config.non_retryable) is Outcome.REJECTED
        )

    def succeeded(self, held: Held, started: float) -> None:
        message = held.message
        self.complete_claim(message)
        self._done_with_body(message)
        self._carry_out(held, decide_delete(self.inbox.blocks_its_group(held)))
        self.traced(message, "succeeded")
        self.observer.handler_succeeded(message, self.clock.monotonic() - started)

    def duplicate(self, held: Held) -> None:
        """Its key was done before: deleted unrun."""
        message = held.message
        self._done_with_body(message)
        self._carry_out(held, self._decision(Outcome.DUPLICATE, held))
        self.traced(message, "duplicate")
        self.observer.duplicate_suppressed(message)

    def fail(self, held: Held, exc: BaseException, started: float, delay: float | None) -> None:
        """Returned for another attempt: after ``delay`` (the handler's Retry), else its
        backoff."""
        message = held.message
        self.release_claim(message)
        outcome = Outcome.RETRY if isinstance(exc, Retry) else Outcome.FAILED
        decision = self._decision(outcome, held, delay)
        self._carry_out(held, decision)
        duration = self.clock.monotonic() - started
        delay, last = decision.delay, decision.last_attempt
        if isinstance(exc, Retry):  # the handler's decision, not a fault
            self.traced(message, "retry requested", retry_in=delay, reason=str(exc))
            self.observer.handler_retry_requested(message, exc, duration, delay, last)
        else:
            self.traced(message, "failed", exc, retry_in=delay, last_attempt=last)
            self.observer.handler_failed(message, exc, duration, delay, last)

    def busy(self, held: Held, retry_in: float) -> None:
        """Its key is in progress elsewhere and it may not be held (a FIFO batch: held, it
        could be taken to run beside its group's earlier messages): returned to the queue
        for ``retry_in``, reported as deferred (its metric and log line are the held
        duplicates')."""
        self._carry_out(held, self._decision(Outcome.BUSY, held, retry_in))
        self.traced(held.message, "deferred", retry_in=retry_in)
        self.observer.duplicate_deferred(held.message, retry_in)

    def refused_before(self, held: Held) -> bool:
        """A message whose dead-letter copy SQS refused: returned unrun (True) until SQS's
        redrive moves it."""
        if held.message.message_id not in self.refused_copies:
            return False
        self._carry_out(held, self._decision(Outcome.COPY_REFUSED, held))
        return True

    def reject(self, held: Held, exc: BaseException, started: float) -> None:
        """A non-retryable failure: to the dead-letter queue now, or kept if there is none."""
        message = held.message
        self.release_claim(message)
        duration = self.clock.monotonic() - started
        decision = self._decision(Outcome.REJECTED, held)
        if decision.action is Action.RETURN:
            # Nowhere safe to put it and deleting would lose it: keep it, retried rarely.
            self._carry_out(held, decision)
            self.traced(message, "rejected", exc, kept_for=decision.delay)
            self.observer.handler_rejected(message, exc, duration, None)
            return
        try:
            dlq = self._dead_letters()
            copy, changed = dead_letter_copy(message, exc, dlq.info)
            if copy is None:
                raise TransportError(
                    f"the message takes more than the dead-letter queue's limit of "
                    f"{dlq.info.maximum_message_size:,} bytes",
                    code="MessageTooLong",
                )
            if changed:
                self.observer.dead_letter_notes_cut(message, changed)
            send_all(dlq, [copy])
        except (TransportError, StartupError) as error:
            self._copy_failed(held, exc, error, duration)
            return
        self._carry_out(held, decision)
        self.traced(message, "rejected", exc, dead_letter_queue=dlq.info.name)
        self.observer.handler_rejected(message, exc, duration, dlq.info.name)

    def _copy_failed(
        self, held: Held, exc: BaseException, error: Exception, duration: float
    ) -> None:
        message = held.message
        if isinstance(error, TransportError) and error.code in REFUSED_CONTENT:
            # No copy of it can go, and running it again would not change that: SQS's
            # own redrive moves it after maxReceiveCount receives. Until then this worker
            # returns it unrun whenever it comes.
            self.refused_copies.add(message.message_id)
            self._carry_out(held, self._decision(Outcome.COPY_REFUSED, held))
            self.traced(message, "rejected", exc, dead_letter_copy_refused=str(error))
            self.observer.rejected_copy_refused(message, exc, str(error))
            return
        failure = error if isinstance(error, TransportError) else TransportError(str(error))
        self.observer.request_failed("SendMessageBatch", failure)
        decision = self._decision(Outcome.COPY_FAILED, held)
        self._carry_out(held, decision)
        retry_in, last = decision.delay, decision.last_attempt
        self.traced(message, "failed", error, retry_in=retry_in, last_attempt=last)
        self.observer.rejected_copy_failed(message, exc, duration, retry_in, last)

    # -- containment: no message can stop a worker ------------------------------------

    def contain(
        self, held: Held, started: float, error: Exception, deferrals: int | None = None
    ) -> bool:
        """A step of the worker's own around the handler raised: fetching or reading the
        body, deriving or claiming its key, settling its outcome. Whether a bug of ours or
        input no step could read, it is that message's failure, never its thread's: its
        claim released, returned after a backoff (--backoff-max when the backoff is what
        failed), reported and counted; on its last attempt SQS dead-letters it. A message
        already on its way out (its delete or return queued) goes as decided, and one
        another thread or the shutdown took since this one set it aside is theirs: both are
        only reported. True when the message is this thread's to finish."""
        message = held.message
        if not self.inbox.reclaim(held, deferrals):
            self.observer.step_failed_settled(message, error)
            return False
        if held.outcome is not None:
            self.observer.step_failed_settled(message, error)
            return True
        if self.remover is not None:
            self.remover.forget(message)  # it comes back: its body is needed
        self.release_claim(message)
        decision = self._decision(Outcome.STEP_FAILED, held)
        self._carry_out(held, decision)
        delay, last = decision.delay, decision.last_attempt
        with contextlib.suppress(Exception):  # the span is a nicety; the thread goes on
            self.traced(message, "failed", error, retry_in=delay, last_attempt=last)
        self.observer.step_failed(message, error, delay, last)
        return True

    def fault_returns(self, held: Held) -> None:
        """A fault that ends a thread (not an Exception): the message goes back at once
        rather than be held unrun, and /healthz reports the thread lost."""
        self.keeper.release(held, 0, WORKER_ERROR, urgent=True)
        self.release_claim(held.message)  # or the claim keeper renews it for ever

    # -- the steps every decision takes ---------------------------------------------------

    def _carry_out(self, held: Held, decision: Decision) -> None:
        """The delete or return queued with the lease keeper. A dead-letter decision's
        copy was sent by ``reject``: what is left of it is the delete."""
        if decision.action is Action.RETURN:
            self.keeper.release(held, decision.delay, decision.reason)
        else:
            self.keeper.succeed(held, urgent=decision.urgent)

    def complete_claim(self, message: Message) -> None:
        if self.idempotency is None:
            return
        try:
            if not self.idempotency.complete(message):
                self.observer.claim_lost(
                    message,
                    "another worker claimed the key while this handler ran (its lease had "
                    "lapsed); the effect may have happened twice",
                )
        except Exception as exc:  # a StoreError, or a store's bug: the delete goes on
            self.observer.store_failed("complete", exc)

    def release_claim(self, message: Message) -> None:
        if self.idempotency is None:
            return
        try:
            self.idempotency.release(message)
        except Exception as exc:  # the claim lapses with its lease instead
            self.observer.store_failed("release", exc)

    def traced(
        self, message: Message, outcome: str, error: BaseException | None = None, **details: Any
    ) -> None:
        """The outcome on the message's consumer span, when traced; on a batch's span, an
        event naming the message."""
        if self.tracer is None:
            return
        if self.batch:
            details["messaging.message.id"] = message.message_id
        tracing.record(outcome, error, **details)

    def _done_with_body(self, message: Message) -> None:
        """The message is handled (or dropped as a duplicate): with --delete-payloads, its
        offloaded body goes once SQS deleted it. A rejected one's is kept: the copy in the
        dead-letter queue points to it."""
        if self.remover is not None:
            self.remover.expect(message)

    def _dead_letters(self) -> Transport:
        if self._dead_letter_queue is None:
            arn = self.transport.info.dead_letter_arn
            assert arn is not None
            self._dead_letter_queue = self.transport.open(arn)
        return self._dead_letter_queue
