"""No message can stop a worker: input any producer can send, and values any server can
report, are each that message's failure, never a thread's death (issue 29's defects).

Each test sends the hostile message among ordinary ones and checks three things: the
ordinary ones are processed, the hostile one leaves the way it must (dead-lettered with
its reason, or returned after a bounded backoff), and every thread of the worker lives.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Sequence
from typing import Any

import pytest

from sqsworker import Backoff, Message, Reject
from sqsworker.clock import FakeClock
from sqsworker.events import Observer
from sqsworker.payloads import SIZE_ATTRIBUTE, Payloads, RemoveAfterDelete, pointer_of
from sqsworker.stores.memory import MemoryStore
from sqsworker.transports import Envelope, OutgoingMessage, send_all
from sqsworker.transports.memory import MemorySQS, MemoryTransport

from ..conftest import wait_until
from .helpers import Gate, Rig, keyed

# A body a producer can send: 6 KB of JSON nested past what Python's parser reads.
DEEP = "[" * 3000 + "]" * 3000
POINTER_SIZE = {SIZE_ATTRIBUTE: {"DataType": "Number", "StringValue": "300000"}}


class Reporting:
    """The in-memory SQS, but reporting ``counts`` as each message's receive count (by
    body): what a queue without a redrive policy reaches by itself, or another server
    says."""

    def __init__(self, inner: MemoryTransport, counts: dict[str, str | None]) -> None:
        self.inner = inner
        self.counts = counts

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def receive(self, *args: Any, **kwargs: Any) -> list[Envelope]:
        got = self.inner.receive(*args, **kwargs)
        return [
            Envelope(
                e.message_id,
                e.receipt_handle,
                e.body,
                {**e.attributes, "ApproximateReceiveCount": self.counts[e.body]}
                if e.body in self.counts
                else e.attributes,
                e.message_attributes,
            )
            for e in got
        ]


def assert_alive(rig: Rig) -> None:
    health = rig.worker.health()
    assert health.live, health.as_dict()
    assert health.handlers_alive == health.handlers


# -- defect 1: a receive count past 1024 ---------------------------------------------------


@pytest.mark.parametrize(
    ("count", "shortest"),
    [("1025", 450.0), (str(2**31), 450.0), ("not a number", 1.0), ("-5", 1.0), (None, 1.0)],
)
def test_any_receive_count_backs_off_within_the_maximum(
    memory: MemorySQS, clock: FakeClock, count: str | None, shortest: float
) -> None:
    """A count past 1024 backs off by the longest backoff (900 s, jittered to no less than
    half); one that is no number, or no text (a JSON null from an endpoint), reads as 1
    (the first backoff, 1-2 s)."""
    attempts: list[int] = []
    delays: list[float] = []

    class Returns(Observer):
        def returned(self, messages: Sequence[Message], delay: float, reason: str) -> None:
            delays.append(delay)

    def handler(message: Message) -> None:
        if message.body == "hostile":
            attempts.append(message.receive_count)
            raise RuntimeError("fails")

    rig = Rig(memory, clock, handler, dead_letter=False, observers=[Returns()])
    rig.worker._transport = Reporting(memory.transport("jobs"), {"hostile": count})  # type: ignore[assignment]
    rig.send("hostile", *[f"m{i}" for i in range(10)])
    rig.worker.start()
    rig.wait_for("succeeded", 10)
    rig.wait_for("failed", 1)
    wait_until(lambda: len(delays) == 1, what="the failed message returned")
    assert shortest <= delays[0] <= 900.0
    assert_alive(rig)
    assert rig.count("worker_errors") == 0
    rig.advance_until(lambda: len(attempts) >= 2, step=100, limit=20)  # and it comes back
    assert_alive(rig)
    assert rig.stop() == 0


def test_the_backoff_is_bounded_for_any_count() -> None:
    backoff = Backoff(2.0, 900.0)
    for count in (1, 2, 11, 1024, 1025, 2**31, 10**400, -3):
        assert 0 <= backoff.delay(count) <= 900.0


def test_an_async_handler_backs_off_a_huge_receive_count(
    memory: MemorySQS, clock: FakeClock
) -> None:
    attempts: list[float] = []

    async def handler(message: Message) -> None:
        await asyncio.sleep(0)
        if message.body == "hostile":
            attempts.append(clock.monotonic())
            raise RuntimeError("fails")

    rig = Rig(memory, clock, handler, dead_letter=False)
    rig.worker._transport = Reporting(memory.transport("jobs"), {"hostile": "5000"})  # type: ignore[assignment]
    rig.send("hostile", "ok")
    rig.worker.start()
    rig.wait_for("failed", 1)
    rig.wait_for("succeeded", 1)
    clock.advance(100)
    assert len(attempts) == 1  # backed off, not run again at once
    assert_alive(rig)
    assert rig.stop() == 0


# -- defect 2: a deep body marked offloaded ------------------------------------------------


def test_a_deep_body_marked_offloaded_is_rejected_as_no_pointer() -> None:
    from sqsworker.errors import PayloadMissing

    with pytest.raises(PayloadMissing, match="not an S3 pointer"):
        pointer_of(DEEP, POINTER_SIZE)


@pytest.mark.parametrize("batch", [False, True])
def test_a_deep_body_with_the_pointer_attribute_goes_to_the_dead_letter_queue(
    memory: MemorySQS, clock: FakeClock, batch: bool
) -> None:
    ran: list[str] = []
    if batch:
        from sqsworker import Handler

        handler: Any = Handler(lambda ms: ran.extend(m.body for m in ms), {}, batch=True)
        options: dict[str, Any] = {"batch_size": 5}
    else:
        handler, options = (lambda m: ran.append(m.body)), {}
    rig = Rig(memory, clock, handler, payloads=Payloads(client=object()), **options)
    send_all(rig.queue, [OutgoingMessage(DEEP, POINTER_SIZE)] * 3 + [f"m{i}" for i in range(5)])
    rig.worker.start()
    rig.wait_for("succeeded", 5)
    rig.wait_for("rejected", 3)
    assert sorted(ran) == [f"m{i}" for i in range(5)]
    assert rig.dlq is not None
    dead = rig.dlq.receive(10, 0, 30)
    assert len(dead) == 3
    assert all(
        "not an S3 pointer" in m.message_attributes["sqsworker-error"]["StringValue"] for m in dead
    )
    assert_alive(rig)
    assert rig.stop() == 0


# -- defect 3: a deep body and a JSON idempotency key --------------------------------------


def test_a_deep_body_with_a_json_key_is_rejected_not_a_dead_thread(
    memory: MemorySQS, clock: FakeClock
) -> None:
    ran: list[str] = []
    rig = Rig(
        memory,
        clock,
        lambda m: ran.append(m.body),
        store=MemoryStore(),
        concurrency=1,
        idempotency_key="json:order.id",
    )
    rig.send(DEEP, DEEP, '{"order": {"id": 1}}', '{"order": {"id": 2}}')
    rig.worker.start()
    rig.wait_for("succeeded", 2)
    rig.wait_for("rejected", 2)
    assert len(ran) == 2
    assert rig.dlq is not None
    dead = rig.dlq.receive(10, 0, 30)
    assert {m.body for m in dead} == {DEEP}
    assert "nests JSON too deep" in dead[0].message_attributes["sqsworker-error"]["StringValue"]
    assert_alive(rig)
    assert rig.stop() == 0


def test_a_key_function_of_ours_that_breaks_is_a_rejection(
    memory: MemorySQS, clock: FakeClock
) -> None:
    """Whatever a key policy raises (here a policy object of the user's that is not a
    key function at all) is an IdempotencyKeyError."""

    class Broken:
        def __call__(self, message: Message) -> str:
            raise RecursionError("deep")

    rig = Rig(memory, clock, lambda m: None, store=MemoryStore(), idempotency_key=Broken())
    rig.send("a", "b")
    rig.worker.start()
    rig.wait_for("rejected", 2)
    assert_alive(rig)
    assert rig.stop() == 0


# -- containment: a step of ours that raises -----------------------------------------------


def test_a_step_of_the_worker_that_raises_is_the_messages_failure(
    memory: MemorySQS, clock: FakeClock
) -> None:
    """A bug in a step around the handler (here the S3 fetch raising what it never
    should): the message is returned after its backoff, counted, logged; the thread
    lives and the other messages run."""

    class Buggy(Payloads):
        def fetch(self, pointer: Any) -> str:
            raise ZeroDivisionError("a bug of ours")

    pointer = json.dumps(
        ["software.amazon.payloadoffloading.PayloadS3Pointer", {"s3BucketName": "b", "s3Key": "k"}]
    )
    ran: list[str] = []
    rig = Rig(memory, clock, lambda m: ran.append(m.body), payloads=Buggy(), concurrency=1)
    send_all(rig.queue, [OutgoingMessage(pointer, POINTER_SIZE)] + [f"m{i}" for i in range(4)])
    rig.worker.start()
    rig.wait_for("deleted", 4)
    rig.wait_for("worker_errors", 1)
    assert_alive(rig)
    wait_until(lambda: rig.queue.counts().total == 1, what="only the pointer's message left")
    assert sorted(ran) == [f"m{i}" for i in range(4)]
    assert rig.stop() == 0


def test_a_backoff_that_raises_returns_the_message_after_the_longest_backoff(
    memory: MemorySQS, clock: FakeClock
) -> None:
    returned: list[float] = []

    class Seen(Observer):
        def returned(self, messages: Sequence[Message], delay: float, reason: str) -> None:
            returned.append(delay)

    class Broken(Backoff):
        def delay(self, receive_count: int) -> float:
            raise OverflowError("a user's backoff policy")

    def fail(message: Message) -> None:
        raise RuntimeError("fails")

    rig = Rig(memory, clock, fail, observers=[Seen()], backoff_max=120)
    rig.worker.backoff = Broken()
    rig.send("x")
    rig.worker.start()
    rig.wait_for("worker_errors", 1)
    wait_until(lambda: returned == [120], what="returned after --backoff-max")
    assert_alive(rig)
    assert rig.stop() == 0


# -- defect 4: a rejected message at the size limit ----------------------------------------


def test_a_rejected_message_at_the_size_limit_is_copied_with_its_notes_cut(
    memory: MemorySQS, clock: FakeClock
) -> None:
    runs: list[str] = []

    def refuse(message: Message) -> None:
        runs.append(message.message_id)
        raise Reject("x" * 5000)

    rig = Rig(memory, clock, refuse, queue_attributes={"MaximumMessageSize": "8192"})
    body = "b" * (8192 - 120)  # room for the source id's note, not for the whole error
    rig.send(body)
    rig.worker.start()
    rig.wait_for("rejected", 1)
    rig.wait_for("deleted", 1)
    assert len(runs) == 1
    assert rig.dlq is not None
    (copy,) = rig.dlq.receive(10, 0, 30)
    assert copy.body == body
    assert copy.message_attributes["sqsworker-source-message-id"]["StringValue"] == runs[0]
    assert OutgoingMessage(copy.body, copy.message_attributes).size <= 8192
    assert rig.stop() == 0


def test_a_message_no_copy_of_which_fits_is_left_to_sqs_redrive_unrun(
    memory: MemorySQS, clock: FakeClock
) -> None:
    """The dead-letter queue takes less than the source queue: the copy is refused, the
    handler is not run again, and SQS's own redrive moves the message."""
    runs: list[str] = []

    def refuse(message: Message) -> None:
        runs.append(message.body)
        if message.body != "ok":
            raise Reject("never")

    rig = Rig(memory, clock, refuse)
    memory.create_queue("jobs-dlq", {"MaximumMessageSize": "1024"})  # replaced: smaller
    rig.dlq = memory.transport("jobs-dlq")
    rig.send("z" * 2000, "ok")
    rig.worker.start()
    rig.advance_until(lambda: memory.counts("jobs-dlq").total == 1)
    assert runs.count("z" * 2000) == 1
    assert rig.queue.counts().total == 0
    assert_alive(rig)
    assert rig.stop() == 0


