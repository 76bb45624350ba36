"""Review 34: a ReceiveMessage answer naming a receipt handle the worker holds already (a
proxy replaying an earlier answer: a shape SQS never gives) must not end a receive thread.
The lease machine refuses it (IllegalTransition), and ``Receiver._poll`` calls
``LeaseKeeper.add`` outside its ``try``: the error ends the thread, and with it receiving."""

from __future__ import annotations

from typing import Any

from sqsworker.clock import FakeClock
from sqsworker.transports.memory import MemorySQS
from sqsworker.transports.sqs import SQSTransport

from ..conftest import wait_until
from .helpers import Gate, Rig
from .test_review_34_receive_twice import DoublingClient


class ReplayingClient(DoublingClient):
    """Answers its second receive with its first answer that held messages, once."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.doubled = True  # no doubling here
        self.first: dict[str, Any] | None = None
        self.replayed = False
        self.after = 0  # receives answered after the replay

    def receive_message(self, **kw: Any) -> dict[str, Any]:
        if self.first is not None and not self.replayed:
            self.replayed = True
            return self.first
        answer = super().receive_message(**kw)
        if self.replayed:
            self.after += 1
        elif answer and self.first is None:
            self.first = answer
        return answer


def test_a_replayed_receive_answer_does_not_end_the_receive_thread(
    memory: MemorySQS, clock: FakeClock
) -> None:
    memory.create_queue_with_dlq("jobs", 3)
    queue = memory.transport("jobs")
    client = ReplayingClient(queue)
    transport = SQSTransport(client, queue.info, attempts=1)
    gate = Gate()  # the message stays held, running, while the replay comes
    rig = Rig(memory, clock, gate, transport=transport, concurrency=2, prefetch=0)
    receiver = rig.worker.receiver
    assert rig.worker.room.pollers == 1
    rig.send("a")
    rig.worker.start()
    assert gate.started.wait(10)
    wait_until(lambda: client.replayed)
    # the replay was dealt with: the thread ended, or it went on to receive again
    rig.advance_until(lambda: receiver.alive == 0 or client.after >= 1)
    alive = receiver.alive
    gate.release.set()
    try:
        assert alive == 1, f"receive threads alive {alive} of 1 after a replayed answer"
        assert rig.count("received") == 1  # the replayed copy left out: one lease, one run
    finally:
        rig.stop()
