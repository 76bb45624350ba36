"""A coroutine worker's deletes and returns on its event loop (lease_loop.py): made there,
never held up for long by a loop a handler blocks, never given up on a loop that runs,
nor lost as the loop ends. (Several cases come from a review of 88451cd.)"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from sqsworker.clock import FakeClock, SystemClock
from sqsworker.events import Observer
from sqsworker.lease import LeaseKeeper
from sqsworker.lease_loop import CALL_MOST, GIVE_UP, LOOK, LoopCalls
from sqsworker.lease_machine import RETRY_AFTER_ERROR
from sqsworker.lease_state import IllegalTransition
from sqsworker.transports import BatchResult, send_all
from sqsworker.transports.memory import MemorySQS, MemoryTransport

from ..conftest import wait_until


class OnLoop(MemoryTransport):
    """The in-memory SQS with the lean client's calls for a loop: records the thread of
    every delete; its first ``hang`` deletes on the loop answer once ``release`` is set."""

    threads: list[str]
    hang: int
    release: threading.Event

    def delete_batch(self, entries: Sequence[tuple[str, str]]) -> BatchResult:
        self.threads.append(threading.current_thread().name)
        return super().delete_batch(entries)

    async def delete_batch_async(self, entries: Sequence[tuple[str, str]]) -> BatchResult:
        if self.hang > 0:
            self.hang -= 1
            while not self.release.is_set():  # a slow SQS, or a loop blocked mid-call
                await asyncio.sleep(0.005)
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


class Blocked:
    """The loop's heartbeat, as the test sets it: seconds late (0: it runs freely)."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self) -> float:
        return self.seconds


class Reports(Observer):
    def __init__(self) -> None:
        self.seen: list[str] = []

    def delete_failed(self, message: Any, reason: str, retrying: bool) -> None:
        self.seen.append("delete failed")

    def lease_lost(self, message: Any, reason: str) -> None:
        self.seen.append("lease lost")


def _keeper(
    memory: MemorySQS, clock: Any, hang: int = 0, delete_interval: float = 0
) -> tuple[LeaseKeeper, OnLoop]:
    memory.create_queue("jobs")
    queue = memory.transport("jobs")
    send_all(queue, [f"m{i}" for i in range(20)])
    transport = OnLoop(memory, queue.info)
    transport.threads, transport.hang, transport.release = [], hang, threading.Event()
    keeper = LeaseKeeper(transport, clock, Reports(), delete_interval=delete_interval)
    keeper.start()
    return keeper, transport


def _succeed_all(keeper: LeaseKeeper, transport: OnLoop, clock: Any, lease: int = 60) -> None:
    for held in keeper.add(transport.receive(10, 0, lease), clock.monotonic(), lease):
        assert keeper.begin(held)
        keeper.succeed(held, urgent=True)


def _handed_to(calls: LoopCalls, keeper: LeaseKeeper, transport: OnLoop, clock: Any) -> None:
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


def _under_way(
    memory: MemorySQS, clock: FakeClock, loop: Any, blocked: Blocked, lease: int
) -> tuple[LeaseKeeper, OnLoop, LoopCalls, threading.Thread]:
    """A batch's delete under way on a running loop, never answered until ``release``."""
    keeper, transport = _keeper(memory, clock, hang=1)
    calls = keeper.on_loop(loop, blocked)
    thread = _running(loop)
    _succeed_all(keeper, transport, clock, lease=lease)
    wait_until(lambda: bool(calls.started), what="the delete under way on the loop")
    return keeper, transport, calls, thread


def _end(
    keeper: LeaseKeeper, calls: LoopCalls, loop: asyncio.AbstractEventLoop, thread: Any
) -> None:
    """The loop ends as a worker's does (stopped, then detached), and so does the keeper,
    nothing left unsent."""
    _stop(loop, thread)
    calls.detach(loop)
    assert keeper.stop(5) == 0


def test_deletes_are_made_on_the_loop(
    memory: MemorySQS, clock: FakeClock, loop: asyncio.AbstractEventLoop
) -> None:
    keeper, transport = _keeper(memory, clock)
    calls = keeper.on_loop(loop, Blocked())
    thread = _running(loop)
    _succeed_all(keeper, transport, clock)
    wait_until(lambda: keeper.held_count() == 0, what="the ten deleted")
    assert transport.threads == ["event-loop"]  # one batch, on the loop: no sender's
    _end(keeper, calls, loop, thread)


