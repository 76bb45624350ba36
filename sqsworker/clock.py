"""Time, injected.

Lease timing, visibility expiry and backoff read the time from a ``Clock`` so
that tests advance a ``FakeClock`` instead of sleeping.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes back; for deadlines and leases."""
        ...

    def time(self) -> float:
        """Wall-clock seconds since the epoch; for comparing with SQS timestamps."""
        ...

    def wait(self, cond: threading.Condition, deadline: float | None) -> None:
        """Wait on ``cond`` (held by the caller) until notified or ``monotonic() >= deadline``.

        Like ``Condition.wait`` it may return early; callers re-check their predicate.
        """
        ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    def wait(self, cond: threading.Condition, deadline: float | None) -> None:
        if deadline is None:
            cond.wait()
        else:
            cond.wait(max(0.0, deadline - time.monotonic()))


class FakeClock:
    """A clock that moves only when a test calls ``advance``.

    Threads waiting through ``wait`` are woken on every advance, so a lease thread
    driven by a fake clock reacts to simulated time exactly as to real time.
    """

    def __init__(self, start: float = 1_000_000.0, wall_offset: float = 1_700_000_000.0) -> None:
        self._now = start
        self._wall_offset = wall_offset
        self._lock = threading.Lock()  # guards _now and _waiters
        self._waiters: list[threading.Condition] = []

    def monotonic(self) -> float:
        with self._lock:
            return self._now

    def time(self) -> float:
        with self._lock:
            return self._now + self._wall_offset

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds
            waiters = list(self._waiters)
        for cond in waiters:
            with cond:
                cond.notify_all()

    def wait(self, cond: threading.Condition, deadline: float | None) -> None:
        # Registering and reading the time in one step means an advance either
        # sees this waiter or happened before the check: no wake-up is lost.
        with self._lock:
            self._waiters.append(cond)
            expired = deadline is not None and self._now >= deadline
        try:
            if not expired:
                cond.wait()
        finally:
            with self._lock:
                self._waiters.remove(cond)
