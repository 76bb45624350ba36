"""Review of 449a4bc (receive threads on conditions of their own, woken last-first):
lost wake-ups, stale idle conditions, ``_woken`` left set, and the ends (stop, burst,
pause) that used to ride on ``slots.notify_all()``. No fake-clock advance where a lost
wake-up is looked for: an advance notifies every waiter and would hide one."""

from __future__ import annotations

import threading

from sqsworker.clock import FakeClock
from sqsworker.errors import TransportError
from sqsworker.transports import OutgoingMessage, send_all
from sqsworker.transports.memory import MemorySQS

from ..conftest import wait_until
from .helpers import Gate, Rig


def _quiet(rig: Rig, waiting: int) -> None:
    """Every receive thread asleep on its own condition, none counted woken, and the
    idle list exactly the conditions slept on."""
    receiver = rig.worker.receiver

    def settled() -> bool:
        with rig.worker.inbox.lock:
            return len(receiver._idle) == waiting and not receiver._woken

    wait_until(settled, what=f"{waiting} receive threads idle")
    with rig.worker.inbox.lock:
        assert len(set(map(id, receiver._idle))) == len(receiver._idle)  # no duplicate
        assert all(any(c is d for d in receiver._conditions) for c in receiver._idle)


def _stop_without_advance(rig: Rig) -> int:
    code = rig.stop()  # the fake clock does not move there
    receiver = rig.worker.receiver
    assert receiver.alive == 0 and receiver._idle == []
    return code


def _deleted_through_idle_pauses(rig: Rig, n: int) -> None:
    """Wait for ``n`` deleted, moving the clock only past the pause after an empty
    receive (--wait-time 0), once all else is still. On a FIFO queue a receive can race
    a delete: SQS holds the group back until the delete is answered, the receive comes
    back empty, and the worker waits IDLE_PAUSE on the clock by design, not for a
    wake-up."""
    worker, receiver = rig.worker, rig.worker.receiver

    def done_or_only_paused() -> bool:
        if rig.count("deleted") >= n:
            return True
        with worker.inbox.lock:
            return (
                rig.clock.monotonic() < receiver._paused_until
                and len(receiver._idle) == worker.pollers
                and worker.inbox.unfinished == 0
                and rig.worker.keeper is not None
                and rig.worker.keeper.settling_count() == 0
            )

    for _ in range(10):
        wait_until(done_or_only_paused, what=lambda: f"deleted >= {n} ({dict(rig.tally.counts)})")
        if rig.count("deleted") >= n:
            return
        with worker.inbox.lock:
            pause_left = receiver._paused_until - rig.clock.monotonic()
        rig.clock.advance(max(pause_left, 0.0))
    raise AssertionError(f"still not {n} deleted after 10 idle pauses: {dict(rig.tally.counts)}")


def test_review_wake_stop_while_every_receive_thread_sleeps_untimed(
    memory: MemorySQS, clock: FakeClock
) -> None:
    gate = Gate()
    rig = Rig(memory, clock, gate, concurrency=30, prefetch=0)
    assert rig.worker.pollers == 3
    rig.send(*[f"m{i}" for i in range(30)])
    rig.worker.start()
    rig.wait_for("received", 30)
    _quiet(rig, 3)
    gate.release.set()
    rig.wait_for("deleted", 30)
    assert _stop_without_advance(rig) == 0


def test_review_wake_stop_during_a_pause_after_a_failed_receive(
    memory: MemorySQS, clock: FakeClock
) -> None:
    rig = Rig(memory, clock, lambda m: None, concurrency=30, prefetch=10)
    memory.inject_fault("ReceiveMessage", TransportError("down", code="ServiceUnavailable"))
    rig.worker.start()
    rig.wait_for("receive_failures", 1)
    _quiet(rig, rig.worker.pollers)  # every thread waits: one by the pause, others untimed
    with rig.worker.inbox.lock:
        assert clock.monotonic() < rig.worker.receiver._paused_until
    assert _stop_without_advance(rig) == 0


