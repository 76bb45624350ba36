"""The worker on the in-memory SQS, driven by a fake clock."""

from __future__ import annotations

import gc
import threading
from collections.abc import Sequence
from typing import Any

import pytest

from sqsworker import Message, Reject, Retry, Worker, WorkerConfig
from sqsworker.clock import FakeClock
from sqsworker.errors import LeaseLost, TransportError
from sqsworker.events import Observer, Tally
from sqsworker.lease import LeaseKeeper
from sqsworker.transports import Envelope, OutgoingMessage, send_all
from sqsworker.transports.memory import MemorySQS, MemoryTransport

from ..conftest import wait_until
from .helpers import Gate, Rig


def test_success_deletes_each_message_once_in_batches(memory: MemorySQS, clock: FakeClock) -> None:
    seen: list[str] = []
    rig = Rig(memory, clock, lambda m: seen.append(m.body), concurrency=10)
    rig.send(*[f"m{i}" for i in range(10)])
    rig.worker.start()
    rig.wait_for("deleted", 10)
    assert sorted(seen) == sorted(f"m{i}" for i in range(10))
    assert rig.queue.counts().total == 0
    assert memory.requests["DeleteMessageBatch"] == 1
    assert memory.requests["ChangeMessageVisibilityBatch"] == 0  # fast handlers need no renewal
    assert rig.stop() == 0


def test_failure_returns_the_message_after_backoff(memory: MemorySQS, clock: FakeClock) -> None:
    counts: list[int] = []

    def flaky(message: Message) -> None:
        counts.append(message.receive_count)
        if message.receive_count == 1:
            raise ValueError("first attempt fails")

    rig = Rig(memory, clock, flaky)
    rig.send("x")
    rig.worker.start()
    rig.wait_for("returned", 1)
    assert rig.queue.counts().in_flight == 1  # hidden for the backoff, not lost
    rig.advance_until(lambda: rig.count("deleted") == 1)
    assert counts == [1, 2]
    assert rig.queue.counts().total == 0
    rig.stop()


def test_retry_sets_an_explicit_delay(memory: MemorySQS, clock: FakeClock) -> None:
    runs: list[float] = []

    def later(message: Message) -> None:
        runs.append(clock.monotonic())
        if message.receive_count == 1:
            raise Retry(delay=100)

    rig = Rig(memory, clock, later)
    rig.send("x")
    rig.worker.start()
    rig.wait_for("returned", 1)
    rig.advance_until(lambda: rig.count("deleted") == 1, step=5)
    assert runs[1] - runs[0] >= 100


def test_last_attempt_returns_at_once_and_redrive_moves_it(
    memory: MemorySQS, clock: FakeClock
) -> None:
    def always_fails(message: Message) -> None:
        raise RuntimeError("poison")

    rig = Rig(memory, clock, always_fails, max_receive_count=2)
    rig.send("poison")
    rig.worker.start()
    assert rig.dlq is not None
    rig.advance_until(lambda: rig.dlq is not None and rig.dlq.counts().visible == 1)
    assert rig.count("failed") == 2
    assert rig.count("dead_lettered") == 1  # the summary counts it with the rejected ones
    assert rig.queue.counts().total == 0
    rig.stop()


@pytest.mark.parametrize("body", ["not json", '{"ok": true}'])
def test_reject_goes_straight_to_the_dead_letter_queue(
    memory: MemorySQS, clock: FakeClock, body: str
) -> None:
    def handler(message: Message) -> None:
        message.json()  # a body that is not JSON raises MessageDecodeError, a Reject
        raise Reject("cannot ever work")

    rig = Rig(memory, clock, handler, max_receive_count=5)
    rig.send(body)
    rig.worker.start()
    rig.wait_for("deleted", 1)
    assert rig.dlq is not None
    [dead] = rig.dlq.receive(1, 0, 30)
    assert dead.body == body
    error = dead.message_attributes["sqsworker-error"]["StringValue"]
    assert error.startswith("MessageDecodeError" if body == "not json" else "Reject")
    assert rig.count("failed") == 0 and rig.count("dead_lettered") == 1
    assert rig.queue.counts().total == 0
    rig.stop()


