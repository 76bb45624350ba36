"""Receive answers SQS never gives, naming messages again under the receipt handles they
were delivered by: within one answer (a stub naming one twice), or an earlier answer
replayed by a proxy. SQS gives a message it delivers again a new handle, so neither is a
delivery: one lease, one run, the receive threads alive, and a pause where an answer
brings nothing new."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from sqsworker import Message
from sqsworker.clock import FakeClock
from sqsworker.transports import BatchResult, send_all
from sqsworker.transports.memory import MemorySQS, MemoryTransport
from sqsworker.transports.sqs import SQSTransport

from ..conftest import wait_until
from .helpers import Rig


class Stub:
    """botocore's SQS client over the in-memory SQS, as far as the worker's calls go.
    ``answer`` gives the answer to a receive; ``sqs()`` is SQS's own."""

    def __init__(self, queue: MemoryTransport) -> None:
        self.queue = queue
        self.first: list[dict[str, Any]] = []  # the first answer that held messages
        self.receives = 0

    def answer(self, sqs: Callable[[], list[dict[str, Any]]]) -> list[dict[str, Any]]:
        return sqs()

    def receive_message(self, **kw: Any) -> dict[str, Any]:
        self.receives += 1

        def sqs() -> list[dict[str, Any]]:
            got = self.queue.receive(
                kw["MaxNumberOfMessages"],
                kw["WaitTimeSeconds"],
                kw["VisibilityTimeout"],
                kw.get("ReceiveRequestAttemptId"),
            )
            return [
                {
                    "MessageId": e.message_id,
                    "ReceiptHandle": e.receipt_handle,
                    "Body": e.body,
                    "Attributes": dict(e.attributes),
                    "MessageAttributes": dict(e.message_attributes),
                }
                for e in got
            ]

        given = self.answer(sqs)
        self.first = self.first or given
        return {"Messages": given} if given else {}

    def delete_message_batch(self, QueueUrl: str, Entries: list[dict[str, Any]]) -> Any:
        return _answer(self.queue.delete_batch([(e["Id"], e["ReceiptHandle"]) for e in Entries]))

    def change_message_visibility_batch(self, QueueUrl: str, Entries: list[dict[str, Any]]) -> Any:
        return _answer(
            self.queue.change_visibility_batch(
                [(e["Id"], e["ReceiptHandle"], e["VisibilityTimeout"]) for e in Entries]
            )
        )

    def close(self) -> None:
        pass


def _answer(result: BatchResult) -> dict[str, Any]:
    return {
        "Successful": [{"Id": i} for i in result.succeeded],
        "Failed": [
            {"Id": f.id, "Code": f.code, "Message": f.message, "SenderFault": f.sender_fault}
            for f in result.failed
        ],
    }


class NamesTwice(Stub):
    """Its first answer with messages names the first of them twice."""

    def answer(self, sqs: Callable[[], list[dict[str, Any]]]) -> list[dict[str, Any]]:
        messages = sqs()
        return messages if self.first else messages + [dict(m) for m in messages[:1]]


class ReplaysOnce(Stub):
    """Answers the receive after its first with messages with that first answer again."""

    replayed = False

    def answer(self, sqs: Callable[[], list[dict[str, Any]]]) -> list[dict[str, Any]]:
        if self.first and not self.replayed:
            self.replayed = True
            return self.first
        return sqs()


class ReplaysEver(Stub):
    """Every answer after the first with messages is that first answer."""

    def answer(self, sqs: Callable[[], list[dict[str, Any]]]) -> list[dict[str, Any]]:
        return self.first or sqs()


class EmptyEver(Stub):
    """The control: every answer after the first with messages is empty, at once."""

    def answer(self, sqs: Callable[[], list[dict[str, Any]]]) -> list[dict[str, Any]]:
        return [] if self.first else sqs()


class ReplaysWithNew(Stub):
    """Every answer after the first with messages names that first answer's too."""

    def answer(self, sqs: Callable[[], list[dict[str, Any]]]) -> list[dict[str, Any]]:
        return [*self.first, *sqs()]


def rig_on(
    stub: type[Stub], memory: MemorySQS, clock: FakeClock, handler: Any, **options: Any
) -> tuple[Rig, Stub]:
    memory.create_queue_with_dlq("jobs", 3)
    queue = memory.transport("jobs")
    client = stub(queue)
    transport = SQSTransport(client, queue.info, attempts=1)
    options = {"concurrency": 2, "prefetch": 0, **options}
    return Rig(memory, clock, handler, transport=transport, **options), client


class Runs:
    """A handler counting its runs by body; the message ``hold`` runs until released."""

    def __init__(self, hold: str = "") -> None:
        self.hold, self.held = hold, threading.Event()
        self.release = threading.Event()
        self.bodies: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __call__(self, message: Message) -> None:
        with self._lock:
            self.bodies[message.body] += 1
        if message.body == self.hold:
            self.held.set()
            self.release.wait(30)


