"""Review 34: a ReceiveMessage answer that names one message twice, same receipt handle
(a shape SQS never gives, as a replaying proxy or a stub may), read by SQSTransport.receive
(commit 887798a checks each message's shape, not that the answer names it once)."""

from __future__ import annotations

import threading
from typing import Any

from sqsworker import Message
from sqsworker.clock import FakeClock
from sqsworker.transports import send_all
from sqsworker.transports.memory import MemorySQS, MemoryTransport
from sqsworker.transports.sqs import SQSTransport

from .helpers import Rig


class DoublingClient:
    """botocore's SQS client as far as the worker's hot calls go, over the in-memory SQS;
    its first receive that gets messages names the first one twice."""

    def __init__(self, queue: MemoryTransport) -> None:
        self.queue = queue
        self.doubled = False

    def receive_message(self, **kw: Any) -> dict[str, Any]:
        got = self.queue.receive(
            kw["MaxNumberOfMessages"],
            kw["WaitTimeSeconds"],
            kw["VisibilityTimeout"],
            kw.get("ReceiveRequestAttemptId"),
        )
        messages = [
            {
                "MessageId": e.message_id,
                "ReceiptHandle": e.receipt_handle,
                "Body": e.body,
                "Attributes": dict(e.attributes),
                "MessageAttributes": dict(e.message_attributes),
            }
            for e in got
        ]
        if messages and not self.doubled:
            self.doubled = True
            messages.append(dict(messages[0]))
        return {"Messages": messages} if messages else {}

    def delete_message_batch(self, QueueUrl: str, Entries: list[dict[str, Any]]) -> Any:
        r = self.queue.delete_batch([(e["Id"], e["ReceiptHandle"]) for e in Entries])
        return _answer(r)

    def change_message_visibility_batch(self, QueueUrl: str, Entries: list[dict[str, Any]]) -> Any:
        r = self.queue.change_visibility_batch(
            [(e["Id"], e["ReceiptHandle"], e["VisibilityTimeout"]) for e in Entries]
        )
        return _answer(r)

    def close(self) -> None:
        pass


def _answer(result: Any) -> dict[str, Any]:
    return {
        "Successful": [{"Id": i} for i in result.succeeded],
        "Failed": [
            {"Id": f.id, "Code": f.code, "Message": f.message, "SenderFault": f.sender_fault}
            for f in result.failed
        ],
    }


def test_a_message_named_twice_in_one_receive_answer_runs_once(
    memory: MemorySQS, clock: FakeClock
) -> None:
    memory.create_queue_with_dlq("jobs", 3)
    queue = memory.transport("jobs")
    transport = SQSTransport(DoublingClient(queue), queue.info, attempts=1)
    runs: list[str] = []
    lock = threading.Lock()

    def handler(message: Message) -> None:
        with lock:
            runs.append(message.message_id)

    rig = Rig(memory, clock, handler, transport=transport, concurrency=2)
    rig.send("a")
    rig.worker.start()
    # settled: deleted from the queue, and every message the worker took in is accounted for
    rig.advance_until(
        lambda: (
            memory.counts("jobs").total == 0
            and rig.count("received") >= 1
            and rig.count("succeeded") + rig.count("failed") + rig.count("skipped")
            >= rig.count("received")
        )
    )
    try:
        assert len(runs) == 1, (
            f"one message, one receipt handle, run {len(runs)} times: {runs} "
            f"(tally {dict(rig.tally.counts)})"
        )
    finally:
        rig.stop()


def test_the_transport_reads_a_message_named_twice_in_one_answer_once(
    memory: MemorySQS,
) -> None:
    """For every caller of ``receive`` (the worker, the Spark source, peek): the first
    naming counts, as for a batch entry."""
    memory.create_queue("jobs")
    queue = memory.transport("jobs")
    transport = SQSTransport(DoublingClient(queue), queue.info, attempts=1)
    send_all(queue, ["a", "b"])
    got = transport.receive(10, 0, 30)
    assert sorted(e.body for e in got) == ["a", "b"]
    assert len({e.receipt_handle for e in got}) == 2