def test_an_error_text_with_characters_sqs_refuses_is_copied(
    memory: MemorySQS, clock: FakeClock
) -> None:
    def refuse(message: Message) -> None:
        raise Reject("bad \x00\x07 \ud800 text")

    rig = Rig(memory, clock, refuse)
    rig.send("x")
    rig.worker.start()
    rig.wait_for("deleted", 1)
    assert rig.dlq is not None
    (copy,) = rig.dlq.receive(10, 0, 30)
    note = copy.message_attributes["sqsworker-error"]["StringValue"]
    assert note.startswith("Reject: bad ") and "\x00" not in note
    assert rig.stop() == 0


# -- defect 5: duplicates of a busy key ----------------------------------------------------


def test_duplicates_of_a_busy_key_do_not_starve_other_messages(
    memory: MemorySQS, clock: FakeClock
) -> None:
    """Thirty copies of a message whose first delivery runs long, then twenty others: at
    concurrency 2, the others all run while the first still does."""
    gate = Gate()
    ran: list[str] = []

    def handler(message: Message) -> None:
        if message.body == "long":
            gate(message)
        ran.append(message.body)

    rig = Rig(
        memory,
        clock,
        handler,
        store=MemoryStore(),
        concurrency=2,
        visibility_timeout=60,
        idempotency_key="attribute:key",
    )

    send_all(rig.queue, [keyed("long", "k")])
    rig.worker.start()
    assert gate.started.wait(10)
    send_all(rig.queue, [keyed("long", "k")] * 30 + [keyed(f"m{i}", f"m{i}") for i in range(20)])
    rig.advance_until(lambda: len(ran) == 20, step=0.5, limit=80)
    assert sorted(ran) == sorted(f"m{i}" for i in range(20))  # while the first one ran
    assert rig.count("duplicates_deferred") >= 30
    assert rig.worker.keeper is not None
    assert rig.worker.keeper.held_count() <= rig.worker.held_bound
    gate.release.set()
    rig.advance_until(lambda: rig.queue.counts().total == 0, step=5)
    assert ran.count("long") == 1
    assert rig.count("duplicates_suppressed") == 30
    assert rig.dlq is not None and rig.dlq.counts().total == 0  # no healthy duplicate dead
    assert rig.stop() == 0