def test_a_blocked_loop_s_calls_not_begun_go_to_a_sender_thread(
    memory: MemorySQS, clock: FakeClock, loop: asyncio.AbstractEventLoop
) -> None:
    # the loop never runs: while its heartbeat says it runs, the call waits for it; once
    # the heartbeat is late, the lease thread's next look hands it to a sender
    keeper, transport = _keeper(memory, clock)
    blocked = Blocked()
    calls = keeper.on_loop(loop, blocked)
    _handed_to(calls, keeper, transport, clock)
    clock.advance(10 * LOOK)
    assert keeper.held_count() == 10 and calls.waiting  # a loop that runs begins it
    blocked.seconds = 0.5
    clock.advance(LOOK)
    _made_by_a_sender(keeper, transport)
    _succeed_all(keeper, transport, clock)  # while it is blocked: to the senders at once
    wait_until(lambda: keeper.held_count() == 0, what="ten more deleted")
    assert not calls.waiting and len(transport.threads) == 2
    assert keeper.stop(5) == 0


def test_a_call_given_a_coroutine_that_a_blocking_handler_keeps_from_its_first_step(
    memory: MemorySQS, clock: FakeClock, loop: asyncio.AbstractEventLoop
) -> None:
    # the coroutine is made, and a handler blocks the loop before it steps: the call has
    # not gone out, so it is taken back as not begun (its leases not left to lapse), and
    # the coroutine, once the loop is free, makes nothing
    keeper, transport = _keeper(memory, clock)
    blocked = Blocked()
    calls = keeper.on_loop(loop, blocked)
    _handed_to(calls, keeper, transport, clock)
    free = threading.Event()
    loop.call_soon_threadsafe(free.wait)  # after the loop's start of the call
    thread = _running(loop)
    wait_until(lambda: bool(calls.assigned), what="the call given its coroutine")
    blocked.seconds = 0.5
    clock.advance(LOOK)
    _made_by_a_sender(keeper, transport)
    assert keeper.machine.check() == []
    free.set()
    wait_until(lambda: not calls._tasks, what="the coroutine to end")
    assert len(transport.threads) == 1  # made once, by the sender
    _end(keeper, calls, loop, thread)


def test_a_slow_call_on_a_loop_that_runs_is_never_given_up(
    memory: MemorySQS, clock: FakeClock, loop: asyncio.AbstractEventLoop
) -> None:
    # the SQS client's own timeouts bound it (four tries may take 140 s): giving it up
    # would make the same deletes twice at once, as SQS struggles
    keeper, transport, calls, thread = _under_way(memory, clock, loop, Blocked(), 600)
    clock.advance(2 * CALL_MOST)
    assert calls.started and keeper.held_count() == 10 and transport.threads == []
    transport.release.set()  # SQS answers at last
    wait_until(lambda: keeper.held_count() == 0, what="the ten deleted")
    assert transport.threads == ["event-loop"]  # once, on the loop
    _end(keeper, calls, loop, thread)


def test_a_call_a_blocked_loop_holds_up_is_made_again_on_a_thread(
    memory: MemorySQS, clock: FakeClock, loop: asyncio.AbstractEventLoop
) -> None:
    blocked = Blocked()
    keeper, transport, calls, thread = _under_way(memory, clock, loop, blocked, 60)
    blocked.seconds = GIVE_UP - 0.1
    clock.advance(LOOK)
    assert calls.started  # its answer may yet be read
    blocked.seconds = GIVE_UP
    clock.advance(LOOK)
    wait_until(lambda: not calls.started, what="the call given up")
    clock.advance(RETRY_AFTER_ERROR)  # the loop still blocked: the retry goes to a sender
    _made_by_a_sender(keeper, transport)
    _stop(loop, thread)
    calls.detach(loop)  # the coroutine given up is cancelled: it ends nothing twice
    assert keeper.stop(5) == 0


def test_a_call_handed_out_by_a_handler_s_coroutine_is_looked_at_while_the_loop_blocks(
    memory: MemorySQS, loop: asyncio.AbstractEventLoop
) -> None:
    # a batch filled on the loop is handed out there, the lease thread not woken: it
    # looks every LOOK seconds all the same, not only by the deletes' interval (10 s)
    clock = SystemClock()
    memory = MemorySQS(clock)
    keeper, transport = _keeper(memory, clock, delete_interval=10)
    blocked = Blocked()
    calls = keeper.on_loop(loop, blocked)
    thread = _running(loop)
    held = keeper.add(transport.receive(10, 0, 600), clock.monotonic(), 600)
    for h in held:
        assert keeper.begin(h)
    free = threading.Event()

    def handlers_finish_then_one_blocks() -> None:
        calls._thread = threading.get_ident()  # the loop's, as once it began a call
        for h in held:
            keeper.succeed(h)  # the tenth fills the batch: handed out on the loop
        blocked.seconds = 0.5
        free.wait()

    loop.call_soon_threadsafe(handlers_finish_then_one_blocks)
    started = clock.monotonic()
    _made_by_a_sender(keeper, transport)
    assert clock.monotonic() - started < 5  # by a look, not by the interval
    free.set()
    _end(keeper, calls, loop, thread)


