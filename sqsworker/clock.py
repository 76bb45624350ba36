"""Time, and the threads that wait on it, injected.

Lease timing, visibility expiry and backoff read the time from a ``Clock`` so
that tests advance a ``FakeClock`` instead of sleeping. Every thread the worker
starts comes from ``Clock.spawn`` and every wait goes through ``Clock.wait``:
the fault simulator's clock (``tests/sim``) uses both to run the worker's threads
one at a time, in an order drawn from a seed, and gives coroutine handlers an
event loop (``Clock.event_loop``) that keeps its time.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Protocol


class Task(Protocol):
    """A thread started by ``Clock.spawn``."""

    name: str

    def is_alive(self) -> bool: ...


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

    def spawn(self, name: str, target: Callable[[], object]) -> Task:
        """Start ``target`` on a daemon thread named ``name``."""
        ...

    def event_loop(self) -> tuple[asyncio.AbstractEventLoop, Clock]:
        """A new event loop for coroutine handlers, and the clock it keeps time by: its
        timers, and the waits of the watchdog beside it."""
        ...


def spawn_thread(name: str, target: Callable[[], object]) -> threading.Thread:
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    return thread


class SystemClock:
    # The C functions themselves: the worker reads the clock about ten times a message,
    # and a method around each was a Python call every time.
    monotonic = staticmethod(time.monotonic)
    time = staticmethod(time.time)

    def wait(self, cond: threading.Condition, deadline: float | None) -> None:
        if deadline is None:
            cond.wait()
        else:
            cond.wait(max(0.0, deadline - time.monotonic()))

    def spawn(self, name: str, target: Callable[[], object]) -> Task:
        return spawn_thread(name, target)

    def event_loop(self) -> tuple[asyncio.AbstractEventLoop, Clock]:
        return asyncio.new_event_loop(), self


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

    def spawn(self, name: str, target: Callable[[], object]) -> Task:
        return spawn_thread(name, target)

    def event_loop(self) -> tuple[asyncio.AbstractEventLoop, Clock]:
        """An event loop on real time: a test's coroutines wait real seconds, and only
        the worker's own waits follow this clock."""
        return asyncio.new_event_loop(), SystemClock()
