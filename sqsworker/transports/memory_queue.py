"""One queue of the in-memory SQS (``memory.py`` is the service that holds the queues).

A queue holds its messages in send order, each with its receive count, the time it
becomes visible and its latest receipt handle; a FIFO queue also remembers its
deduplication ids and its receive attempts for five minutes each. Here is what a
receive takes from one queue (visible messages, FIFO groups in order, past
maxReceiveCount to be dead-lettered), what a send puts in it and what SQS would
refuse. The service calls these under its lock; time comes from the clock given.

Receipt handles describe themselves (``Handles``), so no handle is kept once issued:
memory stays flat however many messages pass.

A standard queue also keeps an index of what a receive can take (``Visibility``), so a
receive costs the same with ten thousand messages in flight as with none; a FIFO queue's
receive walks its messages, as its groups' order needs.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import random
import re
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
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
    order: int = 0  # its place in ``MemoryQueue.messages``: a receive takes the lowest first
    mark: int = 0  # which of its entries among the visible (``Visibility.ready``) is current

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


class Visibility:
    """Which messages of a standard queue a receive can take, oldest first, without
    walking the ones in flight or delayed.

    Two heaps: ``ready`` holds (order, mark, id) of the visible messages, ``hidden`` holds
    (visible at, order, id) of the hidden ones. A message changes its time or leaves by
    leaving stale entries behind, which are told by the message itself (gone, another
    time or order, another mark) and dropped when they reach the top; both heaps are
    rebuilt from the messages once stale entries outnumber them. So a receive returns
    exactly what walking the messages in order would.
    """

    def __init__(self, messages: dict[str, StoredMessage]) -> None:
        self.ready: list[tuple[int, int, str]] = []
        self.hidden: list[tuple[float, int, str]] = []
        self.rebuild(messages, None)

    def place(self, message: StoredMessage, now: float) -> None:
        """``message`` is new here, or its visibility changed."""
        if message.visible_at > now:
            heapq.heappush(self.hidden, (message.visible_at, message.order, message.message_id))
        else:
            message.mark += 1
            heapq.heappush(self.ready, (message.order, message.mark, message.message_id))

    def visible(self, messages: dict[str, StoredMessage], now: float) -> Iterator[StoredMessage]:
        """The visible messages, oldest first. Each is taken off the index as it is
        yielded: the caller places it again, whatever it did with it."""
        self._promote(messages, now)
        ready = self.ready
        while ready:
            order, mark, message_id = heapq.heappop(ready)
            message = messages.get(message_id)
            if (
                message is not None
                and message.order == order  # not an earlier copy's (delivered again)
                and message.mark == mark
                and message.visible_at <= now
            ):
                yield message

    def next_visible(self, messages: dict[str, StoredMessage], now: float) -> float | None:
        """When the soonest hidden message comes back; None if none is hidden."""
        self._promote(messages, now)
        hidden = self.hidden
        while hidden:
            at, order, message_id = hidden[0]
            message = messages.get(message_id)
            if message is not None and message.visible_at == at and message.order == order:
                return at
            heapq.heappop(hidden)
        return None

    def _promote(self, messages: dict[str, StoredMessage], now: float) -> None:
        """The hidden messages whose time has come join the visible."""
        hidden, ready = self.hidden, self.ready
        while hidden and hidden[0][0] <= now:
            at, order, message_id = heapq.heappop(hidden)
            message = messages.get(message_id)
            if message is not None and message.visible_at == at and message.order == order:
                message.mark += 1
                heapq.heappush(ready, (order, message.mark, message_id))

    def tidy(self, messages: dict[str, StoredMessage], now: float) -> None:
        """Rebuild both heaps once their stale entries outnumber the messages."""
        if len(self.ready) + len(self.hidden) > 2 * len(messages) + 64:
            self.rebuild(messages, now)

    def rebuild(self, messages: dict[str, StoredMessage], now: float | None) -> None:
        self.ready.clear()
        self.hidden.clear()
        for message in messages.values():
            if now is None or message.visible_at > now:
                self.hidden.append((message.visible_at, message.order, message.message_id))
            else:
                message.mark += 1
                self.ready.append((message.order, message.mark, message.message_id))
        heapq.heapify(self.ready)
        heapq.heapify(self.hidden)


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
    orders: itertools.count[int] = field(default_factory=itertools.count)
    index: Visibility | None = None  # a standard queue's; set in __post_init__

    def __post_init__(self) -> None:
        if not self.info.fifo:
            self.index = Visibility(self.messages)

    def add(self, message: StoredMessage, now: float) -> None:
        """Keep ``message`` (new, dead-lettered here, or delivered again) as the newest."""
        message.order = next(self.orders)
        self.messages[message.message_id] = message
        if self.index is not None:
            self.index.place(message, now)
            self.index.tidy(self.messages, now)

    def show_at(self, message: StoredMessage, at: float, now: float) -> None:
        """``message`` becomes visible at ``at`` (hidden until then)."""
        message.visible_at = at
        if self.index is not None:
            self.index.place(message, now)
            self.index.tidy(self.messages, now)  # renewals with no receive between

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
        index = self.index
        if index is None:
            return self._take_fifo(limit, visibility, attempt_id, now, wall_ms, handles)
        out: list[Envelope] = []
        doomed: list[StoredMessage] = []  # past maxReceiveCount: to the dead-letter queue
        taken: list[StoredMessage] = []
        for message in index.visible(self.messages, now):
            if self._doomed(message):
                doomed.append(message)  # removed by the service
            else:
                self._issue(message, now, wall_ms, visibility, attempt_id, handles)
                taken.append(message)
                out.append(envelope(message))
                if len(out) >= limit:
                    break
        for message in taken:  # after the walk: a visibility of 0 leaves it visible
            index.place(message, now)
        index.tidy(self.messages, now)
        return out, doomed, index.next_visible(self.messages, now) if not out else None

    def _take_fifo(
        self,
        limit: int,
        visibility: int,
        attempt_id: str | None,
        now: float,
        wall_ms: int,
        handles: Handles,
    ) -> tuple[list[Envelope], list[StoredMessage], float | None]:
        # While any message of a group is in flight, no later one is delivered.
        blocked = {m.group_id for m in self.messages.values() if m.in_flight(now)}
        out: list[Envelope] = []
        doomed: list[StoredMessage] = []
        next_visible: float | None = None
        for message in self.messages.values():
            if len(out) >= limit:
                break
            if message.visible_at > now:
                if next_visible is None or message.visible_at < next_visible:
                    next_visible = message.visible_at
                blocked.add(message.group_id)  # a later message of the group waits for it
                continue
            if message.group_id in blocked:
                continue
            if self._doomed(message):
                doomed.append(message)
                continue
            self._issue(message, now, wall_ms, visibility, attempt_id, handles)
            out.append(envelope(message))
        return out, doomed, next_visible

    def _doomed(self, message: StoredMessage) -> bool:
        """Past maxReceiveCount: a receive moves it to the dead-letter queue."""
        limit = self.info.max_receive_count
        return limit is not None and message.receive_count >= limit

    def _issue(
        self,
        message: StoredMessage,
        now: float,
        wall_ms: int,
        visibility: int,
        attempt_id: str | None,
        handles: Handles,
    ) -> None:
        """``message`` is received: a new handle, hidden for ``visibility``."""
        message.receive_count += 1
        message.first_receive_ms = message.first_receive_ms or wall_ms
        message.handle = handles.issue(self.info.name, message.message_id)
        message.received_at = now
        message.visible_at = now + visibility
        message.attempt_id = attempt_id

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
            self.show_at(message, now + visibility, now)  # "it resets the visibility timeout"
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
        self.add(message, now)
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