def test_a_fair_queue_runs_a_group_side_by_side_and_its_dead_letter_keeps_the_group(
    memory: MemorySQS, clock: FakeClock
) -> None:
    # A standard queue's MessageGroupId names a tenant (fair queues): no FIFO lanes, so
    # one group's two messages run at once; a rejected one keeps its group in the
    # dead-letter queue, without the deduplication id a standard queue refuses.
    both = threading.Barrier(2, timeout=10)
    groups: list[str | None] = []

    def handler(message: Message) -> None:
        groups.append(message.group_id)
        both.wait()  # broken, and the test fails, unless the two run at the same time
        if message.body == "poison":
            raise Reject("cannot ever work")

    rig = Rig(memory, clock, handler, concurrency=2)
    send_all(rig.queue, [OutgoingMessage(b, group_id="tenant-1") for b in ("ok", "poison")])
    rig.worker.start()
    rig.wait_for("deleted", 2)
    assert groups == ["tenant-1", "tenant-1"] and rig.count("dead_lettered") == 1
    assert rig.dlq is not None
    [dead] = rig.dlq.receive(1, 0, 30)
    assert dead.attributes["MessageGroupId"] == "tenant-1"
    assert "MessageDeduplicationId" not in dead.attributes
    rig.stop()


def test_configured_exception_types_are_not_retried(memory: MemorySQS, clock: FakeClock) -> None:
    def handler(message: Message) -> None:
        raise KeyError("missing field")

    rig = Rig(memory, clock, handler, non_retryable=(KeyError,))
    rig.send("x")
    rig.worker.start()
    rig.wait_for("dead_lettered", 1)
    assert rig.count("failed") == 0
    rig.stop()


def test_reject_without_a_dead_letter_queue_keeps_the_message(
    memory: MemorySQS, clock: FakeClock
) -> None:
    def handler(message: Message) -> None:
        raise Reject("poison")

    rig = Rig(memory, clock, handler, dead_letter=False)
    rig.send("x")
    rig.worker.start()
    rig.wait_for("returned", 1)
    assert rig.queue.counts().in_flight == 1  # kept, hidden for the longest backoff
    clock.advance(899)
    assert rig.queue.counts().in_flight == 1
    rig.stop()


def test_a_slow_handler_keeps_its_lease(memory: MemorySQS, clock: FakeClock) -> None:
    gate = Gate()

    rig = Rig(memory, clock, gate, visibility_timeout=10)
    rig.send("x")
    rig.worker.start()
    assert gate.started.wait(10)
    other = memory.transport("jobs")
    for step in range(1, 9):  # 40 s: four times the visibility timeout
        clock.advance(5)
        rig.wait_for("lease_extensions", step)
        assert other.receive(10, 0, 30) == []
    gate.release.set()
    rig.wait_for("deleted", 1)
    assert rig.count("leases_lost") == 0
    assert rig.queue.counts().total == 0
    rig.stop()


def test_lease_lost_when_renewals_keep_failing(memory: MemorySQS, clock: FakeClock) -> None:
    release = threading.Event()
    seen: list[Message] = []

    def slow(message: Message) -> None:
        seen.append(message)
        release.wait(30)

    memory_fault = TransportError("ServiceUnavailable", code="ServiceUnavailable", retryable=True)
    rig = Rig(memory, clock, slow, visibility_timeout=10, concurrency=1, prefetch=0)
    memory.inject_fault("ChangeMessageVisibilityBatch", memory_fault, times=1000)
    rig.send("x")
    rig.worker.start()
    wait_until(lambda: bool(seen))
    rig.advance_until(lambda: rig.count("leases_lost") == 1)
    assert seen[0].lease.lost and seen[0].lease.seconds_left == 0
    [stolen] = memory.transport("jobs").receive(1, 0, 30)  # another consumer takes it
    assert stolen.receive_count == 2
    release.set()
    rig.wait_for("deleted_after_lease_lost", 1)
    assert rig.count("deleted") == 0  # never reported done
    assert rig.queue.counts().in_flight == 1  # still the other consumer's
    rig.stop()