# -- defect 6 and 7: offloaded bodies after a lost lease, and at shutdown ------------------


def test_a_body_deleted_after_its_lease_was_lost_is_forgotten_and_kept_in_s3() -> None:
    removed: list[Any] = []

    class Store(Payloads):
        def remove_later(self, pointers: Any) -> None:
            removed.extend(pointers)

    remover = RemoveAfterDelete(Store())
    pointer = json.dumps(
        ["software.amazon.payloadoffloading.PayloadS3Pointer", {"s3BucketName": "b", "s3Key": "k"}]
    )
    message = Message(Envelope("m-1", "h-1", pointer, {}, POINTER_SIZE))
    remover.expect(message)
    assert remover.pending == 1
    remover.deleted_after_lease_lost(message)
    assert remover.pending == 0
    remover.deleted([message])
    assert removed == []  # whoever holds the redelivery needs the body


def test_removals_at_shutdown_end_by_the_deadline(caplog: pytest.LogCaptureFixture) -> None:
    unblock = threading.Event()
    calls: list[int] = []

    class Unreachable:
        def delete_objects(self, **kwargs: Any) -> dict[str, Any]:
            calls.append(1)
            unblock.wait(60)  # S3 that never answers
            return {}

    from sqsworker.payloads import Pointer

    payloads = Payloads(client=Unreachable())
    payloads.remove_later([Pointer("b", f"k{i}") for i in range(3)])
    payloads.remove_later([Pointer("c", "k")])
    wait_until(lambda: calls == [1], what="the first removal under way")
    closed = threading.Thread(target=payloads.close, kwargs={"timeout": 0.1})
    with caplog.at_level(logging.WARNING):
        closed.start()
        closed.join(10)
    assert not closed.is_alive()  # while S3 still does not answer
    assert calls == [1]  # the queued ones were dropped, not sent
    unblock.set()


