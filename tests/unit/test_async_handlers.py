"""``async def`` handlers: coroutines on the worker's event loop, ``concurrency`` of them.

Each test drives the worker on the in-memory SQS with a fake clock for the lease, while
the coroutines run on the loop's real time; each waits on state (an event, a count).
"""

from __future__ import annotations

import asyncio
import io
import json
import math
import threading
from collections.abc import Callable
from typing import Any

import pytest
import structlog

from sqsworker import Message, Reject, Retry
from sqsworker.clock import FakeClock, SystemClock, Task
from sqsworker.coroutines import EventLoopRunner
from sqsworker.errors import TransportError
from sqsworker.events import Observer
from sqsworker.logs import LogObserver
from sqsworker.metrics import Metrics
from sqsworker.running import Coroutines
from sqsworker.stores import State
from sqsworker.stores.memory import MemoryStore
from sqsworker.transports import OutgoingMessage, send_all
from sqsworker.transports.memory import MemorySQS

from ..conftest import wait_until
from ..snippets import snippet
from .conftest import sample
from .helpers import Rig
from .test_idempotency import keyed


class Crowd:
    """An async handler that holds every message until ``release`` is set, counting how
    many it holds at once and on which threads it ran."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0
        self.bodies: list[str] = []
        self.threads: set[str] = set()
        self.release = threading.Event()

    async def __call__(self, message: Message) -> None:
        self.threads.add(threading.current_thread().name)
        self.now += 1
        self.peak = max(self.peak, self.now)
        while not self.release.is_set():
            await asyncio.sleep(0.005)
        self.now -= 1
        self.bodies.append(message.body)


def test_an_async_handler_is_awaited_and_its_message_deleted_only_after_it_ran(
    memory: MemorySQS, clock: FakeClock
) -> None:
    done: list[str] = []

    async def handler(message: Message) -> None:
        await asyncio.sleep(0.01)
        done.append(message.body)

    rig = Rig(memory, clock, handler)
    rig.send("a", "b", "c")
    rig.worker.start()
    rig.wait_for("deleted", 3)
    assert sorted(done) == ["a", "b", "c"]  # the coroutine ran to its end, not only made
    runner = rig.worker.runner
    assert isinstance(runner, Coroutines)
    wait_until(lambda: not runner.loop._tasks, what="no task kept once its message is done")
    assert rig.stop() == 0
    assert rig.queue.counts().total == 0


def test_concurrency_counts_coroutines_on_one_loop_thread_not_threads(
    memory: MemorySQS, clock: FakeClock
) -> None:
    crowd = Crowd()
    rig = Rig(memory, clock, crowd, concurrency=200, prefetch=50)
    rig.send(*[f"m{i}" for i in range(300)])
    before = set(threading.enumerate())  # an earlier test's threads may live on
    rig.worker.start()
    wait_until(lambda: crowd.now == 200, what="200 coroutines under way")
    assert crowd.threads == {"sqsworker-event-loop"}
    # 200 handlers in flight cost no handler threads: the receive and lease threads (52
    # here: 25 receive threads, the lease thread and its 26 senders), the loop, its
    # dispatcher and watchdog.
    started = [t.name for t in threading.enumerate() if t not in before]
    assert not [n for n in started if n.startswith("sqsworker-handler")]
    assert len(started) < 60
    assert rig.worker.in_hand == 250  # 200 running, the prefetch waiting: no more
    crowd.release.set()
    rig.wait_for("deleted", 300)
    assert crowd.peak == 200 and sorted(crowd.bodies) == sorted(f"m{i}" for i in range(300))
    assert rig.stop() == 0


def test_a_thousand_coroutines_keep_32_delete_calls_under_way_while_sqs_is_slow(
    memory: MemorySQS, clock: FakeClock
) -> None:
    """At 1,000 coroutines of 100 ms and 20 ms a request, deletes need about 20 calls
    under way at once. With 16 senders at most, the deletes queued behind them took the
    room of the receives: held messages through their handler, not yet deleted, averaged
    533, and the worker moved 0.63 of its ideal (bench/README.md, "The lease's senders")."""

    async def handler(message: Message) -> None:
        pass

    rig = Rig(memory, clock, handler, concurrency=1000, prefetch=0)
    transport = rig.worker._transport
    assert transport is not None
    delete_batch, release = transport.delete_batch, threading.Event()
    inside: list[int] = []  # delete calls under way

    def slow_delete(entries: Any) -> Any:
        inside.append(1)
        release.wait(15)
        try:
            return delete_batch(entries)
        finally:
            inside.pop()

    transport.delete_batch = slow_delete  # type: ignore[method-assign]
    rig.send(*[f"m{i}" for i in range(400)])
    rig.worker.start()
    wait_until(lambda: len(inside) == 32, what="32 delete calls under way")
    wait_until(lambda: rig.count("succeeded") == 400, what="every handler through")
    assert len(inside) == 32  # and no more: the rest wait for a sender
    release.set()
    rig.wait_for("deleted", 400)
    assert rig.stop() == 0
    assert rig.queue.counts().total == 0


def test_failures_take_the_same_paths_as_for_thread_handlers(
    memory: MemorySQS, clock: FakeClock
) -> None:
    async def handler(message: Message) -> None:
        await asyncio.sleep(0)
        if message.body == "retry":
            raise Retry(30, "later")
        if message.body == "reject":
            raise Reject("malformed")
        if message.body == "fail":
            raise ValueError("boom")

    rig = Rig(memory, clock, handler)
    rig.send("ok", "retry", "reject", "fail")
    rig.worker.start()
    rig.wait_for("succeeded", 1)
    rig.wait_for("retry_requested", 1)
    rig.wait_for("rejected", 1)
    rig.wait_for("failed", 1)
    rig.wait_for("deleted", 2)  # the success, and the rejected one once copied
    assert rig.dlq is not None
    wait_until(lambda: rig.dlq is not None and rig.dlq.counts().visible == 1)
    (copy,) = rig.dlq.receive(1, 0, 30)
    assert copy.body == "reject"
    assert rig.stop() == 0
    assert rig.queue.counts().total == 2  # the retried and the failed one, delayed


def test_a_plain_def_returning_a_coroutine_fails_its_message_instead_of_deleting_it(
    memory: MemorySQS, clock: FakeClock
) -> None:
    async def work(message: Message) -> None:
        raise AssertionError("never awaited")

    failures: list[BaseException] = []

    class Errors(Observer):
        def handler_failed(self, message: Message, error: BaseException, *args: Any) -> None:
            failures.append(error)

    rig = Rig(memory, clock, lambda message: work(message), observers=[Errors()])
    rig.send("x")
    rig.worker.start()
    rig.wait_for("failed", 1)
    assert rig.count("deleted") == 0
    assert "<lambda> returned coroutine without running it: declare the handler async def and " in (
        str(failures[0])
    )
    assert rig.stop() == 0


def test_fifo_groups_keep_their_order_with_coroutines(memory: MemorySQS, clock: FakeClock) -> None:
    order: list[tuple[str, int]] = []

    async def handler(message: Message) -> None:
        group, n = message.body.split(":")
        await asyncio.sleep(0.001 * (5 - int(n) % 5))  # later ones would finish first
        order.append((group, int(n)))

    # Leases longer than the fake clock's whole run: a loop held up by a loaded machine
    # while the clock moves on must not see a lease lapse (a lapsed one runs again).
    rig = Rig(
        memory,
        clock,
        handler,
        queue="jobs.fifo",
        dead_letter=False,
        concurrency=20,
        visibility_timeout=600,
    )
    send_all(
        rig.queue,
        [
            OutgoingMessage(f"{g}:{n}", group_id=g, deduplication_id=f"{g}{n}")
            for n in range(10)
            for g in "abc"
        ],
    )
    rig.worker.start()
    rig.advance_until(lambda: rig.count("deleted") == 30)  # past each empty receive's pause
    for group in "abc":
        assert [n for g, n in order if g == group] == list(range(10))
    assert rig.stop() == 0


def test_idempotency_drops_duplicates_and_keeps_store_calls_off_the_loop(
    memory: MemorySQS, clock: FakeClock
) -> None:
    calls: list[str] = []

    class Watched(MemoryStore):
        def claim(self, *args: Any, **kwargs: Any) -> Any:
            calls.append(threading.current_thread().name)
            return super().claim(*args, **kwargs)

        def complete(self, *args: Any, **kwargs: Any) -> bool:
            calls.append(threading.current_thread().name)
            return super().complete(*args, **kwargs)

    runs: list[str] = []

    async def handler(message: Message) -> None:
        runs.append(message.body)

    rig = Rig(memory, clock, handler, store=Watched(), concurrency=4)
    send_all(rig.queue, [keyed("order 1", "o-1"), keyed("order 1", "o-1"), keyed("order 2", "o-2")])
    rig.worker.start()
    rig.advance_until(lambda: rig.count("deleted") == 3)  # a duplicate deferred comes back
    assert sorted(runs) == ["order 1", "order 2"]
    assert rig.count("duplicates_suppressed") == 1
    assert calls and all(name.startswith("sqsworker-async-helper") for name in calls)
    assert rig.stop() == 0


def test_each_coroutine_logs_with_its_own_messages_fields(
    memory: MemorySQS, clock: FakeClock
) -> None:
    seen: dict[str, str] = {}
    both = asyncio.Event  # made on the loop below, once it runs
    gate: list[asyncio.Event] = []

    async def handler(message: Message) -> None:
        if not gate:
            gate.append(both())
        await asyncio.sleep(0)  # the other coroutine binds its fields meanwhile
        if len(seen) == 1:
            gate[0].set()
        seen[message.body] = structlog.contextvars.get_contextvars()["message_id"]
        await asyncio.wait_for(gate[0].wait(), 10)

    rig = Rig(memory, clock, handler, concurrency=2)
    rig.send("a", "b")
    rig.worker.start()
    rig.wait_for("deleted", 2)
    assert seen["a"] != seen["b"]
    assert rig.stop() == 0


class Stalls(Observer):
    def __init__(self) -> None:
        self.blocked: list[tuple[float, str]] = []
        self.unblocked: list[float] = []

    def loop_blocked(self, seconds: float, where: str) -> None:
        self.blocked.append((seconds, where))

    def loop_unblocked(self, seconds: float) -> None:
        self.unblocked.append(seconds)


def test_a_handler_blocking_the_loop_shows_in_health_logs_and_metrics_naming_where(
    memory: MemorySQS, clock: FakeClock, json_logs: io.StringIO, metrics: Metrics
) -> None:
    stalls = Stalls()
    unblock = threading.Event()

    async def blocks_the_loop(message: Message) -> None:
        unblock.wait(30)  # a blocking call: every coroutine waits

    observers = [stalls, LogObserver("tests.handler"), metrics]
    rig = Rig(memory, clock, blocks_the_loop, observers=observers, stall_timeout=3)
    rig.send("x")
    rig.worker.start()
    try:
        wait_until(lambda: bool(stalls.blocked), what="the stall reported")
        seconds, where = stalls.blocked[0]
        assert seconds >= 0.5
        assert "blocks_the_loop" in where and "unblock.wait(30)" in where
        health = rig.worker.health()
        assert health.loop_blocked is not None and health.loop_blocked >= 0.5
        assert health.as_dict()["event_loop"].startswith("blocked for")
        assert health.live is (health.loop_blocked <= 3)  # live within --stall-timeout
        wait_until(lambda: (rig.worker.health().loop_blocked or 0) > 3, what="past it")
        assert not rig.worker.health().live
    finally:
        unblock.set()
    wait_until(lambda: bool(stalls.unblocked), what="the end of the stall reported")
    assert stalls.unblocked[0] > 3
    assert rig.worker.health().live and rig.worker.health().as_dict()["event_loop"] == "ok"
    rig.wait_for("deleted", 1)
    assert rig.stop() == 0

    # The log line and the count, as docs/handlers.md shows them.
    lines = [json.loads(line) for line in json_logs.getvalue().splitlines()]
    (blocked,) = [line for line in lines if line["event"].startswith("the event loop is blocked")]
    shown = snippet("docs/handlers.md", "the event loop is blocked").text
    assert shown.startswith(f"{blocked['event']}  blocked_for=")
    assert "unblock.wait(30)" in blocked["where"] and blocked["level"] == "warning"
    assert [line for line in lines if line["event"] == "the event loop runs again"]
    assert sample(metrics, "sqsworker_event_loop_stalls_total") == 1


def test_shutdown_lets_running_coroutines_finish_and_hands_back_the_waiting(
    memory: MemorySQS, clock: FakeClock
) -> None:
    crowd = Crowd()
    rig = Rig(memory, clock, crowd, concurrency=3, prefetch=4)
    rig.send(*[f"m{i}" for i in range(7)])
    rig.worker.start()
    wait_until(lambda: crowd.now == 3 and rig.worker.in_hand == 7)
    code = rig.begin_stop()
    rig.wait_for("handed_back", 4)
    crowd.release.set()
    assert code() == 0
    assert rig.count("deleted") == 3 and len(crowd.bodies) == 3
    assert rig.queue.counts().visible == 4 and rig.queue.counts().in_flight == 0


def test_past_the_shutdown_timeout_coroutines_are_cancelled_and_handed_back(
    memory: MemorySQS, clock: FakeClock
) -> None:
    cancelled = threading.Event()
    started = threading.Event()

    async def long_job(message: Message) -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    rig = Rig(memory, clock, long_job, shutdown_timeout=5)
    rig.send("x")
    rig.worker.start()
    assert started.wait(10)
    assert rig.stop_past_timeout() == 1
    assert cancelled.is_set()  # its finally blocks ran
    assert rig.queue.counts().visible == 1  # handed back, ready for another worker
    assert rig.count("deleted") == 0


def test_a_coroutine_sees_its_lease_lost(memory: MemorySQS, clock: FakeClock) -> None:
    seen: list[bool] = []
    started = threading.Event()
    go_on = threading.Event()

    async def handler(message: Message) -> None:
        started.set()
        while not go_on.is_set():
            await asyncio.sleep(0.005)
        seen.append(message.lease.lost)

    fault = TransportError("ServiceUnavailable", code="ServiceUnavailable", retryable=True)
    rig = Rig(memory, clock, handler, visibility_timeout=10, concurrency=1, prefetch=0)
    memory.inject_fault("ChangeMessageVisibilityBatch", fault, times=1000)  # renewals fail
    rig.send("x")
    rig.worker.start()
    assert started.wait(10)
    rig.advance_until(lambda: rig.count("leases_lost") == 1)
    go_on.set()
    wait_until(lambda: bool(seen))
    assert seen[0] is True  # message.lease.lost, read by the coroutine: it was not cancelled
    # The message, visible again once its lease was lost, may be received a second time
    # before the stop: its hand-back then fails as the renewals do, and the stop's flush
    # gives up only after its time, on the fake clock.
    rig.stop_past_timeout()


def test_an_async_handler_inside_a_traced_worker_nests_its_spans(
    memory: MemorySQS, clock: FakeClock
) -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    async def handler(message: Message) -> None:
        with provider.get_tracer("app").start_as_current_span(f"call {message.body}"):
            await asyncio.sleep(0.01)

    rig = Rig(memory, clock, handler, tracer=provider.get_tracer("sqsworker"), concurrency=4)
    rig.send("a", "b")
    rig.worker.start()
    rig.wait_for("deleted", 2)
    assert rig.stop() == 0
    finished = exporter.get_finished_spans()
    processes = {s.context.span_id for s in finished if s.name == "process jobs"}
    parents = {s.parent.span_id for s in finished if s.name.startswith("call ") and s.parent}
    assert len(processes) == 2 and parents == processes  # each under its own message's span
    provider.shutdown()


# Found by review: each reproduced on the in-memory SQS before it was fixed -----------


def test_a_message_taken_whose_coroutine_never_began_is_handed_back_at_the_timeout(
    memory: MemorySQS, clock: FakeClock
) -> None:
    unblock, blocking = threading.Event(), threading.Event()
    ran: list[str] = []

    async def handler(message: Message) -> None:
        ran.append(message.body)
        if message.body == "block":
            blocking.set()
            unblock.wait(30)  # a blocking call: the loop stalls, "b" cannot start

    rig = Rig(memory, clock, handler, concurrency=2, shutdown_timeout=5, visibility_timeout=60)
    rig.send("block")
    rig.worker.start()
    try:
        assert blocking.wait(10)
        rig.send("b")
        runner = rig.worker.runner.loop  # type: ignore[union-attr]
        assert runner is not None
        rig.advance_until(lambda: runner._running == 2)  # taken, its coroutine made, not begun
        assert rig.stop_past_timeout() == 1
        assert rig.count("handed_back") == 2  # "b" too, not left invisible until its lease ends
        assert rig.queue.counts().visible == 2
    finally:
        unblock.set()
    wait_until(lambda: not runner._looping or rig.worker.in_hand == 0, timeout=5)
    assert ran == ["block"]  # "b" never ran after the shutdown


def test_a_plain_def_returning_some_other_awaitable_succeeds_untouched(
    memory: MemorySQS, clock: FakeClock
) -> None:
    class Submitted:  # a future of work handed elsewhere, say
        closed = False

        def __await__(self) -> Any:
            yield

        def close(self) -> None:
            self.closed = True

    returned: list[Submitted] = []

    def submit(message: Message) -> Submitted:
        returned.append(Submitted())
        return returned[-1]

    rig = Rig(memory, clock, submit)
    rig.send("x")
    rig.worker.start()
    rig.wait_for("deleted", 1)
    assert rig.count("failed") == 0 and not returned[0].closed
    assert rig.stop() == 0


def test_a_task_raising_system_exit_does_not_end_the_loop(
    memory: MemorySQS, clock: FakeClock
) -> None:
    async def exits() -> None:
        raise SystemExit(0)  # a library calling sys.exit() in a task of its own

    tasks: list[asyncio.Task[None]] = []

    async def handler(message: Message) -> None:
        if message.body == "first":
            tasks.append(asyncio.get_running_loop().create_task(exits()))
            await asyncio.sleep(0.01)

    rig = Rig(memory, clock, handler, concurrency=1)
    rig.send("first")
    rig.worker.start()
    rig.wait_for("deleted", 1)
    rig.send("second", "third")
    rig.advance_until(lambda: rig.count("deleted") == 3)
    assert rig.worker.health().live and rig.worker.health().as_dict()["event_loop"] == "ok"
    assert rig.stop() == 0
    assert isinstance(tasks[0].exception(), SystemExit)  # retrieved: no warning at exit


def test_a_coroutine_that_swallows_its_cancellation_does_not_complete_its_key(
    memory: MemorySQS, clock: FakeClock
) -> None:
    store = MemoryStore()
    started = threading.Event()
    done: list[str] = []

    async def handler(message: Message) -> None:
        started.set()
        try:
            await asyncio.sleep(3600)  # the work, cut short by the shutdown's timeout
            done.append(message.body)
        except asyncio.CancelledError:
            pass  # swallowed: returns as if done

    rig = Rig(memory, clock, handler, store=store, shutdown_timeout=5)
    send_all(rig.queue, [keyed("charge order 1", "order-1")])
    rig.worker.start()
    assert started.wait(10)
    assert rig.stop_past_timeout() == 1
    assert rig.count("succeeded") == 0 and rig.queue.counts().visible == 1
    record = store.get(f"{rig.queue.info.name}/order-1")
    assert record is None or record.state is not State.COMPLETED  # released, not completed


def test_a_stop_from_close_is_not_forgotten_when_a_task_exits_in_the_same_pass() -> None:
    runner = EventLoopRunner(1, SystemClock(), lambda n: [], _nothing, Observer(), lambda b: None)
    runner.start()

    def exits() -> None:
        raise SystemExit(0)

    runner._closed.set()  # as close() does before it sends the loop its stop
    loop = runner._loop
    loop.call_soon_threadsafe(lambda: (loop.call_soon(loop.stop), loop.call_soon(exits)))
    wait_until(lambda: not runner._looping, timeout=5, what="the loop to end")
    runner.close()


async def _nothing(message: Any) -> None:
    pass


@pytest.mark.parametrize("keyed", [False, True], ids=["no store", "a store"])
def test_a_coroutine_closed_unfinished_is_no_worker_fault(
    memory: MemorySQS, clock: FakeClock, keyed: bool
) -> None:
    """At a process's exit the garbage collector closes a coroutine left pending: its
    handler sees GeneratorExit. That is no fault of the worker's, and not the handler's
    failure: the message goes back at once, as a thread's fault hands its message back
    (with a store, settling would await a helper thread inside the close)."""
    started = threading.Event()

    async def handler(message: Message) -> None:
        started.set()
        await asyncio.sleep(3600)

    rig = Rig(memory, clock, handler, store=MemoryStore() if keyed else None)
    rig.send("x")
    rig.worker.start()
    assert started.wait(10)
    runner = rig.worker.runner
    assert isinstance(runner, Coroutines)
    (task,) = list(runner.loop._tasks)
    closed = threading.Event()

    def close_it() -> None:  # as the collector does to a coroutine left pending
        task.get_coro().close()  # type: ignore[union-attr]
        closed.set()

    runner.loop._loop.call_soon_threadsafe(close_it)
    assert closed.wait(10)
    assert runner.loop._faults == 0 and runner.loop.alive()
    assert rig.count("failed") == 0 and rig.count("deleted") == 0


def test_a_loop_whose_thread_has_not_run_yet_is_starting_not_stalled() -> None:
    """start() does not wait for the loop thread: until its first beat, a late one (a
    loaded machine) is not reported as a handler blocking the loop."""
    go = threading.Event()
    beats: list[float] = []  # the watchdog's waits between its looks

    class SlowToStart(SystemClock):
        def spawn(self, name: str, target: Callable[[], object]) -> Task:
            if name != "sqsworker-event-loop":
                return super().spawn(name, target)
            return super().spawn(name, lambda: (go.wait(10), target()))

        def wait(self, cond: threading.Condition, deadline: float | None) -> None:
            if cond is runner._closing:
                beats.append(self.monotonic())
            super().wait(cond, deadline)

    stalls = Stalls()
    runner = EventLoopRunner(1, SlowToStart(), lambda n: [], _nothing, stalls, lambda b: None)
    runner.start()
    # The watchdog looks past BLOCKED (0.5 s) while the loop thread has not run.
    wait_until(lambda: len(beats) > 1 and beats[-1] - beats[0] > 0.75, what="watchdog beats")
    assert runner.blocked_for() == 0.0 and not stalls.blocked
    go.set()
    wait_until(lambda: runner._last_beat < math.inf, timeout=5, what="the first beat")
    assert runner.blocked_for() == 0.0
    runner.close()
    assert not stalls.blocked


class Returns(Observer):
    """Each return SQS took: (delay, reason)."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, str]] = []

    def returned(self, messages: Any, delay: float, reason: str) -> None:
        self.seen.extend((delay, reason) for _ in messages)


@pytest.mark.parametrize("shape", ["def", "async def"])
def test_a_handler_that_raises_generator_exit_itself_is_failed_by_it(
    memory: MemorySQS, clock: FakeClock, shape: str
) -> None:
    """Raised by the handler (a generator's throw, a context manager), not a close from
    outside: the message's failure, with its backoff, alike for both shapes."""

    def plain(message: Message) -> None:
        raise GeneratorExit("the handler's own")

    async def coro(message: Message) -> None:
        await asyncio.sleep(0)
        raise GeneratorExit("the handler's own")

    returns = Returns()
    rig = Rig(memory, clock, plain if shape == "def" else coro, observers=[returns])
    rig.send("x")
    rig.worker.start()
    rig.wait_for("returned", 1)
    assert rig.count("failed") == 1 and rig.count("worker_errors") == 0
    (delay, reason), *_ = returns.seen
    assert reason == "retry" and delay > 0  # its backoff, not back at once
    rig.stop()
