"""A coroutine worker's deletes and returns on its event loop (lease_loop.py): made there,
and never held up for long by a loop a handler blocks, nor lost as the loop ends."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from sqsworker.clock import FakeClock
from sqsworker.events import Observer
from sqsworker.lease import LeaseKeeper
from sqsworker.lease_loop import CALL_MOST, START_GRACE, LoopCalls
from sqsworker.lease_machine import RETRY_AFTER_ERROR
from sqsworker.transports import BatchResult, send_all
from sqsworker.transports.memory import MemorySQS, MemoryTransport

from ..conftest import wait_until


class OnLoop(MemoryTransport):
    """The in-memory SQS with the lean client's calls for a loop: records the thread of
    every delete; its first ``hang`` deletes on the loop never answer."""

    threads: list[str]
    hang: int

    def delete_batch(self, entries: Sequence[tuple[str, str]]) -> BatchResult:
        self.threads.append(threading.current_thread().name)
        return super().delete_batch(entries)

    async def delete_batch_async(self, entries: Sequence[tuple[str, str]]) -> BatchResult:
        if self.hang > 0:
            self.hang -= 1
            await asyncio.Event().wait()  # a loop blocked mid-call, for the keeper
        return self.delete_batch(entries)

    async def change_visibility_batch_async(
        self, entries: Sequence[tuple[str, str, int]]
    ) -> BatchResult:
        return self.change_visibility_batch(entries)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def _keeper(memory: MemorySQS, clock: FakeClock, hang: int = 0) -> tuple[LeaseKeeper, OnLoop]:
    memory.create_queue("jobs")
    queue = memory.transport("jobs")
    send_all(queue, [f"m{i}" for i in range(10)])
    transport = OnLoop(memory, queue.info)
    transport.threads, transport.hang = [], hang
    keeper = LeaseKeeper(transport, clock, Observer(), delete_interval=0)
    keeper.start()
    return keeper, transport


def _succeed_all(keeper: LeaseKeeper, transport: OnLoop, clock: FakeClock) -> None:
    for held in keeper.add(transport.receive(10, 0, 60), clock.monotonic(), 60):
        assert keeper.begin(held)
        keeper.succeed(held, urgent=True)


def _handed_to(calls: LoopCalls, keeper: LeaseKeeper, transport: OnLoop, clock: FakeClock) -> None:
    _succeed_all(keeper, transport, clock)
    wait_until(lambda: bool(calls.waiting), what="the delete handed to the loop")


def _made_by_a_sender(keeper: LeaseKeeper, transport: OnLoop) -> None:
    wait_until(lambda: keeper.held_count() == 0, what="the ten deleted")
    assert [name.rsplit("-", 1)[0] for name in transport.threads] == ["sqsworker-lease-sender"]


def _running(loop: asyncio.AbstractEventLoop) -> threading.Thread:
    thread = threading.Thread(target=loop.run_forever, name="event-loop", daemon=True)
    thread.start()
    return thread


def _stop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def test_deletes_are_made_on_the_loop(
    memory: MemorySQS, clock: FakeClock, loop: asyncio.AbstractEventLoop
) -> None:
    keeper, transport = _keeper(memory, clock)
    calls = keeper.on_loop(loop)
    thread = _running(loop)
    _succeed_all(keeper, transport, clock)
    wait_until(lambda: keeper.held_count() == 0, what="the ten deleted")
    assert transport.threads == ["event-loop"]  # one batch, on the loop: no sender's
    _stop(loop, thread)
    calls.detach(loop)
    assert keeper.stop(5) == 0


def test_a_loop_that_does_not_begin_a_call_loses_it_to_a_sender_thread(
    memory: MemorySQS, clock: FakeClock, loop: asyncio.AbstractEventLoop
) -> None:
    # the loop never runs (a handler blocks it): within START_GRACE a sender makes the call
    keeper, transport = _keeper(memory, clock)
    calls = keeper.on_loop(loop)
    _handed_to(calls, keeper, transport, clock)
    clock.advance(START_GRACE - 0.01)
    assert keeper.held_count() == 10 and calls.waiting  # not yet: the loop may begin it
    clock.advance(0.01)
    _made_by_a_sender(keeper, transport)
    assert keeper.stop(5) == 0


def test_a_call_the_loop_holds_up_past_the_client_s_timeouts_is_made_again_on_a_thread(
    memory: MemorySQS, clock: FakeClock, loop: asyncio.AbstractEventLoop
) -> None:
    keeper, transport = _keeper(memory, clock, hang=1)
    calls = keeper.on_loop(loop)
    thread = _running(loop)
    _succeed_all(keeper, transport, clock)
    wait_until(lambda: bool(calls.started), what="the delete under way on the loop")
    clock.advance(CALL_MOST - 0.01)
    assert keeper.held_count() == 10  # its answer may still come
    clock.advance(0.01)
    wait_until(lambda: not calls.started, what="the call given up")
    _stop(loop, thread)  # the loop no longer begins what it is handed, as if blocked
    clock.advance(RETRY_AFTER_ERROR)  # the retry goes to the loop, then to a thread
    wait_until(lambda: bool(calls.waiting), what="the retry handed to the loop")
    clock.advance(START_GRACE)
    _made_by_a_sender(keeper, transport)
    # As the loop ends, the coroutine given up is cancelled: it ends nothing twice.
    calls.detach(loop)
    assert keeper.stop(5) == 0


def test_as_the_loop_ends_what_it_has_not_begun_goes_to_the_senders(
    memory: MemorySQS, clock: FakeClock, loop: asyncio.AbstractEventLoop
) -> None:
    keeper, transport = _keeper(memory, clock)
    calls = keeper.on_loop(loop)
    _handed_to(calls, keeper, transport, clock)
    calls.detach(loop)  # on the loop's thread as it ends (here: it never ran)
    _made_by_a_sender(keeper, transport)
    _succeed_all(keeper, transport, clock)  # none left: nothing more is handed to it
    assert not calls.waiting
    assert keeper.stop(5) == 0


def test_as_the_loop_ends_a_call_under_way_is_waited_out(
    memory: MemorySQS, clock: FakeClock, loop: asyncio.AbstractEventLoop
) -> None:
    keeper, transport = _keeper(memory, clock)
    calls = keeper.on_loop(loop)
    answer = threading.Event()
    inner = transport.delete_batch_async

    async def slow(entries: Sequence[tuple[str, str]]) -> Any:
        while not answer.is_set():
            await asyncio.sleep(0.005)
        return await inner(entries)

    transport.delete_batch_async = slow  # type: ignore[method-assign]
    _succeed_all(keeper, transport, clock)
    wait_until(lambda: bool(calls.waiting), what="the delete handed to the loop")
    loop.run_until_complete(asyncio.sleep(0.02))  # it begins, then the loop stops
    assert calls.started
    threading.Timer(0.05, answer.set).start()
    calls.detach(loop)  # runs the loop until the call ends
    assert keeper.held_count() == 0
    assert transport.threads == ["MainThread"]  # the loop's thread here
    assert keeper.stop(5) == 0
