"""How many messages a worker holds (``Room``), and, for ``--prefetch auto``, how many
it holds beyond the running ones (``Pace``): what the receive side counts by."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from .transports import MAX_BATCH

MAX_POLLS = 32  # receives under way at once, at most


@dataclass(frozen=True)
class Room:
    """How many messages a worker holds, and so how many it asks for."""

    slots: int  # may run at once: one per handler thread, or a batch each
    prefetch_limit: int  # waiting beyond the running ones, at most
    max_deferred: int  # duplicates held for a busy key that take no room, at most
    unanswered: int  # through their handler, delete or return unanswered: held beyond

    @cached_property
    def capacity(self) -> int:
        """Waiting or running, at most."""
        return self.slots + self.prefetch_limit

    @cached_property
    def batch(self) -> int:
        """A receive waits for room for this many."""
        return min(MAX_BATCH, self.capacity)

    @property
    def pollers(self) -> int:
        """One receive thread per batch of capacity: all of it can be asked for at once."""
        return max(1, min(MAX_POLLS, math.ceil(self.capacity / MAX_BATCH)))

    @property
    def held_bound(self) -> int:
        return self.capacity + self.max_deferred + self.unanswered


class Pace:
    """A message's time on its handler thread and a receive's round trip, smoothed, for
    --prefetch auto.

    ``ahead()`` is how many messages the handler threads would finish while one receive
    is under way if none of them waited: held beyond the running ones (waiting, or asked
    for by receives under way), they keep every thread busy until it returns. It counts
    what the threads could do, not what they did: a pace measured while they waited for
    messages would hold fewer and keep them waiting. The caller serialises the calls (the
    inbox's lock).
    """

    WEIGHT = 0.3  # of each new round trip in the smoothed one
    TOOK_WEIGHT = 0.05  # of each message's time: one message is a noisy measure

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self.took = 0.0  # seconds a message keeps its handler thread
        self.trip = 0.0  # seconds a receive that returned messages took

    def finished(self, seconds: float) -> None:
        self.took = _smooth(self.took, max(seconds, 1e-6), self.TOOK_WEIGHT)

    def answered(self, seconds: float) -> None:
        self.trip = _smooth(self.trip, seconds, self.WEIGHT)

    def ahead(self) -> int:
        if self.took == 0:
            return 0
        return math.ceil(self.concurrency * self.trip / self.took)


def _smooth(old: float, new: float, weight: float) -> float:
    """An exponentially weighted mean; the first measure stands alone."""
    return new if old == 0 else old + weight * (new - old)