def test_a_stalled_lease_thread_loses_the_lease_not_the_message(
    memory: MemorySQS, clock: FakeClock
) -> None:
    gate = Gate()
    deleted_receives: list[int] = []  # the receive count of each message reported deleted

    class Deleted(Observer):
        def deleted(self, messages: Sequence[Message]) -> None:
            deleted_receives.extend(m.receive_count for m in messages)

    rig = Rig(memory, clock, gate, visibility_timeout=10, observers=[Deleted()])
    rig.send("x")
    rig.worker.start()
    assert gate.started.wait(10)
    clock.advance(11)  # a pause longer than the lease, as a long GC pause would be
    rig.wait_for("leases_lost", 1)
    gate.release.set()
    rig.wait_for("deleted_after_lease_lost", 1)
    rig.advance_until(lambda: rig.queue.counts().total == 0)
    # The lost first attempt is never reported done; a redelivery may finish the work.
    assert all(receive > 1 for receive in deleted_receives)
    rig.stop()


def test_handler_can_ask_for_more_time(memory: MemorySQS, clock: FakeClock) -> None:
    release = threading.Event()
    left: list[float] = []

    def encode(message: Message) -> None:
        left.append(message.lease.extend(600))
        release.wait(30)

    rig = Rig(memory, clock, encode, visibility_timeout=10)
    rig.send("video")
    rig.worker.start()
    wait_until(lambda: bool(left))
    assert 590 <= left[0] <= 600
    clock.advance(100)  # ten visibility timeouts, and no renewal was due yet
    assert memory.transport("jobs").receive(10, 0, 30) == []
    release.set()
    rig.wait_for("deleted", 1)
    rig.stop()


def test_a_message_is_freed_once_settled_without_the_cyclic_collector(
    memory: MemorySQS, clock: FakeClock
) -> None:
    """A message and its hold refer to each other only one way: what the worker is done
    with goes at once, not at the cyclic collector's next pass (a body can be 1 MiB, and
    those passes over every message in flight cost CPU a message). A lease kept past
    its message reads as lost."""
    leases: list[Any] = []

    def handler(message: Message) -> None:
        leases.append(message.lease)

    def messages_in_memory() -> int:  # unreachable ones too, while the collector is off
        return sum(isinstance(o, Message) for o in gc.get_objects())

    rig = Rig(memory, clock, handler, concurrency=4)
    rig.send(*[f"m{i}" for i in range(8)])
    gc.collect()
    gc.disable()
    try:
        before = messages_in_memory()
        rig.worker.start()
        rig.wait_for("deleted", 8)
        assert rig.stop() == 0
        assert len(leases) == 8
        assert messages_in_memory() == before  # freed by reference counts alone
    finally:
        gc.enable()
    lease = leases[0]
    assert lease.lost and lease.seconds_left == 0
    with pytest.raises(LeaseLost):
        lease.extend(60)


def test_renewals_never_ask_past_the_twelve_hour_cap(memory: MemorySQS, clock: FakeClock) -> None:
    gate = Gate()

    rig = Rig(memory, clock, gate, visibility_timeout=3600)
    rig.send("x")
    rig.worker.start()
    assert gate.started.wait(10)
    keeper = rig.worker.keeper
    assert keeper is not None
    for _ in range(100):  # 600 s at a time, each step waiting for the lease thread to catch up
        if rig.count("leases_lost"):
            break
        clock.advance(600)
        wait_until(
            lambda: (
                rig.count("leases_lost") == 1
                or all(h.renew_at > clock.monotonic() for h in keeper.running())
            )
        )
    # Lost only at the cap, after a warning, with no refused renewal on the way.
    assert clock.monotonic() - 1_000_000.0 >= 43_200 - 600
    assert rig.count("near_cap") == 1
    assert rig.count("request_failures") == 0
    gate.release.set()
    rig.stop()