# -- defect 8 and 9: SQS away ----------------------------------------------------------------


def test_health_says_how_long_sqs_has_not_answered_and_stays_ready(
    memory: MemorySQS, clock: FakeClock
) -> None:
    from sqsworker.errors import TransportError

    rig = Rig(memory, clock, lambda m: None)
    rig.worker.start()
    rig.advance_until(lambda: rig.count("empty_receives") >= 1)
    assert rig.worker.health().as_dict()["sqs"] == "ok"
    memory.inject_fault(
        "ReceiveMessage",
        TransportError("ReceiveMessage failed: ServiceUnavailable", code="ServiceUnavailable"),
        times=1000,
    )
    rig.advance_until(lambda: rig.worker.sqs_unanswered()[0] >= 25)
    health = rig.worker.health()
    assert health.live and health.ready
    assert health.as_dict()["sqs"].startswith("not answering for ")
    assert "ServiceUnavailable" in health.as_dict()["sqs"]
    memory.clear_faults()
    rig.advance_until(lambda: rig.worker.health().as_dict()["sqs"] == "ok", step=5)
    assert rig.stop() == 0


def test_a_receive_failing_on_a_defect_without_words_is_named_by_its_type(
    memory: MemorySQS, clock: FakeClock
) -> None:
    # an AssertionError() of the client's (on an event loop it did not expect) was logged
    # as `receive failed; retrying error=''`
    rig = Rig(memory, clock, lambda m: None)
    memory.inject_fault("ReceiveMessage", AssertionError(), times=1000)
    rig.worker.start()
    rig.advance_until(lambda: rig.worker.sqs_unanswered()[0] >= 25)
    assert rig.worker.sqs_unanswered()[1] == "AssertionError"
    assert rig.worker.health().as_dict()["sqs"].endswith("AssertionError")
    memory.clear_faults()
    rig.advance_until(lambda: rig.worker.health().as_dict()["sqs"] == "ok", step=5)
    assert rig.stop() == 0


