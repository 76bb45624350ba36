"""An in-memory SQS: the semantics of the service, for fast and exact tests.

It models what a consumer depends on (see ../../docs/delivery.md): visibility
timeouts restarted from now, receipt handles renewed on every receive and stale
afterwards, receive counts, redrive to a dead-letter queue, delays, FIFO group
ordering, deduplication and ``ReceiveRequestAttemptId``, the 12-hour visibility
cap, long polls that return as soon as a message becomes visible, and the batch
rules. Time comes from an injected clock, so tests advance time instead of
sleeping; with a ``seed``, message ids and receipt handles repeat run after run.

This module is the service (its queues, its lock, long polls, injected faults, the
batch calls) and ``MemoryTransport``, a ``Transport`` bound to one of its queues;
what one queue holds and what a receive or a send does to it is ``memory_queue.py``.
Memory stays flat however many messages pass: a receipt handle names its message,
its receive and its queue, with a keyed digest the service checks, so no handle is
kept once issued (see ``memory_queue.Handles``).
"""

from __future__ import annotations

import dataclasses
import json
import random
import threading
import uuid
from collections import Counter, OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

from ..clock import Clock, SystemClock
from ..config import MAX_VISIBILITY, MAX_WAIT_TIME
from ..errors import QueueNotFound, TransportError
from . import (
    MAX_BATCH,
    MAX_BATCH_BYTES,
    BatchResult,
    EntryFailure,
    Envelope,
    OutgoingMessage,
    QueueCounts,
    QueueInfo,
    check_batch,
)
from .memory_queue import ATTEMPT_ID, Handles, MemoryQueue, StoredMessage

DELETED_KEPT = 10_000  # deleted messages remembered, for deliver_again
# SQS's answer to a visibility change naming a deleted message or a stale handle.
GONE = "Message does not exist or is not available for visibility timeout change"


def _error(code: str, message: str) -> TransportError:
    return TransportError(f"{code}: {message}", code=code, retryable=False)