def test_shutdown_hands_back_unstarted_and_finishes_running(
    memory: MemorySQS, clock: FakeClock
) -> None:
    gate = Gate()

    rig = Rig(memory, clock, gate, concurrency=1, prefetch=5)
    rig.send(*[f"m{i}" for i in range(5)])
    rig.worker.start()
    assert gate.started.wait(10)
    wait_until(lambda: rig.worker.in_hand == 5)
    result: list[int] = []
    stopper = threading.Thread(target=lambda: result.append(rig.stop()))
    stopper.start()
    wait_until(lambda: rig.queue.counts().visible == 4, what="unstarted messages handed back")
    assert not result  # still waiting for the running handler
    gate.release.set()
    stopper.join(10)
    assert result == [0]
    assert rig.count("deleted") == 1 and rig.count("handed_back") == 4
    assert rig.queue.counts().total == 4 and rig.queue.counts().in_flight == 0


def test_shutdown_past_its_timeout_hands_back_running_messages(
    memory: MemorySQS, clock: FakeClock
) -> None:
    gate = Gate()

    rig = Rig(memory, clock, gate, shutdown_timeout=5)
    rig.send("x")
    rig.worker.start()
    assert gate.started.wait(10)
    assert rig.stop_past_timeout() == 1
    assert rig.queue.counts().visible == 1  # handed back, ready for another worker
    gate.release.set()


def test_held_messages_stay_within_concurrency_plus_prefetch(
    memory: MemorySQS, clock: FakeClock
) -> None:
    peak: list[int] = []
    rig: Rig

    def handler(message: Message) -> None:
        peak.append(rig.worker.in_hand)

    rig = Rig(memory, clock, handler, concurrency=2, prefetch=1)
    rig.send(*[f"m{i}" for i in range(30)])
    rig.worker.start()
    rig.advance_until(lambda: rig.count("deleted") == 30)
    assert max(peak) <= 3
    rig.stop()


def test_receive_errors_are_retried_and_nothing_is_lost(
    memory: MemorySQS, clock: FakeClock
) -> None:
    fault = TransportError("RequestThrottled", code="RequestThrottled", retryable=True)
    memory.inject_fault("ReceiveMessage", fault, times=3)
    rig = Rig(memory, clock, lambda m: None)
    rig.send("x")
    rig.worker.start()
    rig.advance_until(lambda: rig.count("deleted") == 1)
    assert rig.count("receive_failures") == 3
    rig.stop()


def test_a_failed_delete_is_retried_not_dropped(memory: MemorySQS, clock: FakeClock) -> None:
    fault = TransportError("InternalError", code="InternalError", retryable=True)
    memory.inject_fault("DeleteMessageBatch", fault, times=2)
    rig = Rig(memory, clock, lambda m: None)
    rig.send("x")
    rig.worker.start()
    rig.advance_until(lambda: rig.count("deleted") == 1)
    assert rig.count("request_failures") == 2
    assert rig.queue.counts().total == 0
    rig.stop()


def test_burst_mode_stops_once_the_queue_is_empty(memory: MemorySQS, clock: FakeClock) -> None:
    rig = Rig(memory, clock, lambda m: None, burst=True)
    rig.send("a", "b", "c")
    rig.worker.start()
    rig.advance_until(lambda: rig.worker.wait(0))
    assert rig.worker.shutdown() == 0
    assert rig.count("deleted") == 3


def test_a_failed_fifo_receive_is_retried_with_the_same_attempt_id(
    memory: MemorySQS, clock: FakeClock
) -> None:
    memory.create_queue("jobs.fifo", {"ContentBasedDeduplication": "true"})
    attempts: list[str | None] = []

    class Recording(MemoryTransport):
        def receive(
            self, max_messages: int, wait_seconds: int, visibility: int, attempt_id: Any = None
        ) -> list[Envelope]:
            attempts.append(attempt_id)
            return super().receive(max_messages, wait_seconds, visibility, attempt_id)

    send_all(memory.transport("jobs.fifo"), [OutgoingMessage("a", group_id="g")])
    memory.inject_fault("ReceiveMessage", TransportError("reset", code="ConnectionError"))
    tally = Tally()
    worker = Worker(
        lambda m: None,
        WorkerConfig(queue="jobs.fifo", wait_time=0, delete_interval=0),
        transport=Recording(memory, memory.transport("jobs.fifo").info),
        clock=clock,
        observer=tally,
    )
    worker.start()
    wait_until(lambda: tally.counts["receive_failures"] == 1)
    clock.advance(1)  # the pause before the retry
    wait_until(lambda: tally.counts["deleted"] == 1)
    clock.advance(1)  # the idle pause after an empty receive
    wait_until(lambda: len(attempts) >= 3)
    first, retried, next_one = attempts[:3]
    assert first is not None and retried == first  # the same receive, tried again
    assert next_one is not None and next_one != first  # a new receive after a success
    worker.request_stop()
    assert worker.shutdown() == 0


