"""The receive side: receives in parallel while the queue is busy and one at a time when
it is idle, no barrier behind a slow message, lease calls that do not wait for each other,
and prompt ends (burst mode, the shutdown's wait for a long poll)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from sqsworker import Message
from sqsworker.clock import FakeClock
from sqsworker.errors import TransportError
from sqsworker.events import Observer
from sqsworker.transports import BatchResult, Envelope
from sqsworker.transports.memory import MemorySQS, MemoryTransport

from ..conftest import wait_until
from .helpers import Gate, Rig


class Watched(MemoryTransport):
    """The in-memory transport, counting the receives under way, and able to hold a call
    (``hold``: an action whose calls block until ``go`` is set)."""

    def __init__(self, memory: MemorySQS, name: str, linger: int = 0) -> None:
        super().__init__(memory, memory.transport(name).info)
        self.lock = threading.Condition()
        self.receiving = 0
        self.most = 0  # receives under way at once, at most
        self.linger = linger  # a receive that got messages waits for this many to overlap
        self.waits: list[int] = []
        self.began: list[float] = []
        self.calls: list[str] = []
        self.hold: str | None = None
        self.held = threading.Event()  # a held call is waiting
        self.go = threading.Event()

    def receive(
        self, max_messages: int, wait_seconds: int, visibility: int, attempt_id: Any = None
    ) -> list[Envelope]:
        with self.lock:
            self.receiving += 1
            self.most = max(self.most, self.receiving)
            self.waits.append(wait_seconds)
            self.began.append(self.service.clock.monotonic())
            self.lock.notify_all()
        try:
            got = super().receive(max_messages, wait_seconds, visibility, attempt_id)
            if got and self.linger:  # as real latency would: give other receives a chance
                with self.lock:
                    self.lock.wait_for(lambda: self.receiving >= self.linger, timeout=0.5)
            return got
        finally:
            with self.lock:
                self.receiving -= 1

    def _call(self, action: str) -> None:
        self.calls.append(action)
        if self.hold == action:
            self.held.set()
            assert self.go.wait(30)

    def delete_batch(self, entries: Sequence[tuple[str, str]]) -> BatchResult:
        self._call("delete")
        return super().delete_batch(entries)

    def change_visibility_batch(self, entries: Sequence[tuple[str, str, int]]) -> BatchResult:
        self._call("visibility")
        return super().change_visibility_batch(entries)


def test_a_slow_message_does_not_keep_the_idle_threads_from_new_work(
    memory: MemorySQS, clock: FakeClock
) -> None:
    """Capacity 4 (no prefetch) and one message that runs long: the three other threads
    go on receiving, fewer than a batch at a time, instead of waiting for room for 4."""
    slow = Gate()
    rig = Rig(
        memory,
        clock,
        lambda m: slow(m) if m.body == "slow" else None,
        concurrency=4,
        prefetch=0,
    )
    rig.send("slow", *[f"m{i}" for i in range(19)])
    rig.worker.start()
    rig.wait_for("deleted", 19)
    assert slow.started.is_set() and not slow.release.is_set()
    slow.release.set()
    rig.wait_for("deleted", 20)
    assert rig.stop() == 0


def test_receives_overlap_while_they_come_back_full_and_go_one_at_a_time_when_idle(
    memory: MemorySQS, clock: FakeClock
) -> None:
    memory.create_queue_with_dlq("jobs", 3)
    transport = Watched(memory, "jobs", linger=3)
    rig = Rig(memory, clock, lambda m: None, transport=transport, concurrency=30, prefetch=10)
    assert rig.worker.pollers == 4
    rig.send(*[f"m{i}" for i in range(300)])
    rig.worker.start()
    rig.wait_for("deleted", 300)
    assert transport.most >= 3  # not one receive after another
    assert memory.requests["ReceiveMessage"] <= 300 / 10 + 10  # full batches, not trickles

    wait_until(lambda: transport.receiving == 0)
    transport.most = 0
    before = len(transport.waits)
    rig.advance_until(lambda: len(transport.waits) >= before + 10)  # idle: --wait-time 0
    assert transport.most == 1
    assert rig.stop() == 0


def test_a_slow_delete_does_not_hold_up_a_renewal_that_is_due(
    memory: MemorySQS, clock: FakeClock
) -> None:
    memory.create_queue_with_dlq("jobs", 3)
    transport = Watched(memory, "jobs")
    long = Gate()
    rig = Rig(
        memory,
        clock,
        lambda m: long(m) if m.body == "long" else None,
        transport=transport,
        concurrency=2,
        prefetch=0,
    )
    transport.hold = "delete"
    rig.send("long", "quick")
    rig.worker.start()
    assert transport.held.wait(10)  # the quick one's delete is under way, unanswered
    wait_until(long.started.is_set)
    clock.advance(6)  # past half of the long one's 10 s lease
    wait_until(lambda: "visibility" in transport.calls, what="a renewal behind the delete")
    transport.go.set()
    long.release.set()
    rig.wait_for("deleted", 2)
    assert rig.count("leases_lost") == 0
    assert rig.stop() == 0


def test_no_call_about_a_message_starts_while_one_about_it_is_under_way(
    memory: MemorySQS, clock: FakeClock
) -> None:
    """A renewal under way, then the handler finishes: its delete waits for the renewal's
    answer, so a return can never overtake the renewal before it (nor a delete race it)."""
    memory.create_queue_with_dlq("jobs", 3)
    transport = Watched(memory, "jobs")
    gate = Gate()
    rig = Rig(memory, clock, gate, transport=transport, concurrency=1, prefetch=0)
    transport.hold = "visibility"
    rig.send("x")
    rig.worker.start()
    wait_until(gate.started.is_set)
    clock.advance(6)
    assert transport.held.wait(10)  # the renewal is under way
    gate.release.set()
    rig.wait_for("succeeded", 1)
    clock.advance(1)  # the lease thread looks again: the delete is due, but must wait
    threading.Event().wait(0.2)  # time for a wrongly sent delete to show (none must)
    assert transport.calls == ["visibility"]
    transport.go.set()
    rig.wait_for("deleted", 1)
    assert transport.calls == ["visibility", "delete"]
    assert rig.stop() == 0


def test_burst_mode_long_polls_a_second_at_most(memory: MemorySQS, clock: FakeClock) -> None:
    """So an empty queue ends the run within about a second of the last delete, not after
    a full --wait-time of empty long poll."""
    memory.create_queue_with_dlq("jobs", 3)
    transport = Watched(memory, "jobs")
    rig = Rig(
        memory,
        clock,
        lambda m: None,
        transport=transport,
        wait_time=20,
        burst=True,
        visibility_timeout=30,
    )
    rig.send("a", "b", "c")
    rig.worker.start()
    rig.advance_until(lambda: rig.worker.wait(0))
    assert rig.count("deleted") == 3
    assert transport.waits and max(transport.waits) == 1
    assert rig.stop() == 0


def test_after_a_failed_receive_no_receive_starts_before_the_pause_ends(
    memory: MemorySQS, clock: FakeClock
) -> None:
    """Several receive threads share one pause: they do not take turns failing at once."""
    memory.create_queue_with_dlq("jobs", 3)
    transport = Watched(memory, "jobs")
    rig = Rig(memory, clock, lambda m: None, transport=transport, concurrency=30, prefetch=10)
    memory.inject_fault("ReceiveMessage", TransportError("down", code="ServiceUnavailable"))
    rig.worker.start()
    rig.wait_for("receive_failures", 1)
    failed_at = transport.began[0]
    threading.Event().wait(0.2)  # time for a receive that ignored the pause to show
    assert len(transport.began) == 1
    rig.advance_until(lambda: len(transport.began) >= 2, step=0.25)
    assert transport.began[1] >= failed_at + 1.0  # the first failure's pause
    assert rig.stop() == 0


class EmptyAtOnce(Watched):
    """Answers every receive at once with nothing: a proxy's page that botocore reads as
    an empty answer, or a stub's ``{}``."""

    def receive(
        self, max_messages: int, wait_seconds: int, visibility: int, attempt_id: Any = None
    ) -> list[Envelope]:
        with self.lock:
            self.began.append(self.service.clock.monotonic())
        return []


