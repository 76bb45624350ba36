"""FIFO queues: one lane per message group, on the in-memory SQS with a fake clock."""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any

import pytest

from sqsworker import Backoff, Message, Worker, WorkerConfig
from sqsworker.clock import FakeClock
from sqsworker.events import Tally
from sqsworker.transports import OutgoingMessage, send_all
from sqsworker.transports.memory import MemorySQS

from ..conftest import wait_until


def fifo_worker(
    memory: MemorySQS, clock: FakeClock, handler: Any, **options: Any
) -> tuple[Worker, Tally]:
    memory.create_queue_with_dlq("jobs.fifo", 5)
    tally = Tally()
    settings = {"queue": "jobs.fifo", "wait_time": 0, "delete_interval": 0, "concurrency": 4}
    worker = Worker(
        handler,
        WorkerConfig(**{**settings, **options}),
        transport=memory.transport("jobs.fifo"),
        clock=clock,
        observer=tally,
        backoff=Backoff(2.0, 900.0),
    )
    return worker, tally


def send(memory: MemorySQS, group: str, *bodies: str) -> None:
    send_all(
        memory.transport("jobs.fifo"),
        [OutgoingMessage(b, group_id=group, deduplication_id=f"{group}-{b}") for b in bodies],
    )


def advance_until(clock: FakeClock, predicate: Any, what: str) -> None:
    """Move fake time a second at a time: an empty receive (every group held back by
    one of its messages in flight) pauses the receive loop for a second of it."""
    for _ in range(200):
        if predicate():
            return
        clock.advance(1)
        threading.Event().wait(0.002)
    wait_until(predicate, timeout=2, what=what)


def stop(worker: Worker) -> None:
    worker.request_stop()
    worker.shutdown()


def test_a_group_runs_in_order_while_groups_run_side_by_side(
    memory: MemorySQS, clock: FakeClock
) -> None:
    together = threading.Barrier(2, timeout=10)  # the heads of a and b must overlap
    lock = threading.Lock()
    running: set[str] = set()
    overlaps: list[str] = []
    done: dict[str, list[str]] = defaultdict(list)

    def handle(message: Message) -> None:
        group = message.group_id or ""
        with lock:
            assert group not in running, f"two messages of group {group} ran at once"
            running.add(group)
        if message.body == "1":
            together.wait()
        with lock:
            overlaps.append(",".join(sorted(running)))
            running.discard(group)
            done[group].append(message.body)

    worker, tally = fifo_worker(memory, clock, handle)
    send(memory, "a", *[str(i) for i in range(1, 8)])
    send(memory, "b", *[str(i) for i in range(1, 8)])
    worker.start()
    advance_until(clock, lambda: tally.counts["deleted"] == 14, what="all 14 deleted")
    assert done == {"a": [str(i) for i in range(1, 8)], "b": [str(i) for i in range(1, 8)]}
    assert "a,b" in overlaps
    stop(worker)


def test_a_failure_hands_back_its_groups_later_messages_so_the_retry_comes_first(
    memory: MemorySQS, clock: FakeClock
) -> None:
    runs: list[str] = []

    def handle(message: Message) -> None:
        runs.append(f"{message.group_id}{message.body}")
        if message.body == "1" and message.group_id == "g" and message.receive_count == 1:
            raise RuntimeError("g1 fails once")

    worker, tally = fifo_worker(memory, clock, handle, concurrency=1)
    send(memory, "g", "1", "2", "3")
    send(memory, "h", "1", "2")
    worker.start()
    # One receive brought both groups: h needs no time to pass, and g1's backoff has not.
    # Returns are counted once SQS answered them, which may come after h's deletes.
    wait_until(
        lambda: tally.counts["deleted"] == 2 and tally.counts["returned"] == 3,
        what="group h to finish; g1 returned after backoff, g2 and g3 handed back",
    )
    assert runs.count("g1") == 1 and "g2" not in runs  # g waits for its retry
    advance_until(clock, lambda: tally.counts["deleted"] == 5, what="group g to finish")
    g_runs = [r for r in runs if r.startswith("g")]
    assert g_runs == ["g1", "g1", "g2", "g3"]
    stop(worker)


def test_messages_waiting_in_a_lane_keep_their_leases(memory: MemorySQS, clock: FakeClock) -> None:
    release = threading.Event()
    started = threading.Event()

    def handle(message: Message) -> None:
        if message.body == "1":
            started.set()
            release.wait(30)

    worker, tally = fifo_worker(memory, clock, handle, visibility_timeout=10)
    send(memory, "g", "1", "2", "3")
    worker.start()
    assert started.wait(10)
    for step in range(1, 5):  # 20 s: twice the visibility timeout, g2 and g3 waiting
        clock.advance(5)
        wait_until(lambda n=3 * step: tally.counts["lease_extensions"] >= n)
    assert tally.counts["leases_lost"] == 0
    release.set()
    wait_until(lambda: tally.counts["deleted"] == 3)
    stop(worker)


@pytest.mark.parametrize("groups", [1, 3])
def test_shutdown_hands_back_every_lane(memory: MemorySQS, clock: FakeClock, groups: int) -> None:
    release = threading.Event()
    started = threading.Semaphore(0)

    def handle(message: Message) -> None:
        started.release()
        release.wait(30)

    worker, tally = fifo_worker(memory, clock, handle, concurrency=groups)
    for g in range(groups):
        send(memory, f"g{g}", "1", "2", "3")
    worker.start()
    for _ in range(groups):
        assert started.acquire(timeout=10)
    wait_until(lambda: worker.in_hand == 3 * groups)
    worker.request_stop()
    done = threading.Thread(target=worker.shutdown)
    done.start()
    wait_until(lambda: tally.counts["handed_back"] == 2 * groups)
    release.set()
    done.join(10)
    assert tally.counts["deleted"] == groups