def test_a_handled_message_whose_delete_never_went_is_counted_not_deleted(
    memory: MemorySQS, clock: FakeClock
) -> None:
    from sqsworker.errors import TransportError

    rig = Rig(memory, clock, lambda m: None, visibility_timeout=10)
    memory.inject_fault(
        "DeleteMessageBatch",
        TransportError("DeleteMessageBatch failed: ServiceUnavailable", retryable=True),
        times=1000,
    )
    memory.inject_fault(
        "ChangeMessageVisibilityBatch",
        TransportError("ChangeMessageVisibilityBatch failed", retryable=True),
        times=1000,
    )
    rig.send("x")
    rig.worker.start()
    rig.wait_for("succeeded", 1)
    rig.advance_until(lambda: rig.count("not_deleted") == 1)
    memory.clear_faults()
    assert rig.count("deleted") == 0
    rig.stop_past_timeout()
    assert rig.count("not_deleted") == 1


@pytest.mark.parametrize("sent", ["", "soon", "9" * 30, "-1" * 5, "1" * 5000])
def test_an_absurd_sent_timestamp_reads_as_none_and_breaks_no_metric(
    sent: str, memory: MemorySQS, clock: FakeClock
) -> None:
    from sqsworker.metrics import Metrics

    message = Message(Envelope("m-1", "h-1", "{}", {"SentTimestamp": sent}))
    assert message.sent_at is None
    metrics = Metrics("jobs", "tests.handler", clock=clock)
    metrics.handler_started(message)  # raises nothing, observes no age
    age = metrics.registry.get_sample_value(
        "sqsworker_message_age_seconds_count", {"queue": "jobs", "handler": "tests.handler"}
    )
    assert not age
    metrics.handler_started(Message(Envelope("m-2", "h-2", "{}", {"SentTimestamp": "1000"})))
    assert (
        metrics.registry.get_sample_value(
            "sqsworker_message_age_seconds_count", {"queue": "jobs", "handler": "tests.handler"}
        )
        == 1
    )  # a timestamp that is one is observed