class MemorySQS:
    """The service: holds the queues and hands out transports bound to one of them."""

    def __init__(
        self,
        clock: Clock | None = None,
        seed: int | None = None,
        *,
        region: str = "us-east-1",
        account: str = "123456789012",
    ) -> None:
        """``seed``: message ids and receipt handles drawn from ``random.Random(seed)``, so
        that a run replays exactly; without it they differ from one service to the next."""
        self.clock = clock or SystemClock()
        self._rng = random.Random(seed)  # message ids and the handles' key; under _lock
        self._handles = Handles(self._rng)
        self.region = region
        self.account = account
        self.requests: Counter[str] = Counter()  # API action -> calls, for cost figures
        self.request_errors: Counter[tuple[str, str]] = Counter()  # (action, code) -> failures
        self._queues: dict[str, MemoryQueue] = {}
        self._faults: dict[str, list[Exception]] = {}
        # (queue, id): for deliver_again, oldest first (a dict's first key, once the keys
        # before it were deleted, is found by walking over their holes)
        self._deleted: OrderedDict[tuple[str, str], StoredMessage] = OrderedDict()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # notified when messages may be ready

    # -- administration -------------------------------------------------------

    def create_queue(self, name: str, attributes: Mapping[str, str] | None = None) -> QueueInfo:
        attributes = dict(attributes or {})
        fifo = name.endswith(".fifo")
        if attributes.get("FifoQueue", "false").lower() == "true" and not fifo:
            raise _error("InvalidParameterValue", "a FIFO queue's name must end with .fifo")
        redrive = json.loads(attributes["RedrivePolicy"]) if "RedrivePolicy" in attributes else {}
        info = QueueInfo(
            url=f"https://sqs.{self.region}.amazonaws.com/{self.account}/{name}",
            name=name,
            arn=f"arn:aws:sqs:{self.region}:{self.account}:{name}",
            fifo=fifo,
            visibility_timeout=int(attributes.get("VisibilityTimeout", 30)),
            maximum_message_size=int(attributes.get("MaximumMessageSize", 1_048_576)),
            dead_letter_arn=redrive.get("deadLetterTargetArn"),
            max_receive_count=int(redrive["maxReceiveCount"]) if redrive else None,
            content_deduplication=attributes.get("ContentBasedDeduplication", "").lower() == "true",
        )
        with self._lock:
            self._queues[name] = MemoryQueue(
                info=info,
                delay_seconds=int(attributes.get("DelaySeconds", 0)),
            )
        return info

    def create_queue_with_dlq(
        self, name: str, max_receive_count: int = 3, **attributes: str
    ) -> QueueInfo:
        suffix = ".fifo" if name.endswith(".fifo") else ""
        dlq = self.create_queue(name.removesuffix(".fifo") + "-dlq" + suffix, attributes)
        policy = {"deadLetterTargetArn": dlq.arn, "maxReceiveCount": max_receive_count}
        return self.create_queue(name, {**attributes, "RedrivePolicy": json.dumps(policy)})

    def transport(self, queue: str) -> MemoryTransport:
        name = queue.rsplit("/", 1)[-1].rsplit(":", 1)[-1]
        with self._lock:
            if name not in self._queues:
                raise QueueNotFound(f"queue {queue!r} does not exist")
            return MemoryTransport(self, self._queues[name].info)

    def inject_fault(self, action: str, error: Exception, times: int = 1) -> None:
        """Make the next ``times`` calls of ``action`` (e.g. "ReceiveMessage") raise ``error``."""
        with self._lock:
            self._faults.setdefault(action, []).extend([error] * times)

    def stored(self, queue: str) -> list[Envelope]:
        """What ``queue`` holds now, visible or not, without receiving it (a test's look;
        SQS has no such call): each as an envelope without a receipt handle."""
        with self._lock:
            return [
                Envelope(
                    m.message_id,
                    "",
                    m.body,
                    {"ApproximateReceiveCount": str(m.receive_count)},
                    dict(m.message_attributes),
                )
                for m in self._queue(queue).messages.values()
            ]

    def next_visible(self, queue: str) -> float | None:
        """When the next message of ``queue`` hidden now (in flight or delayed) becomes
        visible; None when none is hidden."""
        with self._lock:
            now = self.clock.monotonic()
            hidden = [m.visible_at for m in self._queue(queue).messages.values()]
            return min((at for at in hidden if at > now), default=None)

    def deliver_again(self, queue: str, message_id: str) -> None:
        """Deliver a message once more, as SQS's at-least-once may: one still held becomes
        visible now (its handle stays valid, as a rare duplicate's would); one deleted
        comes back under its message id. Raises ``KeyError`` for a message never seen."""
        with self._changed:
            q = self._queue(queue)
            message = q.messages.get(message_id)
            if message is None:
                gone = self._deleted.get((queue, message_id))
                if gone is None:
                    raise KeyError(f"{queue} never held a message {message_id}")
                message = dataclasses.replace(gone, handle=None, received_at=None, attempt_id=None)
                message.visible_at = self.clock.monotonic()
                q.add(message, message.visible_at)
            else:
                now = self.clock.monotonic()
                q.show_at(message, now, now)
            self._changed.notify_all()

    def clear_faults(self) -> None:
        """Forget the faults injected and not yet raised."""
        with self._lock:
            self._faults.clear()

    # -- the API, called by MemoryTransport ------------------------------------

    @contextmanager
    def _request(self, action: str) -> Iterator[None]:
        """Count the request and its failure; raise an injected fault. Hold the lock."""
        self.requests[action] += 1
        try:
            faults = self._faults.get(action)
            if faults:
                raise faults.pop(0)
            yield
        except Exception as exc:
            self.request_errors[action, getattr(exc, "code", None) or type(exc).__name__] += 1
            raise

    def _queue(self, name: str) -> MemoryQueue:
        try:
            return self._queues[name]
        except KeyError:
            raise _error("QueueDoesNotExist", f"queue {name!r} does not exist") from None

    def receive(
        self,
        name: str,
        max_messages: int,
        wait_seconds: int,
        visibility: int,
        attempt_id: str | None = None,
    ) -> list[Envelope]:
        with self._changed, self._request("ReceiveMessage"):
            if not 1 <= max_messages <= MAX_BATCH:
                raise _error("InvalidParameterValue", "MaxNumberOfMessages must be from 1 to 10")
            if not 0 <= wait_seconds <= MAX_WAIT_TIME:
                raise _error("InvalidParameterValue", "WaitTimeSeconds must be from 0 to 20")
            if not 0 <= visibility <= MAX_VISIBILITY:
                raise _error("InvalidParameterValue", "VisibilityTimeout must be from 0 to 43200")
            queue = self._queue(name)
            if not queue.info.fifo:
                attempt_id = None  # the parameter applies to FIFO queues only
            else:
                queue.forget_attempts(self.clock)
            if attempt_id is not None:
                if not ATTEMPT_ID.match(attempt_id):
                    raise _error(
                        "InvalidParameterValue",
                        "ReceiveRequestAttemptId must be 1 to 128 letters, digits or punctuation",
                    )
                again = queue.retry(attempt_id, visibility, self.clock)
                if again is not None:
                    return again
            deadline = self.clock.monotonic() + wait_seconds
            while True:
                taken, doomed, next_visible = queue.take(
                    max_messages, visibility, attempt_id, self.clock, self._handles
                )
                for message in doomed:
                    self._dead_letter(queue, message)
                now = self.clock.monotonic()
                if taken or now >= deadline:
                    if taken and attempt_id is not None:
                        queue.remember_attempt(attempt_id, taken, now)
                    return taken
                # Sends, deletes and visibility changes notify; time passing does not:
                # wake when the next hidden message comes back, if the poll lasts that long.
                wake = deadline if next_visible is None else min(deadline, next_visible)
                self.clock.wait(self._changed, wake)

    def _dead_letter(self, queue: MemoryQueue, message: StoredMessage) -> None:
        queue.remove(message.message_id)
        target = queue.info.dead_letter_arn or ""
        dlq = self._queues.get(target.rsplit(":", 1)[-1])
        if dlq is None:
            return  # SQS drops it too when the target is gone
        message.receive_count = 0
        message.handle = None
        message.received_at = None
        message.attempt_id = None
        message.first_receive_ms = None
        message.visible_at = self.clock.monotonic()
        dlq.add(message, message.visible_at)
        self._changed.notify_all()

    def _owner(
        self, queue: MemoryQueue, handle: str
    ) -> tuple[StoredMessage | None, EntryFailure | None]:
        """The message a handle names (None: deleted since), or why the handle names none."""
        message_id = self._handles.message_id(queue.info.name, handle)
        if message_id is None:
            return None, EntryFailure(
                "", "ReceiptHandleIsInvalid", f'The input receipt handle "{handle}" is not valid.'
            )
        return queue.messages.get(message_id), None

    def delete_batch(self, name: str, entries: Sequence[tuple[str, str]]) -> BatchResult:
        check_batch([entry_id for entry_id, _ in entries])
        result = BatchResult()
        with self._changed, self._request("DeleteMessageBatch"):
            queue = self._queue(name)
            now = self.clock.monotonic()
            for entry_id, handle in entries:
                message, failure = self._owner(queue, handle)
                if failure is not None:
                    result.failed.append(EntryFailure(entry_id, failure.code, failure.message))
                elif message is None or message.handle != handle:
                    # Deleted already, or received again since: a stale handle.
                    if queue.info.fifo and message is not None:
                        result.failed.append(
                            EntryFailure(entry_id, "ReceiptHandleIsInvalid", "the handle expired")
                        )
                    else:
                        result.succeeded.append(entry_id)  # SQS reports success, deletes nothing
                elif queue.info.fifo and not message.in_flight(now):
                    result.failed.append(
                        EntryFailure(entry_id, "ReceiptHandleIsInvalid", "the handle expired")
                    )
                else:
                    queue.remove(message.message_id)
                    self._remember_deleted(name, message)
                    result.succeeded.append(entry_id)
            self._changed.notify_all()  # a FIFO group may be unblocked
        return result

    def _remember_deleted(self, name: str, message: StoredMessage) -> None:
        """The latest deleted messages, for ``deliver_again``. Under ``_lock``."""
        self._deleted[(name, message.message_id)] = message
        if len(self._deleted) > DELETED_KEPT:
            self._deleted.popitem(last=False)

    def change_visibility_batch(
        self, name: str, entries: Sequence[tuple[str, str, int]]
    ) -> BatchResult:
        check_batch([entry_id for entry_id, _, _ in entries])
        result = BatchResult()
        with self._changed, self._request("ChangeMessageVisibilityBatch"):
            queue = self._queue(name)
            now = self.clock.monotonic()
            for entry_id, handle, seconds in entries:
                message, failure = self._owner(queue, handle)
                if failure is not None:
                    result.failed.append(EntryFailure(entry_id, failure.code, failure.message))
                elif message is None or message.handle != handle:
                    # Deleted, or received again since: SQS's words for both.
                    result.failed.append(
                        EntryFailure(
                            entry_id,
                            "InvalidParameterValue",
                            f"Value {handle} for parameter ReceiptHandle is invalid. "
                            f"Reason: {GONE}.",
                        )
                    )
                elif not message.in_flight(now):
                    result.failed.append(
                        EntryFailure(
                            entry_id,
                            "MessageNotInflight",
                            "the message is not available for a visibility timeout change",
                        )
                    )
                elif not 0 <= seconds <= MAX_VISIBILITY:
                    result.failed.append(
                        EntryFailure(
                            entry_id, "InvalidParameterValue", "maximum visibility timeout is 43200"
                        )
                    )
                elif message.received_at is not None and (
                    now - message.received_at + seconds > MAX_VISIBILITY
                ):
                    result.failed.append(
                        EntryFailure(
                            entry_id,
                            "InvalidParameterValue",
                            "Total VisibilityTimeout for the message is beyond the limit "
                            "[43200 seconds]",
                        )
                    )
                else:
                    queue.show_at(message, now + seconds, now)
                    message.attempt_id = None  # changed: a retried receive cannot return it
                    result.succeeded.append(entry_id)
            self._changed.notify_all()
        return result

    def send_batch(self, name: str, messages: Sequence[OutgoingMessage]) -> BatchResult:
        check_batch([str(i) for i in range(len(messages))])
        result = BatchResult()
        with self._changed, self._request("SendMessageBatch"):
            queue = self._queue(name)
            size = sum(m.size for m in messages)
            if size > MAX_BATCH_BYTES:
                raise _error(
                    "BatchRequestTooLong",
                    f"the batch is {size} bytes; the limit is {MAX_BATCH_BYTES}",
                )
            for index, outgoing in enumerate(messages):
                entry_id = str(index)
                problem = queue.invalid(outgoing)
                if problem is not None:
                    code, text = problem
                    result.failed.append(EntryFailure(entry_id, code, text))
                    continue
                result.message_ids[entry_id] = queue.enqueue(outgoing, self.clock, self._new_id)
                result.succeeded.append(entry_id)
            self._changed.notify_all()
        return result

    def counts(self, name: str) -> QueueCounts:
        with self._lock, self._request("GetQueueAttributes"):
            return self._queue(name).counts(self.clock.monotonic())

    def _new_id(self) -> str:
        """A message id, drawn from the service's random numbers (under ``_lock``)."""
        return str(uuid.UUID(int=self._rng.getrandbits(128), version=4))


class MemoryTransport:
    """A ``Transport`` bound to one queue of a ``MemorySQS``."""

    def __init__(self, service: MemorySQS, info: QueueInfo) -> None:
        self.service = service
        self.info = info
        self.requests = service.requests
        self.request_errors = service.request_errors

    def receive(
        self,
        max_messages: int,
        wait_seconds: int,
        visibility_timeout: int,
        attempt_id: str | None = None,
    ) -> list[Envelope]:
        return self.service.receive(
            self.info.name, max_messages, wait_seconds, visibility_timeout, attempt_id
        )

    def delete_batch(self, entries: Sequence[tuple[str, str]]) -> BatchResult:
        return self.service.delete_batch(self.info.name, entries)

    def change_visibility_batch(self, entries: Sequence[tuple[str, str, int]]) -> BatchResult:
        return self.service.change_visibility_batch(self.info.name, entries)

    def send_batch(self, messages: Sequence[OutgoingMessage]) -> BatchResult:
        return self.service.send_batch(self.info.name, messages)

    def counts(self) -> QueueCounts:
        return self.service.counts(self.info.name)

    def open(self, queue: str) -> MemoryTransport:
        return self.service.transport(queue)

    def close(self) -> None:
        pass