def test_review_wake_nothing_unfinished_wakes_a_receive_for_what_waits_in_sqs(
    memory: MemorySQS, clock: FakeClock
) -> None:
    """Room full (30 running, prefetch 0), three receive threads asleep; 30 more sent,
    then every handler finishes, down to none unfinished (where room_changed used to
    wake every receive thread by slots.notify_all): the rest are received without the
    clock moving."""
    gate = Gate()
    rig = Rig(memory, clock, gate, concurrency=30, prefetch=0)
    rig.send(*[f"m{i}" for i in range(30)])
    rig.worker.start()
    rig.wait_for("received", 30)
    _quiet(rig, 3)
    rig.send(*[f"n{i}" for i in range(30)])
    gate.release.set()
    rig.wait_for("received", 60)
    rig.wait_for("deleted", 60)
    assert _stop_without_advance(rig) == 0


def test_review_wake_one_at_a_time_handlers_keep_receives_coming(
    memory: MemorySQS, clock: FakeClock
) -> None:
    """Handlers released one by one (each finish a separate change of room, with the
    receive threads woken last-first): every message is received and run, no advance."""
    permits = threading.Semaphore(0)
    rig = Rig(memory, clock, lambda m: permits.acquire(), concurrency=25, prefetch=5)
    pollers = rig.worker.pollers
    rig.send(*[f"m{i}" for i in range(200)])
    rig.worker.start()
    rig.wait_for("received", 30)
    _quiet(rig, pollers)
    for n in range(1, 201):  # a receive comes whenever a batch fits, or a handler starves
        permits.release()
        rig.wait_for("deleted", n)
    assert rig.count("received") == 200
    assert _stop_without_advance(rig) == 0


def test_review_wake_burst_mode_ends_with_several_receive_threads(
    memory: MemorySQS, clock: FakeClock
) -> None:
    rig = Rig(memory, clock, lambda m: None, concurrency=40, prefetch=0, burst=True)
    assert rig.worker.pollers == 4
    rig.send(*[f"m{i}" for i in range(120)])
    rig.worker.start()
    rig.advance_until(lambda: rig.worker.wait(0), step=0.5)
    assert rig.count("deleted") == 120
    wait_until(lambda: rig.worker.receiver.alive == 0, what="receive threads ended")
    assert _stop_without_advance(rig) == 0


def test_review_wake_fifo_groups_with_several_receive_threads(
    memory: MemorySQS, clock: FakeClock
) -> None:
    gate = Gate()
    rig = Rig(memory, clock, gate, queue="jobs.fifo", concurrency=30, prefetch=0)
    send_all(
        rig.queue,
        [
            OutgoingMessage(f"{g}-{i}", group_id=f"g{g}", deduplication_id=f"{g}-{i}")
            for g in range(30)
            for i in range(2)
        ],
    )
    rig.worker.start()
    rig.wait_for("received", 30)
    _quiet(rig, 3)
    gate.release.set()
    _deleted_through_idle_pauses(rig, 60)
    assert _stop_without_advance(rig) == 0


def test_review_wake_stop_while_a_woken_thread_is_on_its_way_back(
    memory: MemorySQS, clock: FakeClock
) -> None:
    """request_stop right behind a finish that woke a receive thread: the shutdown ends."""
    for attempt in range(20):
        own_clock = FakeClock()
        gate = Gate()
        rig = Rig(MemorySQS(own_clock), own_clock, gate, concurrency=30, prefetch=0)
        rig.send(*[f"m{i}" for i in range(40)])
        rig.worker.start()
        rig.wait_for("received", 30)
        _quiet(rig, 3)
        gate.release.set()
        rig.worker.request_stop()
        code: list[int] = []
        worker = rig.worker
        t = threading.Thread(target=lambda w=worker, c=code: c.append(w.shutdown()))
        t.start()
        t.join(10)
        assert code == [0], attempt
        assert rig.worker.receiver.alive == 0
