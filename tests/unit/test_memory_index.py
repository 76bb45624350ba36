"""The in-memory SQS's index of visible messages (``Visibility``) against the walk it
replaces: over random sends, receives, visibility changes, deletes, re-deliveries and
dead-letterings, each receive of a standard queue returns exactly the messages walking
the queue in order would, and a receive that finds none waits for the soonest hidden."""

from __future__ import annotations

import random

import pytest

from sqsworker.clock import FakeClock
from sqsworker.transports import Envelope, OutgoingMessage
from sqsworker.transports.memory import MemorySQS
from sqsworker.transports.memory_queue import MemoryQueue


def walked(queue: MemoryQueue, now: float, limit: int) -> tuple[list[str], list[str]]:
    """What a receive takes (and dead-letters), found by walking every message in order."""
    taken: list[str] = []
    doomed: list[str] = []
    most = queue.info.max_receive_count
    for message in queue.messages.values():
        if len(taken) >= limit:
            break
        if message.visible_at > now:
            continue
        if most is not None and message.receive_count >= most:
            doomed.append(message.message_id)
        else:
            taken.append(message.message_id)
    return taken, doomed


@pytest.mark.parametrize("seed", range(12))
def test_a_receive_takes_what_walking_the_queue_in_order_would(seed: int) -> None:
    rng = random.Random(seed)
    clock = FakeClock()
    service = MemorySQS(clock, seed=seed)
    service.create_queue_with_dlq("jobs", max_receive_count=3)
    jobs = service.transport("jobs")
    queue = service._queues["jobs"]
    held: list[Envelope] = []
    received = 0
    for _ in range(600):
        step = rng.random()
        if step < 0.25:
            sent = [OutgoingMessage(f"m{rng.random()}") for _ in range(rng.randint(1, 10))]
            if rng.random() < 0.2:  # some delayed
                sent = [OutgoingMessage(m.body, delay_seconds=rng.randint(1, 5)) for m in sent]
            assert not jobs.send_batch(sent).failed
        elif step < 0.55:
            limit, visibility = rng.randint(1, 10), rng.choice([0, 1, 2, 5, 30])
            before = {m.message_id: m.receive_count for m in queue.messages.values()}
            taken, doomed = walked(queue, clock.monotonic(), limit)
            got = jobs.receive(limit, 0, visibility)
            assert [e.message_id for e in got] == taken
            assert all(message_id not in queue.messages for message_id in doomed)
            counts = [int(e.attributes["ApproximateReceiveCount"]) for e in got]
            assert counts == [before[e.message_id] + 1 for e in got]
            held += got
            received += len(got)
        elif step < 0.7 and held:
            chosen = rng.sample(held, min(len(held), rng.randint(1, 10)))
            seconds = rng.choice([0, 1, 3, 20])
            jobs.change_visibility_batch(
                [(str(i), e.receipt_handle, seconds) for i, e in enumerate(chosen)]
            )
        elif step < 0.85 and held:
            chosen = rng.sample(held, min(len(held), rng.randint(1, 10)))
            jobs.delete_batch([(str(i), e.receipt_handle) for i, e in enumerate(chosen)])
            held = [e for e in held if e not in chosen]
        elif step < 0.9 and held:
            again = rng.choice(held).message_id
            if again in queue.messages or ("jobs", again) in service._deleted:  # not dead-lettered
                service.deliver_again("jobs", again)
        else:
            clock.advance(rng.choice([0.5, 1, 2, 7]))
        # the soonest hidden message, as the walk finds it
        now = clock.monotonic()
        hidden = [m.visible_at for m in queue.messages.values() if m.visible_at > now]
        assert queue.index is not None
        assert queue.index.next_visible(queue.messages, now) == min(hidden, default=None)
    assert received > 200  # the schedule exercised receives, not only sends


def test_a_receive_with_1000_in_flight_looks_at_the_visible_ones_only() -> None:
    clock = FakeClock()
    service = MemorySQS(clock, seed=1)
    service.create_queue("jobs")
    jobs = service.transport("jobs")
    for _ in range(110):
        jobs.send_batch([OutgoingMessage("x") for _ in range(10)])
    for _ in range(100):
        assert len(jobs.receive(10, 0, 300)) == 10
    queue = service._queues["jobs"]
    assert queue.index is not None
    looked = 0
    walk = queue.index.visible

    def counting(*args: object) -> object:
        nonlocal looked
        for message in walk(*args):  # type: ignore[arg-type]
            looked += 1
            yield message

    setattr(queue.index, "visible", counting)  # noqa: B010 (a method replaced, for the count)
    assert len(jobs.receive(10, 0, 300)) == 10
    assert looked == 10  # not the thousand in flight before them
