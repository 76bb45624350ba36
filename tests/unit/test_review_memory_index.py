"""Review of the in-memory SQS's visibility index (``Visibility``): cases the randomized
comparison in test_memory_index.py does not reach."""

from __future__ import annotations

from sqsworker.clock import FakeClock
from sqsworker.transports import Envelope, OutgoingMessage
from sqsworker.transports.memory import MemorySQS


def test_a_message_dead_lettered_twice_into_a_dlq_is_received_once_in_send_order() -> None:
    # A copy delivered again is made from the deleted snapshot, whose ``mark`` is older
    # than a later copy's: a stale entry the DLQ kept for the first copy must not look
    # current for the second (its place in send order tells them apart).
    clock = FakeClock()
    service = MemorySQS(clock, seed=3)
    service.create_queue_with_dlq("jobs", max_receive_count=1)
    jobs, dlq = service.transport("jobs"), service.transport("jobs-dlq")
    assert not jobs.send_batch([OutgoingMessage("x")]).failed
    (got,) = jobs.receive(10, 0, 0)
    x = got.message_id
    assert not jobs.delete_batch([("0", got.receipt_handle)]).failed  # deleted from jobs
    service.deliver_again("jobs", x)  # comes back once (receive count 1)
    assert jobs.receive(10, 0, 0) == []  # past maxReceiveCount: to the DLQ
    (first,) = dlq.receive(10, 0, 0)
    assert first.message_id == x
    assert not dlq.delete_batch([("0", first.receipt_handle)]).failed  # left a stale entry
    service.deliver_again("jobs", x)  # comes back again, from the older snapshot
    service.deliver_again("jobs", x)  # and once more while visible
    assert not dlq.send_batch([OutgoingMessage("y")]).failed  # older than x's next arrival
    assert jobs.receive(10, 0, 0) == []  # x to the DLQ again, now its newest
    bodies = [e.body for e in dlq.receive(10, 0, 0)]
    assert bodies == ["y", "x"]  # the walk's answer: oldest first, each once


def _one_held(seed: int) -> tuple[FakeClock, MemorySQS, Envelope]:
    """A queue "jobs" with one message, received and held for 30 s."""
    clock = FakeClock()
    service = MemorySQS(clock, seed=seed)
    service.create_queue("jobs")
    jobs = service.transport("jobs")
    jobs.send_batch([OutgoingMessage("long job")])
    (held,) = jobs.receive(1, 0, 30)
    return clock, service, held


def _index_entries(service: MemorySQS) -> int:
    index = service._queues["jobs"].index
    assert index is not None
    return len(index.ready) + len(index.hidden)


def test_heartbeats_without_receives_keep_the_index_bounded() -> None:
    # A worker extending its one message's visibility and not polling (a single-slot
    # worker busy with a long job): the index is tidied on each change, not only on a
    # receive, so its entries stay bounded.
    clock, service, held = _one_held(seed=4)
    jobs = service.transport("jobs")
    for _ in range(5_000):
        clock.advance(1)
        assert not jobs.change_visibility_batch([("0", held.receipt_handle, 30)]).failed
    assert _index_entries(service) <= 2 * 1 + 64


def test_deliver_again_without_receives_keeps_the_index_bounded() -> None:
    _, service, held = _one_held(seed=5)
    for _ in range(5_000):
        service.deliver_again("jobs", held.message_id)
    assert _index_entries(service) <= 2 * 1 + 64