def test_a_long_poll_answered_at_once_with_nothing_pauses_the_receives_as_a_failure(
    memory: MemorySQS, clock: FakeClock
) -> None:
    """SQS answers a long poll with nothing only once it waited it out: one back empty at
    once is no answer of SQS's. Taken as empty, the receive threads asked again at once,
    as fast as the endpoint answered; failed, the receives pause, longer each time."""
    memory.create_queue_with_dlq("jobs", 3)
    transport = EmptyAtOnce(memory, "jobs")
    rig = Rig(
        memory, clock, lambda m: None, transport=transport, wait_time=20, visibility_timeout=30
    )
    receiver = rig.worker.receiver
    rig.worker.start()
    rig.wait_for("receive_failures", 1)

    def all_asleep() -> bool:
        with rig.worker.inbox.lock:
            return len(receiver._idle) == rig.worker.pollers and not receiver._woken

    wait_until(all_asleep, what="every receive thread waiting out the pause")
    assert len(transport.began) == 1 and rig.count("empty_receives") == 0
    rig.advance_until(lambda: len(transport.began) >= 3, step=0.25)
    first, second, third = transport.began[:3]
    assert second >= first + 1.0 and third >= second + 2.0  # paused, longer each time
    assert rig.count("empty_receives") == 0
    assert rig.stop() == 0


