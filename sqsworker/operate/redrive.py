"""``sqsworker redrive``: move a dead-letter queue's messages back, by SQS's own message
move task where the endpoint has it, else here (receive, send, then delete only what
was sent)."""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, TransportError
from ..transports import MAX_BATCH, Envelope, OutgoingMessage
from ..transports.sqs import SQSTransport
from .peeking import hand_back
from .queues import Queues
from .sending import batches

MAX_MOVE_RATE = 500  # StartMessageMoveTask's MaxNumberOfMessagesPerSecond
MOVE_HOLD = 60  # seconds a message being moved by hand stays hidden in the DLQ
# Answers of an endpoint that has no StartMessageMoveTask (moto answers 500).
UNSUPPORTED_CODES = frozenset(
    {"InvalidAction", "UnsupportedOperation", "NotImplemented", "UnknownOperationException", "500"}
)


@dataclass
class MoveReport:
    """What a move here did (a move by SQS reports through ListMessageMoveTasks)."""

    moved: int = 0
    failed: int = 0  # not copied: still in the DLQ only
    in_both: int = 0  # copied, but their delete from the DLQ failed
    status: str = "COMPLETED"  # or FAILED, or CANCELLED (Ctrl-C)
    error: str | None = None  # the failed call that stopped the move


class Redrive:
    """Move a dead-letter queue's messages back: by SQS (StartMessageMoveTask) where the
    endpoint has it, else here (receive, send, then delete only what was sent)."""

    def __init__(
        self,
        queues: Queues,
        dlq: SQSTransport,
        destination: SQSTransport | None,
        *,
        rate: int | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if rate is not None and not 1 <= rate <= MAX_MOVE_RATE:
            raise ConfigError(f"--rate {rate} is out of range: SQS moves 1 to 500 messages/s")
        if destination is not None and destination.info.arn == dlq.info.arn:
            raise ConfigError(
                f"--to names {dlq.info.name} itself: name the queue the messages go back to"
            )
        self.queues = queues
        self.dlq = dlq
        self.rate = rate
        self.sleep = sleep
        sources = queues.sources_of(dlq)
        if not sources:
            raise ConfigError(
                f"{dlq.info.name} is not the dead-letter queue of any queue: redrive moves "
                "messages out of a dead-letter queue; name the queue's DLQ"
            )
        if destination is None and len(sources) == 1:
            destination = queues.open(sources[0])
        self.destination = destination
        self.sources = sources
        self._earlier = 0  # the newest StartedTimestamp of the tasks before ours

    @property
    def destination_name(self) -> str:
        if self.destination is not None:
            return self.destination.info.name
        return "the queues they came from"

    def pending(self) -> int:
        return self.dlq.counts().visible

    # -- by SQS -------------------------------------------------------------------------

    def start(self) -> str | None:
        """Start SQS's move task; its handle, or None when the endpoint has no move tasks."""
        try:
            tasks = self._tasks()
        except TransportError as exc:
            if exc.code in UNSUPPORTED_CODES:
                return None  # nothing was started: the move can go here
            raise
        running = next((t for t in tasks if t.get("Status") == "RUNNING"), None)
        if running is not None:
            raise ConfigError(
                f"a redrive of {self.dlq.info.name} is already running (SQS allows one per "
                f"queue; {running.get('ApproximateNumberOfMessagesMoved', 0)} moved so far): "
                "wait for it to finish, or cancel it with Ctrl-C where it was started"
            )
        self._earlier = max((int(t.get("StartedTimestamp", 0)) for t in tasks), default=0)
        kwargs: dict[str, Any] = {"SourceArn": self.dlq.info.arn}
        if self.destination is not None:
            kwargs["DestinationArn"] = self.destination.info.arn
        if self.rate is not None:
            kwargs["MaxNumberOfMessagesPerSecond"] = self.rate
        # One attempt: a retried start could find its own first attempt running.
        try:
            answer = self.dlq.request("StartMessageMoveTask", 1, **kwargs)
        except TransportError as exc:
            raise TransportError(
                f"{exc}; --client-side moves the messages here instead", code=exc.code
            ) from exc
        return str(answer["TaskHandle"])

    def task(self, handle: str) -> dict[str, Any]:
        """Our task as ListMessageMoveTasks shows it: by its handle while it runs; once it
        ended SQS shows no handle, so the task started after every one seen before ours.
        Not listed yet: taken as running."""
        tasks = self._tasks()
        for task in tasks:
            if task.get("TaskHandle") == handle:
                return task
        ours = [t for t in tasks if int(t.get("StartedTimestamp", 0)) > self._earlier]
        if not ours:
            return {"Status": "RUNNING"}
        return max(ours, key=lambda t: int(t.get("StartedTimestamp", 0)))

    def cancel(self, handle: str) -> int:
        answer = self.dlq.request("CancelMessageMoveTask", TaskHandle=handle)
        return int(answer.get("ApproximateNumberOfMessagesMoved", 0))

    def _tasks(self) -> list[dict[str, Any]]:
        answer = self.dlq.request("ListMessageMoveTasks", 1, SourceArn=self.dlq.info.arn)
        return list(answer.get("Results", []))

    # -- here ---------------------------------------------------------------------------

    def check_here(self) -> None:
        """Refuse a move here that could not tell where each message goes."""
        if self.destination is None:
            raise ConfigError(
                f"{self.dlq.info.name} is the dead-letter queue of {len(self.sources)} queues; "
                "this endpoint cannot route each message back to its own: name one with --to"
            )

    def move_here(
        self,
        progress: Callable[[int], None] = lambda moved: None,
        stop: Callable[[], bool] = lambda: False,
        limit: int | None = None,
    ) -> MoveReport:
        """Receive from the DLQ, send to the destination, delete what was sent: at most
        ``limit`` messages (the DLQ's count at the start, so messages that come back to the
        DLQ during the move are not moved round again), until the DLQ answers empty,
        ``stop()`` says so, or a call fails. A crash between a send and its delete leaves
        the message in both queues."""
        self.check_here()
        assert self.destination is not None
        report = MoveReport()
        began = time.monotonic()
        received = 0
        while not stop():
            want = MAX_BATCH if limit is None else min(MAX_BATCH, limit - received)
            if want <= 0:
                break
            try:
                got = self.dlq.receive(want, 1, MOVE_HOLD)
            except TransportError as exc:
                report.status, report.error = "FAILED", str(exc)
                break
            if not got:
                break
            received += len(got)
            moved, kept, error = self._move(got)
            report.moved += moved
            report.failed += len(got) - moved
            report.in_both += kept
            progress(moved)
            if moved < len(got) or kept or error:
                report.status, report.error = "FAILED", error
                break
            if self.rate is not None:  # no faster than --rate on average
                ahead = report.moved / self.rate - (time.monotonic() - began)
                if ahead > 0:
                    self.sleep(ahead)
        else:  # stop() said so (Ctrl-C): what was received is moved or handed back
            report.status = "CANCELLED"
        return report

    def _move(self, messages: Sequence[Envelope]) -> tuple[int, int, str | None]:
        """Send copies of ``messages`` on, then delete those SQS acknowledged; the rest are
        handed back at once. Returns how many were copied, how many of those are still in
        the DLQ too (their delete failed), and the error that stopped it, if one did."""
        assert self.destination is not None
        fifo = self.destination.info.fifo
        copies = [
            OutgoingMessage(
                m.body,
                message_attributes=m.message_attributes,
                # A fair queue's tenant stays with its message; a FIFO queue needs a group.
                group_id=m.attributes.get("MessageGroupId") or ("redrive" if fifo else None),
                # Not the message's own deduplication id: SQS would drop a copy sent within
                # 5 minutes of the original as a duplicate, and the delete would then lose
                # it. One id per receive: a retry of this send is still deduplicated.
                deduplication_id=hashlib.sha256(m.receipt_handle.encode()).hexdigest()
                if fifo
                else None,
            )
            for m in messages
        ]
        sent: list[int] = []
        error = None
        first = 0
        try:
            for part in batches(copies):  # large bodies: more than one request
                result = self.destination.send_batch(part)
                sent += [first + int(i) for i in result.succeeded]
                first += len(part)
        except TransportError as exc:
            error = str(exc)
        copied = [messages[i] for i in sorted(sent)]
        with contextlib.suppress(TransportError):  # else visible again after MOVE_HOLD
            hand_back(self.dlq, [m for i, m in enumerate(messages) if i not in sent])
        if not copied:
            return 0, 0, error
        try:
            deleted = self.dlq.delete_batch(
                [(str(i), m.receipt_handle) for i, m in enumerate(copied)]
            )
            kept = len(deleted.failed)
        except TransportError as exc:  # each copy was sent: they are in both queues
            kept, error = len(copied), error or str(exc)
        return len(copied), kept, error
