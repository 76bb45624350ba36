"""Review 35 (5ed692b): an answer whose every message is one held already (a proxy that
replays, or caches, ReceiveMessage answers: the case the commit names) brings nothing,
as an empty answer brings nothing. An empty answer pauses the receives (IDLE_PAUSE at
wait 0; a long poll answered early fails, 759b7f4, and backs off). An answer of repeats
only does not: ``LeaseKeeper.add`` returns [], ``Receiver._poll`` puts nothing, wakes,
and the receive thread asks again at once, a warning per message each time: with the
clock standing still it makes receive after receive, without end, while the message is
held (its handler running)."""

from __future__ import annotations

from typing import Any

import pytest

from sqsworker.clock import FakeClock
from sqsworker.transports.memory import MemorySQS
from sqsworker.transports.sqs import SQSTransport

from ..conftest import wait_until
from .helpers import Gate, Rig
from .test_review_34_receive_twice import DoublingClient

SPIN = 300  # receives made with the clock standing still: no pause came between them


class ReplaysForever(DoublingClient):
    """Answers every receive after its first that held messages with that answer."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.doubled = True  # no doubling here
        self.first: dict[str, Any] | None = None
        self.replays = 0

    def receive_message(self, **kw: Any) -> dict[str, Any]:
        if self.first is not None:
            self.replays += 1
            return self.first
        answer = super().receive_message(**kw)
        if answer:
            self.first = answer
        return answer


@pytest.mark.parametrize("wait_time", [0, 20])
def test_an_answer_of_repeats_only_pauses_the_receives_as_an_empty_one_does(
    memory: MemorySQS, clock: FakeClock, wait_time: int
) -> None:
    memory.create_queue_with_dlq("jobs", 3)
    queue = memory.transport("jobs")
    client = ReplaysForever(queue)
    transport = SQSTransport(client, queue.info, attempts=1)
    gate = Gate()  # the message stays held, its handler running, while the replays come
    rig = Rig(
        memory,
        clock,
        gate,
        transport=transport,
        concurrency=2,
        prefetch=0,
        wait_time=wait_time,
        visibility_timeout=30,
    )
    receiver = rig.worker.receiver
    rig.send("a")
    rig.worker.start()
    try:
        assert gate.started.wait(10)
        # The clock stands still: a receive thread that pauses waits on it.
        wait_until(
            lambda: client.replays >= SPIN or receiver._paused_until > clock.monotonic(),
            what=lambda: f"a pause or {SPIN} replays (have {client.replays})",
        )
        replays, paused = client.replays, receiver._paused_until > clock.monotonic()
        assert paused and replays < SPIN, (
            f"{replays} receives answered with the held message only, the fake clock "
            f"standing still at {clock.monotonic()}: no pause between them "
            f"(tally {dict(rig.tally.counts)})"
        )
    finally:
        gate.release.set()
        rig.stop()


class EmptyAfterFirst(ReplaysForever):
    """The control: answers every receive after its first that held messages with none."""

    def receive_message(self, **kw: Any) -> dict[str, Any]:
        if self.first is not None:
            self.replays += 1
            return {}
        return super().receive_message(**kw)


@pytest.mark.parametrize("wait_time", [0, 20])
def test_control_an_empty_answer_at_once_pauses_the_receives(
    memory: MemorySQS, clock: FakeClock, wait_time: int
) -> None:
    memory.create_queue_with_dlq("jobs", 3)
    queue = memory.transport("jobs")
    client = EmptyAfterFirst(queue)
    transport = SQSTransport(client, queue.info, attempts=1)
    gate = Gate()
    rig = Rig(
        memory,
        clock,
        gate,
        transport=transport,
        concurrency=2,
        prefetch=0,
        wait_time=wait_time,
        visibility_timeout=30,
    )
    receiver = rig.worker.receiver
    rig.send("a")
    rig.worker.start()
    try:
        assert gate.started.wait(10)
        wait_until(
            lambda: client.replays >= SPIN or receiver._paused_until > clock.monotonic(),
            what=lambda: f"a pause or {SPIN} empty answers (have {client.replays})",
        )
        assert receiver._paused_until > clock.monotonic() and client.replays < SPIN
    finally:
        gate.release.set()
        rig.stop()