class Awaited(Observer):
    def __init__(self) -> None:
        self.seen: list[tuple[int, float]] = []

    def receives_awaited(self, receives: int, seconds: float) -> None:
        self.seen.append((receives, seconds))


def test_shutdown_says_which_long_poll_it_waits_for_and_hands_back_what_it_returns(
    memory: MemorySQS, clock: FakeClock
) -> None:
    memory.create_queue_with_dlq("jobs", 3)
    transport = Watched(memory, "jobs")
    awaited = Awaited()
    ran: list[Message] = []
    rig = Rig(
        memory,
        clock,
        ran.append,
        transport=transport,
        observers=[awaited],
        wait_time=20,
        visibility_timeout=30,
    )
    rig.worker.start()
    wait_until(lambda: transport.receiving == 1)
    clock.advance(5)
    result: list[int] = []
    rig.worker.request_stop()
    stopping = threading.Thread(target=lambda: result.append(rig.worker.shutdown()))
    stopping.start()
    wait_until(lambda: bool(awaited.seen))
    assert awaited.seen == [(1, 15.0)]
    rig.send("arrives during the last poll")
    stopping.join(10)
    assert result == [0] and not ran
    assert rig.queue.counts().visible == 1  # handed straight back, not stranded


def test_auto_prefetch_holds_what_the_handlers_finish_during_a_receive(
    memory: MemorySQS, clock: FakeClock
) -> None:
    """64 handler threads, 20 ms a message and 20 ms a receive: the threads could finish
    64 while one receive is under way, so that many are held beyond the running ones
    (with a batch), and no thread waits on a receive. It counts what the threads could
    finish, not what they did, which a starved worker would measure low and keep low.
    Never more than max(10, 2 x concurrency); a fixed --prefetch is exactly that."""
    from sqsworker import Worker, WorkerConfig

    memory.create_queue("jobs")
    worker = Worker(
        lambda m: None,
        WorkerConfig(queue="jobs", concurrency=64),
        transport=memory.transport("jobs"),
        clock=clock,
    )
    assert worker.pace is not None and worker.capacity == 64 + 128
    assert worker.receiver.capacity() == 64 + 10  # nothing measured yet: a batch
    for _ in range(100):
        worker.pace.finished(0.02)
    worker.pace.answered(0.02)
    assert worker.pace.ahead() == 64
    assert worker.receiver.capacity() == 64 + 10 + 64
    worker.pace.answered(0.2)  # a slow network: a round trip of 74 ms, smoothed
    assert worker.receiver.capacity() == 64 + 128  # at most max(10, 2 x concurrency) beyond

    fixed = Worker(
        lambda m: None,
        WorkerConfig(queue="jobs", concurrency=64, prefetch=5),
        transport=memory.transport("jobs"),
        clock=clock,
    )
    assert fixed.pace is None and fixed.receiver.capacity() == fixed.capacity == 69


def test_a_lease_shortened_by_extend_is_lost_at_its_new_end_when_its_renewal_hangs(
    memory: MemorySQS, clock: FakeClock
) -> None:
    """extend(10) on a 300 s lease, then the next renewal hangs: the lease ends 10 s
    after the renewal that shortened it, and the lease thread notices then, not at the
    old end (found by review: the lease thread slept until the longer lease's end)."""
    memory.create_queue_with_dlq("jobs", 3)
    transport = Watched(memory, "jobs")
    seen: dict[str, Any] = {}
    release = threading.Event()

    def handler(message: Message) -> None:
        message.lease.extend(10)
        seen["lease"] = message.lease.held  # the worker's hold, whose end the test reads
        transport.hold = "visibility"  # the next renewal hangs
        release.wait(60)

    rig = Rig(
        memory,
        clock,
        handler,
        transport=transport,
        concurrency=1,
        prefetch=0,
        visibility_timeout=300,
    )
    rig.send("x")
    rig.worker.start()
    wait_until(lambda: "lease" in seen)
    lease = seen["lease"]
    clock.advance(6)  # the renewal due at 5 s goes, and hangs
    assert transport.held.wait(10)
    ends = lease.expires_at
    assert ends <= clock.monotonic() + 5
    clock.advance(ends - clock.monotonic() + 0.5)
    rig.wait_for("leases_lost", 1)
    assert lease.lost
    transport.go.set()
    release.set()
    assert rig.stop() == 0


