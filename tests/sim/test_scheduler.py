"""The simulator's clock: a notification wakes the threads real threading would."""

from __future__ import annotations

import threading

import pytest

from .scheduler import SimClock


@pytest.mark.parametrize("seed", range(20))
def test_a_notify_from_a_thread_back_from_its_wait_wakes_the_one_still_waiting(seed: int) -> None:
    """The notifying thread is not waiting: its own last wait on the condition (ended by
    its deadline) must not take the notification from the thread that waits on."""
    clock = SimClock(seed)
    clock.install()
    cond = threading.Condition()
    notified: list[str] = []
    woke: list[str] = []

    def timed() -> None:
        with cond:
            clock.wait(cond, clock.monotonic() + 1)  # waits first: the longest waiter
            notified.append("timed")
            cond.notify()

    def untimed() -> None:
        with cond:
            while not notified:  # a wait may return early
                clock.wait(cond, None)
            woke.append("untimed")

    try:
        clock.spawn("timed", timed)
        clock.settle()  # it waits before the other starts: the longest waiter on cond
        clock.spawn("untimed", untimed)
        clock.settle()
        clock.advance_to(clock.monotonic() + 1)
        clock.settle()  # "timed" runs (its deadline came) and notifies
        assert woke == ["untimed"]
    finally:
        clock.uninstall()
        clock.teardown()