def test_a_message_finishing_after_its_lease_expired_is_never_reported_done(
    memory: MemorySQS, clock: FakeClock
) -> None:
    """The whole process paused past the lease: the handler may report before the lease
    thread runs again. Its delete is then tried as unsure, never counted."""
    from sqsworker.lease import LeaseKeeper

    memory.create_queue("jobs")
    transport = memory.transport("jobs")
    send_all(transport, ["x"])
    tally = Tally()
    keeper = LeaseKeeper(transport, clock, tally, delete_interval=0)  # its thread not started
    [held] = keeper.add(transport.receive(1, 0, 10), clock.monotonic(), 10)
    assert keeper.begin(held)
    clock.advance(11)
    keeper.succeed(held)
    assert held.lost and tally.counts["leases_lost"] == 1


def test_a_message_handed_back_cannot_begin_though_a_thread_took_it_just_before(
    memory: MemorySQS, clock: FakeClock
) -> None:
    """Review: step 5 hands back messages taken and not begun; a handler thread's begin()
    landing between the hand-back's mark and its queued return ran the message unaware,
    beside the consumer that got it next, and dropped its delete."""
    memory.create_queue("race")
    queue = memory.transport("race")
    send_all(queue, ["b"])
    keeper = LeaseKeeper(queue, clock, Observer())
    (held,) = keeper.add(queue.receive(1, 0, 60), clock.monotonic(), 60)
    began: list[bool] = []
    release = keeper.release

    def release_after_a_begin(*args: Any, **kwargs: Any) -> None:
        began.append(keeper.begin(held))  # the handler thread wins the race
        release(*args, **kwargs)

    keeper.release = release_after_a_begin  # type: ignore[method-assign]
    keeper.hand_back([held])
    assert began == [False]  # it was True: the message ran after it was handed back
    assert held.message.lease.lost


def test_each_batch_call_goes_to_the_sender_that_waited_least(
    memory: MemorySQS, clock: FakeClock
) -> None:
    """Calls one at a time, each answered before the next is queued: the sender woken for
    each is the one back last, so one sender makes them all. Woken longest-waiting first,
    they went to each sender in turn, each waking on a CPU the last had left."""
    memory.create_queue("jobs")
    queue = memory.transport("jobs")
    send_all(queue, [f"m{i}" for i in range(50)])
    by: list[str] = []

    class NamingDeletes(MemoryTransport):
        def delete_batch(self, entries: Sequence[tuple[str, str]]) -> Any:
            by.append(threading.current_thread().name)
            return super().delete_batch(entries)

    transport = NamingDeletes(memory, queue.info)
    keeper = LeaseKeeper(transport, clock, Observer(), delete_interval=0, senders=3)
    keeper.start()
    general = len(keeper._ready) - 1  # and one sender for renewals only
    assert general == 3
    for _ in range(5):
        wait_until(lambda: len(keeper._idle) == general, what="every sender waiting")
        held = keeper.add(queue.receive(10, 0, 60), clock.monotonic(), 60)
        for h in held:
            assert keeper.begin(h)
            keeper.succeed(h)
        wait_until(lambda: keeper.held_count() == 0, what="the batch deleted")
    assert len(by) == 5 and memory.counts("jobs").total == 0
    assert len(set(by)) == 1, by
    assert keeper.stop(5) == 0
