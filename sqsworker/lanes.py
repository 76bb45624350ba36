"""Held messages waiting for a handler thread, in the order they may run.

A standard queue has one line, taken in any order by any free thread. A FIFO
queue has one *lane* per message group: a lane runs one message at a time (or, for
a batch handler, one run of its messages in one batch), in the order SQS delivered
them, and different lanes run side by side. SQS returns
a group's messages in order within a receive, and delivers none of a group while
one is in flight (held here), so arrival order is the group's order. (It is also
SequenceNumber order on SQS; moto's sequence numbers are random, so they are not
used.) When a message of a lane fails, the lane's later messages must not
overtake its retry: ``finish`` hands them back to the caller, who returns them to
the queue. SQS then holds the whole group back until the failed message is
received again.

Not thread-safe by itself: the worker calls it under its ``_slots`` lock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .lease import Held


class Line:
    """A standard queue: first come, first taken, no order kept between messages."""

    def __init__(self) -> None:
        self._waiting: deque[Held] = deque()

    def add(self, held: Iterable[Held]) -> None:
        self._waiting.extend(held)

    def take(self) -> Held | None:
        return self._waiting.popleft() if self._waiting else None

    def __len__(self) -> int:
        return len(self._waiting)

    def oldest(self) -> float | None:
        """When the longest waiting message was queued (``Held.queued_at``), or None."""
        return self._waiting[0].queued_at if self._waiting else None

    def take_run(self, limit: int) -> list[Held]:
        """Up to ``limit`` waiting messages, for a batch."""
        return [self._waiting.popleft() for _ in range(min(limit, len(self._waiting)))]

    def finish(self, held: Held, settled: bool) -> list[Held]:
        return []

    def drain(self) -> list[Held]:
        waiting = list(self._waiting)
        self._waiting.clear()
        return waiting


class Lanes:
    """A FIFO queue: one lane per message group, each run one message at a time, in order."""

    def __init__(self) -> None:
        self._lanes: dict[str, deque[Held]] = {}  # group -> its waiting messages, in order
        self._ready: deque[str] = deque()  # groups with waiting messages and none running
        self._running: dict[str, int] = {}  # group -> its messages taken, not yet finished

    def add(self, held: Iterable[Held]) -> None:
        for h in held:
            group = _group(h)
            self._lanes.setdefault(group, deque()).append(h)
            if group not in self._running and group not in self._ready:
                self._ready.append(group)

    def take(self) -> Held | None:
        """The head of the next lane with nothing running, or None."""
        run = self.take_run(1)
        return run[0] if run else None

    def take_run(self, limit: int) -> list[Held]:
        """Up to ``limit`` messages from the head of the next lane with nothing running,
        in order (a batch's part of one group), or none. The group runs until each of
        them is finished."""
        if not self._ready or limit < 1:
            return []
        group = self._ready.popleft()
        lane = self._lanes[group]
        run = [lane.popleft() for _ in range(min(limit, len(lane)))]
        if not lane:
            del self._lanes[group]
        self._running[group] = len(run)
        return run

    def finish(self, held: Held, settled: bool) -> list[Held]:
        """The lane's message is done: deleted or moved (``settled``), or coming back.

        Returns the lane's later messages when it is coming back: they must not run
        before it, so the caller returns them to the queue.
        """
        group = _group(held)
        left = self._running.get(group, 1) - 1
        if left > 0:
            self._running[group] = left  # more of its batch to finish
        else:
            self._running.pop(group, None)
        lane = self._lanes.get(group)
        if not lane:
            return []
        if not settled:
            del self._lanes[group]
            return list(lane)
        if left <= 0:
            self._ready.append(group)
        return []

    def waiting(self, held: Held) -> int:
        """How many later messages of ``held``'s group wait in its lane."""
        return len(self._lanes.get(_group(held), ()))

    def __len__(self) -> int:
        return sum(map(len, self._lanes.values()))

    def oldest(self) -> float | None:
        """Not kept for lanes (no hand-over on a FIFO queue)."""
        return None

    def drain(self) -> list[Held]:
        waiting = [h for lane in self._lanes.values() for h in lane]
        self._lanes.clear()
        self._ready.clear()
        return waiting


def _group(held: Held) -> str:
    return held.message.group_id or ""
