"""Review 36 (cc93a0e): checks of the receiver's handling of replayed answers that hold
(an answer naming a held message and a new one delivers the new one once and leaves the
room whole; a replay answered while the worker stops ends the receive thread)."""

from __future__ import annotations

import threading
from typing import Any

from sqsworker import Message
from sqsworker.clock import FakeClock
from sqsworker.transports.memory import MemorySQS
from sqsworker.transports.sqs import SQSTransport

from ..conftest import wait_until
from .helpers import Rig
from .test_review_34_receive_twice import DoublingClient


class ReplaysPlusNew(DoublingClient):
    """Every answer after the first that held messages also names the first one's."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.doubled = True
        self.first: list[dict[str, Any]] = []
        self.receives = 0

    def receive_message(self, **kw: Any) -> dict[str, Any]:
        self.receives += 1
        answer = super().receive_message(**kw)
        got = answer.get("Messages", [])
        if not self.first:
            self.first = [dict(m) for m in got]
            return answer
        return {"Messages": [*self.first, *got]}


def test_a_partly_replayed_answer_delivers_the_new_message_once(
    memory: MemorySQS, clock: FakeClock
) -> None:
    memory.create_queue_with_dlq("jobs", 3)
    queue = memory.transport("jobs")
    client = ReplaysPlusNew(queue)
    transport = SQSTransport(client, queue.info, attempts=1)
    runs: list[str] = []
    lock = threading.Lock()
    a_started, release = threading.Event(), threading.Event()

    def handler(message: Message) -> None:
        with lock:
            runs.append(message.body)
        if message.body == "a":
            a_started.set()
            release.wait(30)

    rig = Rig(memory, clock, handler, transport=transport, concurrency=3, prefetch=0)
    receiver = rig.worker.receiver
    rig.send("a")
    rig.worker.start()
    try:
        assert a_started.wait(10)
        rig.send("b", "c")
        rig.advance_until(lambda: runs.count("b") >= 1 and runs.count("c") >= 1, step=1.0)
        rig.advance_until(lambda: client.receives > 10, step=1.0)
        # while "a" is held (its handler running), its replays are left out
        assert sorted(runs) == ["a", "b", "c"], runs
        rig.wait_for("succeeded", 2)
    finally:
        release.set()
        rig.stop()
    assert receiver._polls == 0 and receiver._asked == 0 and not receiver._polls_began


class ReplayAtStop(DoublingClient):
    """Once a message is held, the next receive waits for the stop, then replays."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.doubled = True
        self.first: dict[str, Any] | None = None
        self.stop = threading.Event()
        self.waiting = threading.Event()

    def receive_message(self, **kw: Any) -> dict[str, Any]:
        if self.first is not None:
            self.waiting.set()
            self.stop.wait(30)
            return self.first
        answer = super().receive_message(**kw)
        if answer:
            self.first = answer
        return answer


def test_a_replay_answered_during_the_stop_ends_the_receives(
    memory: MemorySQS, clock: FakeClock
) -> None:
    memory.create_queue_with_dlq("jobs", 3)
    queue = memory.transport("jobs")
    client = ReplayAtStop(queue)
    transport = SQSTransport(client, queue.info, attempts=1)
    ran: list[str] = []
    rig = Rig(
        memory,
        clock,
        lambda m: ran.append(m.body),
        transport=transport,
        concurrency=2,
        prefetch=0,
        delete_interval=5,
    )
    rig.send("a")
    rig.worker.start()
    wait_until(lambda: client.waiting.is_set() and ran == ["a"], what=lambda: ran)
    code = rig.begin_stop()
    wait_until(rig.worker.receiver.stopping.is_set, what="the stop")
    client.stop.set()
    assert code() == 0
    assert ran == ["a"]
    assert rig.worker.receiver.alive == 0