def test_the_transport_reads_a_message_named_twice_in_one_answer_once(
    memory: MemorySQS,
) -> None:
    """For every caller of ``receive`` (the worker, the Spark source, peek): the first
    naming counts, as for a batch entry."""
    memory.create_queue("jobs")
    queue = memory.transport("jobs")
    transport = SQSTransport(NamesTwice(queue), queue.info, attempts=1)
    send_all(queue, ["a", "b"])
    got = transport.receive(10, 0, 30)
    assert sorted(e.body for e in got) == ["a", "b"]
    assert len({e.receipt_handle for e in got}) == 2


def test_a_message_named_twice_in_one_answer_runs_once(memory: MemorySQS, clock: FakeClock) -> None:
    runs = Runs()
    rig, _ = rig_on(NamesTwice, memory, clock, runs)
    rig.send("a")
    rig.worker.start()
    rig.wait_for("deleted", 1)
    assert runs.bodies == {"a": 1} and rig.count("received") == 1
    assert rig.stop() == 0


def test_a_replayed_answer_neither_runs_its_messages_again_nor_ends_the_receives(
    memory: MemorySQS, clock: FakeClock
) -> None:
    """The lease machine refused the held handle (IllegalTransition), out of the receive
    thread: with one receive thread, the worker never received again."""
    runs = Runs(hold="a")
    rig, client = rig_on(ReplaysOnce, memory, clock, runs)
    receiver = rig.worker.receiver
    assert rig.worker.room.pollers == 1
    rig.send("a")
    rig.worker.start()
    assert runs.held.wait(10)
    wait_until(lambda: isinstance(client, ReplaysOnce) and client.replayed)
    rig.send("b")
    rig.advance_until(lambda: runs.bodies["b"] == 1)  # received after the replay's pause
    runs.release.set()
    rig.wait_for("deleted", 2)
    assert runs.bodies == {"a": 1, "b": 1} and receiver.alive == 1
    assert rig.stop() == 0


@pytest.mark.parametrize("wait_time", [0, 20])
@pytest.mark.parametrize("stub", [ReplaysEver, EmptyEver], ids=["repeats", "control-empty"])
def test_an_answer_of_repeats_only_pauses_the_receives_as_an_empty_one_does(
    memory: MemorySQS, clock: FakeClock, wait_time: int, stub: type[Stub]
) -> None:
    """Without the pause, the receive thread asked again at once, while the message was
    held: 353 receives with the fake clock standing still."""
    runs = Runs(hold="a")
    rig, client = rig_on(stub, memory, clock, runs, wait_time=wait_time, visibility_timeout=30)
    receiver = rig.worker.receiver
    rig.send("a")
    rig.worker.start()
    try:
        assert runs.held.wait(10)
        wait_until(
            lambda: client.receives >= 300 or receiver._paused_until > clock.monotonic(),
            what=lambda: f"a pause or 300 receives (have {client.receives})",
        )
        assert receiver._paused_until > clock.monotonic() and client.receives < 300
    finally:
        runs.release.set()
        rig.stop()


def test_a_partly_replayed_answer_delivers_its_new_messages_once(
    memory: MemorySQS, clock: FakeClock
) -> None:
    runs = Runs(hold="a")
    rig, client = rig_on(ReplaysWithNew, memory, clock, runs, concurrency=3)
    receiver = rig.worker.receiver
    rig.send("a")
    rig.worker.start()
    try:
        assert runs.held.wait(10)
        rig.send("b", "c")
        rig.advance_until(lambda: runs.bodies["b"] == runs.bodies["c"] == 1)
        rig.advance_until(lambda: client.receives > 10)
        assert runs.bodies == {"a": 1, "b": 1, "c": 1}  # "a" held: its replays left out
        rig.wait_for("succeeded", 2)
    finally:
        runs.release.set()
        rig.stop()
    assert receiver._polls == 0 and receiver._asked == 0 and not receiver._polls_began


class ReplaysAtStop(Stub):
    """Once a message is held, the next receive waits for the stop, then replays."""

    def __init__(self, queue: MemoryTransport) -> None:
        super().__init__(queue)
        self.stop, self.waiting = threading.Event(), threading.Event()

    def answer(self, sqs: Callable[[], list[dict[str, Any]]]) -> list[dict[str, Any]]:
        if not self.first:
            return sqs()
        self.waiting.set()
        self.stop.wait(30)
        return self.first


def test_a_replay_answered_during_the_stop_ends_the_receives(
    memory: MemorySQS, clock: FakeClock
) -> None:
    runs = Runs()
    rig, client = rig_on(ReplaysAtStop, memory, clock, runs, delete_interval=5)
    assert isinstance(client, ReplaysAtStop)
    rig.send("a")
    rig.worker.start()
    wait_until(lambda: client.waiting.is_set() and runs.bodies == {"a": 1})
    code = rig.begin_stop()
    wait_until(rig.worker.receiver.stopping.is_set, what="the stop")
    client.stop.set()
    assert code() == 0
    assert runs.bodies == {"a": 1} and rig.worker.receiver.alive == 0