def test_a_defect_while_an_answer_on_the_loop_is_fed_back_still_ends_the_call(
    memory: MemorySQS, clock: FakeClock, loop: asyncio.AbstractEventLoop
) -> None:
    keeper, transport = _keeper(memory, clock)
    calls = keeper.on_loop(loop, Blocked())
    settled = keeper.machine.settled

    def defect(*args: Any) -> None:
        keeper.machine.settled = settled  # type: ignore[method-assign]
        raise IllegalTransition("a defect, once")

    keeper.machine.settled = defect  # type: ignore[method-assign]
    _handed_to(calls, keeper, transport, clock)
    loop.run_until_complete(asyncio.sleep(0.01))
    assert keeper.machine.under_way == 0  # ended: the stop below does not wait for it
    calls.detach(loop)
    assert keeper.stop(5) == 0  # returns (it waited for the call for ever before)


def test_a_call_given_up_after_the_stop_gave_up_is_reported(
    memory: MemorySQS, clock: FakeClock, loop: asyncio.AbstractEventLoop
) -> None:
    blocked = Blocked()
    keeper, _, calls, thread = _under_way(memory, clock, loop, blocked, 30)
    stopped: list[int] = []
    stopping = threading.Thread(target=lambda: stopped.append(keeper.stop(5)))
    stopping.start()
    clock.advance(5)  # the stop gives up: the answer under way, then the end
    blocked.seconds = GIVE_UP
    clock.advance(45)  # past the leases: given up, their deletes lost with them
    stopping.join(5)
    assert stopped == [0]  # none left to send: their leases ran out
    reports: Any = keeper.observer
    assert "lease lost" in reports.seen or "delete failed" in reports.seen
    assert keeper.machine.out == []  # every report carried out
    _stop(loop, thread)
    calls.detach(loop)


def test_once_the_loop_ends_its_calls_are_bounded_by_the_client_s_not_its_heartbeat(
    memory: MemorySQS, clock: FakeClock, loop: asyncio.AbstractEventLoop
) -> None:
    # the worker's shutdown detaches the loop before closing it; past its close the
    # heartbeat stops (it reads 0) while a handler that ignores its cancellation may still
    # block the loop: a call it began is given up past the client's bounds, no later
    keeper, transport, calls, thread = _under_way(memory, clock, loop, Blocked(), 600)
    keeper.off_loop()  # the shutdown's step 5
    _succeed_all(keeper, transport, clock, lease=600)  # to the senders now
    wait_until(lambda: keeper.held_count() == 10, what="the ten later ones deleted")
    assert [name.rsplit("-", 1)[0] for name in transport.threads] == ["sqsworker-lease-sender"]
    stopped: list[int] = []
    stopping = threading.Thread(target=lambda: stopped.append(keeper.stop(2)))
    stopping.start()
    clock.advance(CALL_MOST - 1)
    assert calls.started and not stopped  # the client may still answer it
    clock.advance(1)
    stopping.join(5)
    assert stopped == [10] and not calls.started  # given up, its deletes left unsent
    _stop(loop, thread)
    calls.detach(loop)


def test_as_the_loop_ends_what_it_has_not_begun_goes_to_the_senders(
    memory: MemorySQS, clock: FakeClock, loop: asyncio.AbstractEventLoop
) -> None:
    keeper, transport = _keeper(memory, clock)
    calls = keeper.on_loop(loop, Blocked())
    _handed_to(calls, keeper, transport, clock)
    calls.detach(loop)  # on the loop's thread as it ends (here: it never ran)
    _made_by_a_sender(keeper, transport)
    _succeed_all(keeper, transport, clock)  # nothing more is handed to it
    wait_until(lambda: keeper.held_count() == 0, what="ten more deleted")
    assert not calls.waiting
    assert keeper.stop(5) == 0


def test_as_the_loop_ends_a_call_under_way_is_waited_out(
    memory: MemorySQS, clock: FakeClock, loop: asyncio.AbstractEventLoop
) -> None:
    keeper, transport = _keeper(memory, clock)
    calls = keeper.on_loop(loop, Blocked())
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
