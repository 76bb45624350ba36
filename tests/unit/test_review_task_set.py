"""The review of b2133a6, which moved a task's exit from EventLoopRunner._tasks out of
its done callback into _guarded's finally: two ways a task then stayed in the set for
good (b2133a6 was undone). Each test holds that every task leaves the set as it ends."""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
import weakref
from typing import Any

import pytest

from sqsworker.clock import SystemClock
from sqsworker.coroutines import EventLoopRunner
from sqsworker.events import Observer

from ..conftest import wait_until


def test_a_task_cancelled_before_its_first_step_at_close_leaves_the_set() -> None:
    """close() races a batch the dispatcher hands the loop: the loop (blocked by a
    handler for a moment) gets close()'s _cancel_all, then the dispatcher's _begin. The
    new task is cancelled before its first step, so _guarded's body, its finally
    included, never runs: only the done callback takes the task (and its message) out."""
    gate, second = threading.Event(), threading.Event()
    late = [Body()]  # a message (a Held keeps its body, up to 1 MiB)
    kept = weakref.ref(late[0])
    calls: list[str] = []
    entered = threading.Event()

    def next_messages(limit: int) -> list[Any]:
        calls.append("next")
        if len(calls) == 1:
            return ["blocker"]
        if len(calls) == 2:
            second.wait(10)
            return [late.pop()]
        runner._closed.wait(10)
        return []

    async def run_one(message: Any) -> None:
        if message == "blocker":
            entered.set()
            gate.wait(10)  # blocks the loop thread, as a synchronous call in a handler does

    runner = EventLoopRunner(2, SystemClock(), next_messages, run_one, Observer(), lambda b: None)
    runner.start()
    loop = runner._loop
    wait_until(entered.is_set, what="the loop blocked by the first handler")
    wait_until(lambda: len(calls) == 2, what="the dispatcher waiting for its second batch")
    closer = threading.Thread(target=runner.close, args=(10.0,))
    closer.start()
    # close() queued its _cancel_all on the blocked loop; then the dispatcher's batch comes.
    wait_until(lambda: len(loop._ready) >= 1, what="close()'s _cancel_all queued")  # type: ignore[attr-defined]
    second.set()
    wait_until(lambda: len(loop._ready) >= 2, what="the dispatcher's _begin queued")  # type: ignore[attr-defined]
    gate.set()
    closer.join(15)
    assert not closer.is_alive()
    wait_until(lambda: not runner._looping, what="the loop thread to end")
    assert all(t.done() and t.cancelled() for t in runner._tasks)
    left = len(runner._tasks)
    gc.collect()
    # The task's CancelledError keeps _guarded's frame, and so its message, alive.
    assert (left, kept() is None) == (0, True), f"{left} ended task(s) kept after close"


class Body:
    """A message, weakly referable."""


@pytest.mark.skipif(sys.version_info < (3, 12), reason="asyncio.eager_task_factory: 3.12+")
def test_with_eager_tasks_a_task_that_ends_at_once_leaves_the_set() -> None:
    """A handler may set the eager task factory on its running loop (the worker's), as
    Python 3.12's docs suggest for speed. Then create_task runs _guarded to its first
    suspension inside _begin: a coroutine that ends without suspending ends before _begin
    adds its task. A discard in its finally came too early; the done callback, scheduled
    once the task is added, does not."""
    batches: list[list[Any]] = [[f"m{i}" for i in range(100)]]
    done: list[Any] = []
    closed = threading.Event()

    def next_messages(limit: int) -> list[Any]:
        eager.wait(10)  # the factory set before the first batch
        if batches:
            return batches.pop()
        closed.wait(10)
        return []

    async def run_one(message: Any) -> None:
        done.append(message)  # ends without suspending, as a no-op handler's step may

    eager = threading.Event()
    runner = EventLoopRunner(200, SystemClock(), next_messages, run_one, Observer(), lambda b: None)
    runner.start()
    loop = runner._loop
    loop.call_soon_threadsafe(
        lambda: (loop.set_task_factory(asyncio.eager_task_factory), eager.set())  # type: ignore[attr-defined]
    )
    try:
        wait_until(lambda: len(done) == 100 and runner._running == 0, what="100 handled")
        assert len(runner._tasks) == 0, f"{len(runner._tasks)} ended tasks kept in _tasks"
    finally:
        closed.set()
        runner.close()
