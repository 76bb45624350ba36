"""One queue of the in-memory SQS (``memory.py`` is the service that holds the queues).

A queue holds its messages in send order, each with its receive count, the time it
becomes visible and its latest receipt handle; a FIFO queue also remembers its
deduplication ids and its receive attempts for five minutes each. Here is what a
receive takes from one queue (visible messages, FIFO groups in order, past
maxReceiveCount to be dead-lettered), what a send puts in it and what SQS would
refuse. The service calls these under its lock; time comes from the clock given.

Receipt handles describe themselves (``Handles``), so no handle is kept once issued:
memory stays flat however many messages pass.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..clock import Clock
from . import GROUP_ID, Envelope, OutgoingMessage, QueueCounts, QueueInfo

DEDUP_WINDOW = 300.0
ATTEMPT_WINDOW = 300.0  # how long a FIFO receive can be retried with its ReceiveRequestAttemptId
# Characters SQS accepts in a message body.
_INVALID_BODY = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
# A ReceiveRequestAttemptId: 1 to 128 letters, digits and punctuation.
ATTEMPT_ID = re.compile(r"^[!-~]{1,128}$")


@dataclass
class StoredMessage:
    message_id: str
    body: str
    message_attributes: Mapping[str, Mapping[str, Any]]
    sent_at_ms: int
    visible_at: float
    group_id: str | None = None
    deduplication_id: str | None = None
    sequence_number: str | None = None
    receive_count: int = 0
    first_receive_ms: int | None = None
    handle: str | None = None  # the latest receipt handle; earlier ones are stale
    received_at: float | None = None  # when this receive began: the 12-hour cap counts from it
    # The ReceiveRequestAttemptId of the receive that issued ``handle``, until the
    # message's visibility is changed: a retry of that receive may return it again.
    attempt_id: str | None = None

    def in_flight(self, now: float) -> bool:
        return self.handle is not None and self.visible_at > now


class Handles:
    """Receipt handles that describe themselves: ``message id#receive#digest``.

    The receive number is new on every receive, so a handle names one receive of one
    message; the digest (keyed with a secret of this service, over the queue's name,
    the message id and the receive number) tells a handle this queue issued from
    anything else. So the service keeps no handle: the message's current one is all
    it needs to tell a live handle from a stale one.
    """

    def __init__(self, rng: random.Random) -> None:
        self._key = rng.getrandbits(128).to_bytes(16, "big")
        self._receives = itertools.count(1)

    def _digest(self, queue: str, message_id: str, receive: str) -> str:
        text = f"{queue}#{message_id}#{receive}".encode()
        return hashlib.blake2b(text, key=self._key, digest_size=8).hexdigest()

    def issue(self, queue: str, message_id: str) -> str:
        receive = f"{next(self._receives):x}"
        return f"{message_id}#{receive}#{self._digest(queue, message_id, receive)}"

    def message_id(self, queue: str, handle: str) -> str | None:
        """The id of the message ``handle`` names, if ``queue`` issued it; else None."""
        parts = handle.split("#")
        if len(parts) != 3 or parts[2] != self._digest(queue, parts[0], parts[1]):
            return None
        return parts[0]


@dataclass
class MemoryQueue:
    info: QueueInfo
    delay_seconds: int = 0
    messages: dict[str, StoredMessage] = field(default_factory=dict)  # in send order
    # FIFO deduplication id -> (forgotten at, message id), oldest first
    dedup: OrderedDict[str, tuple[float, str]] = field(default_factory=OrderedDict)
    # FIFO ReceiveRequestAttemptId -> (forgotten at, [(message id, receipt handle)]), oldest
    # first; only receives that returned messages, for ATTEMPT_WINDOW seconds
    attempts: OrderedDict[str, tuple[float, list[tuple[str, str]]]] = field(
        default_factory=OrderedDict
    )
    sequence: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    removed: int = 0  # messages removed since ``messages`` was last rebuilt

    def remove(self, message_id: str) -> None:
        """Forget a message: deleted, or moved to the dead-letter queue.

        Every receive iterates ``messages`` from the oldest, and a dict's iteration walks
        the holes its removals left, until it is rebuilt: so it is rebuilt (in the same
        order) once the holes outnumber the messages."""
        del self.messages[message_id]
        self.removed += 1
        if self.removed > max(64, len(self.messages)):
            self.messages = dict(self.messages)
            self.removed = 0

    # -- receiving ---------------------------------------------------------------------

    def take(
        self, limit: int, visibility: int, attempt_id: str | None, clock: Clock, handles: Handles
    ) -> tuple[list[Envelope], list[StoredMessage], float | None]:
        """Receive up to ``limit`` messages. Also returns the messages past their
        maxReceiveCount, for the service to move to the dead-letter queue (still here),
        and when the soonest hidden one comes back."""
        now = clock.monotonic()
        wall_ms = int(clock.time() * 1000)
        fifo = self.info.fifo
        # FIFO: while any message of a group is in flight, no later one is delivered.
        blocked = (
            {m.group_id for m in self.messages.values() if m.in_flight(now)} if fifo else set()
        )
        out: list[Envelope] = []
        doomed: list[StoredMessage] = []  # past maxReceiveCount: to the dead-letter queue
        next_visible: float | None = None
        for message in self.messages.values():
            if len(out) >= limit:
                break
            if message.visible_at > now:
                if next_visible is None or message.visible_at < next_visible:
                    next_visible = message.visible_at
                if fifo:
                    blocked.add(message.group_id)  # a later message of the group waits for it
                continue
            if fifo and message.group_id in blocked:
                continue
            if (
                self.info.max_receive_count is not None
                and message.receive_count >= self.info.max_receive_count
            ):
                doomed.append(message)
                continue
            message.receive_count += 1
            message.first_receive_ms = message.first_receive_ms or wall_ms
            message.handle = handles.issue(self.info.name, message.message_id)
            message.received_at = now
            message.visible_at = now + visibility
            message.attempt_id = attempt_id
            out.append(envelope(message))
        return out, doomed, next_visible

    def retry(self, attempt_id: str, visibility: int, clock: Clock) -> list[Envelope] | None:
        """A FIFO receive retried with its ReceiveRequestAttemptId: the same messages and
        receipt handles, hidden for ``visibility`` from now, if none was deleted, received
        again or had its visibility changed since. None: receive as usual.

        What SQS answers to a retry whose messages were changed meanwhile is not
        documented; this model then receives afresh under the same id.
        """
        now = clock.monotonic()
        attempts = self.attempts
        record = attempts.get(attempt_id)
        if record is None:
            return None
        messages = [self.messages.get(message_id) for message_id, _ in record[1]]
        for message, (_, handle) in zip(messages, record[1], strict=True):
            if message is None or message.handle != handle or message.attempt_id != attempt_id:
                del attempts[attempt_id]
                return None
        out: list[Envelope] = []
        for message in messages:
            assert message is not None
            message.visible_at = now + visibility  # "it resets the visibility timeout"
            out.append(envelope(message))
        return out

    def remember_attempt(self, attempt_id: str, taken: list[Envelope], now: float) -> None:
        """A FIFO receive under ``attempt_id`` returned ``taken``: a retry within
        ATTEMPT_WINDOW may return them again."""
        self.attempts.pop(attempt_id, None)  # the newest is the last
        self.attempts[attempt_id] = (
            now + ATTEMPT_WINDOW,
            [(e.message_id, e.receipt_handle) for e in taken],
        )

    def forget_attempts(self, clock: Clock) -> None:
        """Drop the attempt ids whose 5 minutes have passed (the oldest come first)."""
        now = clock.monotonic()
        attempts = self.attempts
        while attempts and next(iter(attempts.values()))[0] <= now:
            attempts.popitem(last=False)

    # -- sending -----------------------------------------------------------------------

    def invalid(self, outgoing: OutgoingMessage) -> tuple[str, str] | None:
        """Why SQS would refuse ``outgoing`` on this queue (its code and text); None if
        it would take it."""
        if not outgoing.body:
            return "MissingParameter", "the message body must not be empty"
        if _INVALID_BODY.search(outgoing.body):
            return "InvalidMessageContents", "the message body contains characters SQS refuses"
        if outgoing.size > self.info.maximum_message_size:
            return "InvalidParameterValue", "the message is larger than the queue's limit"
        if not 0 <= outgoing.delay_seconds <= 900:
            return "InvalidParameterValue", "DelaySeconds must be from 0 to 900"
        if outgoing.group_id is not None and not GROUP_ID.match(outgoing.group_id):
            return (
                "InvalidParameterValue",
                "MessageGroupId takes 1 to 128 letters, digits or punctuation",
            )
        if self.info.fifo:
            if outgoing.group_id is None:
                return "MissingParameter", "a FIFO queue needs a MessageGroupId"
            if outgoing.deduplication_id is None and not self.info.content_deduplication:
                return "InvalidParameterValue", "a FIFO queue needs a MessageDeduplicationId"
            if outgoing.delay_seconds:
                return "InvalidParameterValue", "FIFO queues take no per-message delay"
        elif outgoing.deduplication_id is not None:  # as SQS does (moto takes it)
            return "InvalidParameterValue", "a standard queue takes no MessageDeduplicationId"
        return None

    def enqueue(self, outgoing: OutgoingMessage, clock: Clock, new_id: Callable[[], str]) -> str:
        """Keep ``outgoing`` (checked already) under a message id ``new_id`` draws; on a
        FIFO queue, a duplicate within DEDUP_WINDOW is accepted under the first one's id
        and not kept twice."""
        now = clock.monotonic()
        dedup_id = outgoing.deduplication_id
        if self.info.fifo:
            if dedup_id is None:
                dedup_id = hashlib.sha256(outgoing.body.encode()).hexdigest()
            while self.dedup and next(iter(self.dedup.values()))[0] <= now:
                self.dedup.popitem(last=False)  # oldest first: forget what passed the window
            if dedup_id in self.dedup:
                return self.dedup[dedup_id][1]  # accepted, not delivered twice
        message = StoredMessage(
            message_id=new_id(),
            body=outgoing.body,
            message_attributes=dict(outgoing.message_attributes),
            sent_at_ms=int(clock.time() * 1000),
            visible_at=now + (outgoing.delay_seconds or self.delay_seconds),
            group_id=outgoing.group_id,  # a standard queue keeps it too: a fair queue
            deduplication_id=dedup_id if self.info.fifo else None,
            sequence_number=f"{next(self.sequence):020d}" if self.info.fifo else None,
        )
        if dedup_id is not None and self.info.fifo:
            self.dedup[dedup_id] = (now + DEDUP_WINDOW, message.message_id)
        self.messages[message.message_id] = message
        return message.message_id

    # -- looking -----------------------------------------------------------------------

    def counts(self, now: float) -> QueueCounts:
        messages = self.messages.values()
        in_flight = sum(1 for m in messages if m.in_flight(now))
        delayed = sum(1 for m in messages if m.handle is None and m.visible_at > now)
        return QueueCounts(len(messages) - in_flight - delayed, in_flight, delayed)


def envelope(message: StoredMessage) -> Envelope:
    """``message`` as the receive that issued its current handle returns it."""
    attributes = {
        "SenderId": "AIDAMEMORYSQS",
        "SentTimestamp": str(message.sent_at_ms),
        "ApproximateReceiveCount": str(message.receive_count),
        "ApproximateFirstReceiveTimestamp": str(message.first_receive_ms),
    }
    if message.group_id is not None:
        attributes["MessageGroupId"] = message.group_id
    if message.deduplication_id is not None:
        attributes["MessageDeduplicationId"] = message.deduplication_id
    if message.sequence_number is not None:
        attributes["SequenceNumber"] = message.sequence_number
    assert message.handle is not None
    return Envelope(
        message_id=message.message_id,
        receipt_handle=message.handle,
        body=message.body,
        attributes=attributes,
        message_attributes=dict(message.message_attributes),
    )
