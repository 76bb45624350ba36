"""``coroutines.Helpers``: the threads that run a coroutine handler's blocking steps."""

from __future__ import annotations

import concurrent.futures
import threading

import pytest

from sqsworker.clock import SystemClock
from sqsworker.coroutines import Helpers


def test_a_call_waiting_behind_a_blocked_one_gets_a_thread_of_its_own_up_to_the_size() -> None:
    helpers = Helpers(SystemClock(), 2, "test-helper")
    release = threading.Event()
    started = threading.Semaphore(0)

    def blocked() -> str:
        started.release()
        release.wait(10)
        return threading.current_thread().name

    first, second = helpers.submit(blocked), helpers.submit(blocked)
    assert started.acquire(timeout=10) and started.acquire(timeout=10)  # both at once
    third = helpers.submit(lambda: threading.current_thread().name)  # waits: 2 at most
    with pytest.raises(concurrent.futures.TimeoutError):
        third.result(0.2)
    release.set()
    names = {first.result(10), second.result(10), third.result(10)}
    assert names == {"test-helper-0", "test-helper-1"}
    helpers.shutdown()


def test_an_idle_thread_is_used_again_and_errors_reach_the_caller() -> None:
    helpers = Helpers(SystemClock(), 4, "test-helper")
    names = [helpers.submit(lambda: threading.current_thread().name).result(10) for _ in range(5)]
    assert set(names) == {"test-helper-0"}  # one call at a time: one thread

    def fails() -> None:
        raise KeyError("the store's")

    with pytest.raises(KeyError, match="the store's"):
        helpers.submit(fails).result(10)
    helpers.shutdown()


def test_shutdown_cancels_what_has_not_begun_and_refuses_more() -> None:
    helpers = Helpers(SystemClock(), 1, "test-helper")
    release, began = threading.Event(), threading.Event()

    def runs() -> bool:
        began.set()
        return release.wait(10)

    running = helpers.submit(runs)
    assert began.wait(10)
    queued = helpers.submit(lambda: "never")
    helpers.shutdown(cancel_futures=True)
    assert queued.cancelled()
    with pytest.raises(RuntimeError, match="after shutdown"):
        helpers.submit(lambda: None)
    release.set()
    assert running.result(10) is True  # what had begun finishes
