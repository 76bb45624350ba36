"""Sending from Python against a real HTTP SQS endpoint (moto's server): the Producer,
``handler.send``, and what SQS refuses, through the fault proxy where SQS fails entries."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Iterator

import boto3
import pydantic
import pytest

import sqsworker
from sqsworker import ConfigError, Producer, SendError
from sqsworker.errors import StartupError
from sqsworker.local import LocalSQS
from sqsworker.payloads import SIZE_ATTRIBUTE, Payloads, pointer_of
from sqsworker.transports import Transport
from sqsworker.transports.sqs import SQSTransport

from ..conftest import unique
from ..faults.proxy import FaultProxy

pytestmark = pytest.mark.integration


def queue(server: LocalSQS, name: str, **attributes: str) -> str:
    made = unique(name.removesuffix(".fifo")) + (".fifo" if name.endswith(".fifo") else "")
    server.create_queue(made, max_receive_count=None, **attributes)
    return made


def drain(transport: Transport) -> list[str]:
    bodies = []
    while batch := transport.receive(10, 0, 30):
        bodies += [m.body for m in batch]
        transport.delete_batch([(str(i), m.receipt_handle) for i, m in enumerate(batch)])
    return bodies


@pytest.fixture
def producer(local_env: LocalSQS) -> Iterator[Producer]:
    made = Producer(queue(local_env, "orders"))
    yield made
    made.close()


def test_a_thousand_bodies_go_in_at_most_110_batch_calls(producer: Producer) -> None:
    report = producer.send_many({"order": i} for i in range(1000))
    assert len(report.message_ids) == len(set(report.message_ids)) == 1000
    calls = producer.transport.requests["SendMessageBatch"]  # type: ignore[attr-defined]
    assert calls == report.requests <= 110
    received = drain(producer.transport)
    assert sorted(json.loads(b)["order"] for b in received) == list(range(1000))


@dataclasses.dataclass
class Order:
    id: int
    lines: list[str]


class Payment(pydantic.BaseModel):
    id: str
    cents: int


def test_text_json_dataclasses_and_models_are_sent_as_their_json(producer: Producer) -> None:
    producer.send("plain text")
    producer.send({"a": 1})
    producer.send(Order(7, ["book"]))
    producer.send(Payment(id="p-1", cents=500), attributes={"tenant": "t1", "tries": 2})
    received = drain(producer.transport)
    assert sorted(received) == sorted(
        ["plain text", '{"a": 1}', '{"id": 7, "lines": ["book"]}', '{"id":"p-1","cents":500}']
    )


def test_a_fifo_queue_needs_a_group_and_derives_the_deduplication_id(
    local_env: LocalSQS,
) -> None:
    with Producer(queue(local_env, "payments.fifo", FifoQueue="true")) as fifo:
        with pytest.raises(ConfigError, match="FIFO queue: give each message a group_id"):
            fifo.send({"n": 1})
        fifo.send_many(({"n": n} for n in range(5)), group_id="customer-1")
        fifo.send({"n": 0}, group_id="customer-1")  # the same body again: dropped by SQS
        assert [json.loads(b)["n"] for b in drain(fifo.transport)] == [0, 1, 2, 3, 4]


def test_an_oversized_body_goes_to_s3_with_a_bucket_and_is_refused_without(
    local_env: LocalSQS,
) -> None:
    name = queue(local_env, "videos", MaximumMessageSize="1024")
    body = {"frames": "f" * 5000}
    with (
        Producer(name) as plain,
        pytest.raises(ConfigError, match="give the Producer a payload_bucket"),
    ):
        plain.send(body)
    bucket = unique("bodies")
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=bucket)
    with Producer(name, payload_bucket=bucket) as offloading:
        report = offloading.send_many([body, {"small": 1}])
        assert report.offloaded == 1
        received = offloading.transport.receive(10, 0, 30)
    big = next(m for m in received if SIZE_ATTRIBUTE in m.message_attributes)
    pointer = pointer_of(big.body, big.message_attributes)
    assert pointer is not None and pointer.bucket == bucket
    fetched = Payloads(bucket=bucket, client=s3).fetch(pointer)
    assert json.loads(fetched) == body  # what a worker's message.body would be
    s3.close()


def test_entries_sqs_fails_are_sent_again_and_those_it_refuses_are_named(
    local_env: LocalSQS,
) -> None:
    proxy = FaultProxy(local_env.endpoint_url, seed=3).start()
    try:
        name = queue(local_env, "flaky")
        proxy.set(fail_entries=0.3, refuse="\x01")
        with Producer(name, endpoint_url=proxy.url) as producer:
            report = producer.send_many(f"m{i}" for i in range(40))
            assert report.sent == 40 and proxy.injected["failed entry"] > 0
            assert report.requests > 4  # the failed entries went again
            with pytest.raises(SendError) as refused:
                producer.send_many(["ok 1", "bad \x01", "ok 2"])
        assert [(i, code) for i, code, _ in refused.value.failed] == [(1, "InvalidMessageContents")]
        assert "message 1 (InvalidMessageContents" in str(refused.value)
        assert refused.value.message_ids[1] is None and refused.value.message_ids[0]
        transport = SQSTransport.connect(name, endpoint_url=local_env.endpoint_url)
        bodies = drain(transport)
        transport.close()
        assert sorted(bodies) == sorted([f"m{i}" for i in range(40)] + ["ok 1", "ok 2"])
    finally:
        proxy.stop()


def test_a_send_whose_answer_names_no_entry_is_an_error_never_a_silent_loss(
    local_env: LocalSQS,
) -> None:
    """An endpoint answering 200 without naming the entries (a broken proxy's ``{}``):
    each is sent again, then named as not sent; none is taken as sent."""
    proxy = FaultProxy(local_env.endpoint_url, seed=3).start()
    try:
        name = queue(local_env, "unanswered")
        with Producer(name, endpoint_url=proxy.url) as producer:
            producer.send("first")  # through to moto: the queue's URL looked up
            proxy.set(empty=1.0)
            with pytest.raises(SendError) as unsent:
                producer.send_many(["one", "two"])
            with pytest.raises(StartupError, match="GetQueueUrl was answered without QueueUrl"):
                SQSTransport.connect(name, endpoint_url=proxy.url)
        assert [(i, code) for i, code, _ in unsent.value.failed] == [
            (0, "EntryNotAnswered"),
            (1, "EntryNotAnswered"),
        ]
        assert unsent.value.message_ids == [None, None]
        assert unsent.value.unconfirmed == {0, 1}  # maybe sent: said so
        assert "were not sent, or not confirmed sent, to" in str(unsent.value)
        assert proxy.injected["empty"] > 1  # sent again before it gave up
    finally:
        proxy.stop()


def test_a_send_answered_with_ids_it_never_made_names_only_its_own_messages(
    local_env: LocalSQS,
) -> None:
    """An answer naming an entry the batch never had, and its first entry both sent and
    failed (a broken proxy's or a stub's): the producer raised IndexError from indexing
    its batch by the stranger's id. Now the stranger is not read, and the first message,
    maybe sent, is sent again until the producer gives up and names it; none is taken
    as sent on an answer that does not say so."""
    proxy = FaultProxy(local_env.endpoint_url, seed=3).start()
    try:
        name = queue(local_env, "odd")
        with Producer(name, endpoint_url=proxy.url) as producer:
            proxy.set(odd=True)
            with pytest.raises(SendError) as unsent:
                producer.send_many(["one", "two"])
        assert [(i, code) for i, code, _ in unsent.value.failed] == [(0, "EntryNotAnswered")]
        first, second = unsent.value.message_ids
        assert first is None and second is not None
        assert proxy.injected["odd"] > 1  # sent again before it gave up
    finally:
        proxy.stop()


def test_a_handler_sends_to_its_own_queue(local_env: LocalSQS) -> None:
    name = queue(local_env, "emails")

    @sqsworker.handler(queue=name)
    def email(message: sqsworker.Message) -> None: ...

    message_id = email.send({"to": "a@example.com"})
    email.send_many([{"to": "b@example.com"}, {"to": "c@example.com"}])
    received = email.producer.transport.receive(10, 0, 30)
    assert message_id in {m.message_id for m in received}
    assert sorted(json.loads(m.body)["to"][0] for m in received) == ["a", "b", "c"]
    email.producer.close()

    @sqsworker.handler()
    def nowhere(message: sqsworker.Message) -> None: ...

    with pytest.raises(ConfigError, match="names no queue"):
        nowhere.send("x")


def test_the_async_producer_sends_from_a_coroutine(local_env: LocalSQS) -> None:
    name = queue(local_env, "async")

    async def main() -> list[str]:
        async with sqsworker.AsyncProducer(name) as producer:
            first = await producer.send("one")
            report = await producer.send_many(["two", "three"])
            return [first, *report.message_ids]

    ids = asyncio.run(main())
    transport = SQSTransport.connect(name)
    received = transport.receive(10, 0, 30)
    transport.close()
    assert sorted(m.message_id for m in received) == sorted(ids)