class Waits:
    """The waits the receive threads make for room: so far, and now (by thread, in the
    order their waits began)."""

    def __init__(self) -> None:
        self.made = 0
        self.now = 0
        self.waiting: list[str] = []


class CountingWaits(threading.Condition):
    """A receive thread's condition, counting its waits in ``waits``."""

    def __init__(self, lock: Any, waits: Waits) -> None:
        super().__init__(lock)
        self.waits = waits

    def wait(self, timeout: float | None = None) -> bool:
        name = threading.current_thread().name
        self.waits.made += 1
        self.waits.now += 1
        self.waits.waiting.append(name)
        try:
            return super().wait(timeout)
        finally:
            self.waits.now -= 1
            self.waits.waiting.remove(name)


def count_waits(rig: Rig) -> Waits:
    """The receive threads' conditions, replaced by ones that count their waits."""
    waits, conditions = Waits(), rig.worker.receiver._conditions
    conditions[:] = [CountingWaits(rig.worker.inbox.lock, waits) for _ in conditions]
    return waits


class NamingReceives:
    """The in-memory transport, noting which thread made each receive that brought any."""

    def __init__(self, transport: MemoryTransport) -> None:
        self._transport = transport
        self.by: list[str] = []

    def receive(self, *args: Any, **kwargs: Any) -> list[Envelope]:
        envelopes = self._transport.receive(*args, **kwargs)
        if envelopes:
            self.by.append(threading.current_thread().name)
        return envelopes

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def test_room_for_one_receive_wakes_the_receive_thread_that_waited_least(
    memory: MemorySQS, clock: FakeClock
) -> None:
    """Three receive threads wait for room, each on a condition of its own; room for a
    receive wakes the one whose wait began last. Woken longest-waiting first, each receive went
    to another thread in turn (1.5 context switches a message with 3 receive threads for
    10 handler threads, at an endpoint that answers at once); woken last first, a thread
    that keeps the handlers fed alone makes every receive, and the others sleep."""
    permits = threading.Semaphore(0)
    memory.create_queue_with_dlq("jobs", 3)
    receives = NamingReceives(memory.transport("jobs"))
    rig = Rig(
        memory, clock, lambda m: permits.acquire(), transport=receives, concurrency=30, prefetch=0
    )
    assert rig.worker.pollers == 3
    waits = count_waits(rig)
    rig.send(*[f"m{i}" for i in range(60)])
    rig.worker.start()
    rig.wait_for("received", 30)
    wait_until(lambda: waits.now == 3, what="every receive thread waiting")
    with rig.worker.inbox.lock:
        last, before = waits.waiting[-1], len(receives.by)
    for _ in range(10):
        permits.release()
    rig.wait_for("received", 40)
    wait_until(lambda: waits.now == 3, what="every receive thread waiting again")
    assert rig.count("received") == 40
    # Each room for a few (a thread idle) or a batch: a receive, by the thread that waited
    # least, which waits least again once back.
    assert receives.by[before:] and set(receives.by[before:]) == {last}
    for _ in range(60):
        permits.release()
    rig.wait_for("deleted", 60)
    assert rig.stop() == 0


def test_room_for_one_receive_wakes_one_receive_thread_not_all(
    memory: MemorySQS, clock: FakeClock
) -> None:
    """26 receive threads wait for room: 250 messages running, 10 waiting (prefetch 10).
    Ten finish: room for one receive, and one thread wakes to make it. Woken all at once
    for every change of room (the tenth finish, each delete answered, each receive ended),
    they woke by the dozen to find nothing to do: 50 to 100 wake-ups here, and with 256
    coroutines several a message, each a trip for the GIL."""
    permits = threading.Semaphore(0)
    rig = Rig(memory, clock, lambda m: permits.acquire(), concurrency=250, prefetch=10)
    assert rig.worker.pollers == 26
    waits = count_waits(rig)
    rig.send(*[f"m{i}" for i in range(300)])
    rig.worker.start()
    rig.wait_for("received", 260)
    wait_until(lambda: waits.now == 26, what="every receive thread waiting")
    before = waits.made
    for _ in range(10):
        permits.release()
    rig.wait_for("deleted", 10)
    rig.wait_for("received", 270)
    wait_until(lambda: waits.now == 26, what="every receive thread waiting")
    assert rig.count("received") == 270  # one receive of ten
    assert waits.made - before <= 3, waits.made - before
    for _ in range(300):
        permits.release()
    rig.wait_for("deleted", 300)
    assert rig.stop() == 0
