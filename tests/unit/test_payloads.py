"""Bodies offloaded to S3, in the extended clients' format: read by the worker before the
handler runs, written by senders. S3 is moto's model of it, in this process."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from sqsworker import Message, Reject
from sqsworker.clock import FakeClock
from sqsworker.errors import ConfigError, PayloadMissing
from sqsworker.payloads import (
    LEGACY_POINTER_CLASS,
    LEGACY_SIZE_ATTRIBUTE,
    POINTER_CLASS,
    SIZE_ATTRIBUTE,
    Payloads,
    Pointer,
    pointer_of,
)
from sqsworker.transports import Envelope, OutgoingMessage, send_all
from sqsworker.transports.memory import MemorySQS

from ..conftest import wait_until
from .helpers import Rig

BUCKET = "big-bodies"
REGION = "us-east-1"


@pytest.fixture
def s3() -> Iterator[Any]:
    with mock_aws():
        client = boto3.client("s3", region_name=REGION)
        client.create_bucket(Bucket=BUCKET)
        yield client


def objects(s3: Any) -> list[str]:
    return [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])]


def offloaded(s3: Any, body: str, **attributes: str) -> OutgoingMessage:
    """``body`` put in S3 and the message a pointer to it, as ``sqsworker send`` does it."""
    extra = {k: {"DataType": "String", "StringValue": v} for k, v in attributes.items()}
    return Payloads(bucket=BUCKET, client=s3).offload(OutgoingMessage(body, extra), 0)


def size_attribute(n: int, name: str = SIZE_ATTRIBUTE) -> dict[str, Any]:
    return {name: {"DataType": "Number", "StringValue": str(n)}}


# -- the wire format ---------------------------------------------------------------------


def test_a_pointer_is_read_in_the_current_and_the_legacy_format() -> None:
    current = json.dumps([POINTER_CLASS, {"s3BucketName": "b1", "s3Key": "k1"}])
    legacy = json.dumps([LEGACY_POINTER_CLASS, {"s3BucketName": "b2", "s3Key": "k2"}])
    assert pointer_of(current, size_attribute(5)) == Pointer("b1", "k1")
    assert pointer_of(legacy, size_attribute(5, LEGACY_SIZE_ATTRIBUTE)) == Pointer("b2", "k2")
    # Without the size attribute a body that looks like a pointer is just a body.
    assert pointer_of(current, {}) is None


@pytest.mark.parametrize(
    "body",
    [
        "not json",
        json.dumps(["some.other.Class", {"s3BucketName": "b", "s3Key": "k"}]),
        json.dumps([POINTER_CLASS, {"s3BucketName": "b"}]),
        json.dumps([POINTER_CLASS, {"s3BucketName": "", "s3Key": "k"}]),
        json.dumps({"s3BucketName": "b", "s3Key": "k"}),
    ],
)
def test_a_message_marked_offloaded_without_a_pointer_is_rejected(body: str) -> None:
    with pytest.raises(PayloadMissing, match="is not an S3 pointer"):
        pointer_of(body, size_attribute(5))
    assert issubclass(PayloadMissing, Reject)  # to the dead-letter queue, not retried


def test_offloading_writes_the_extended_clients_format(s3: Any) -> None:
    payloads = Payloads(bucket=BUCKET, client=s3)
    small = OutgoingMessage("x" * 100)
    assert payloads.offload(small, 100) is small  # at the threshold: sent as it is
    big = payloads.offload(OutgoingMessage("é" * 100), 100)  # 200 bytes of UTF-8
    kind, place = json.loads(big.body)
    assert kind == POINTER_CLASS and place["s3BucketName"] == BUCKET
    assert big.message_attributes[SIZE_ATTRIBUTE] == {"DataType": "Number", "StringValue": "200"}
    stored = s3.get_object(Bucket=BUCKET, Key=place["s3Key"])["Body"].read().decode()
    assert stored == "é" * 100
    # A sender's own key, as the extended clients take it from the S3Key attribute.
    keyed = offloaded(s3, "y" * 10, S3Key="orders/42")
    assert json.loads(keyed.body)[1]["s3Key"] == "orders/42"


def test_a_message_that_cannot_carry_a_pointer_is_refused_before_anything_is_stored(
    s3: Any,
) -> None:
    payloads = Payloads(bucket=BUCKET, client=s3)
    full = {f"a{i}": {"DataType": "String", "StringValue": "v"} for i in range(10)}
    with pytest.raises(ConfigError, match=r"has 10 attributes.*at most 9"):
        payloads.offload(OutgoingMessage("x" * 10, full), 0)
    with pytest.raises(ConfigError, match="already offloaded"):
        payloads.offload(OutgoingMessage("x" * 10, size_attribute(10)), 0)
    with pytest.raises(ConfigError, match="needs a bucket"):
        Payloads(client=s3).offload(OutgoingMessage("x" * 10), 0)
    assert objects(s3) == []


def test_a_message_fetches_its_body_once_and_keeps_the_pointer(s3: Any) -> None:
    sent = offloaded(s3, '{"frames": 9000}')
    message = Message(Envelope("m-1", "rh-1", sent.body, {}, sent.message_attributes))
    assert message.offloaded_to is not None and message.body == sent.body
    message.fetch_body(Payloads(client=s3))
    assert message.json() == {"frames": 9000}
    assert message.sent_body == sent.body  # what a dead-letter copy carries on


def test_a_fetch_tells_a_gone_object_from_a_bucket_it_may_not_read(s3: Any) -> None:
    with pytest.raises(PayloadMissing, match="gone from S3 \\(NoSuchKey\\)"):
        Payloads(client=s3).fetch(Pointer(BUCKET, "never-written"))
    with pytest.raises(PayloadMissing, match="reads offloaded bodies from 'big-bodies' only"):
        Payloads(bucket=BUCKET, client=s3).fetch(Pointer("someone-elses", "k"))


# -- the worker ------------------------------------------------------------------------------


def payload_rig(memory: MemorySQS, clock: FakeClock, s3: Any, handler: Any, **options: Any) -> Rig:
    return Rig(memory, clock, handler, payloads=Payloads(bucket=BUCKET, client=s3), **options)


def test_the_handler_gets_the_offloaded_body_and_the_object_is_left(
    memory: MemorySQS, clock: FakeClock, s3: Any
) -> None:
    seen: list[str] = []
    rig = payload_rig(memory, clock, s3, lambda m: seen.append(m.body))
    body = json.dumps({"video": "v" * 300_000})
    send_all(rig.queue, [offloaded(s3, body)])
    rig.worker.start()
    rig.wait_for("deleted", 1)
    assert rig.stop() == 0
    assert seen == [body]
    assert rig.queue.counts().total == 0
    assert len(objects(s3)) == 1  # left by default: another subscriber may need it


def test_delete_payloads_removes_the_object_once_its_message_is_deleted(
    memory: MemorySQS, clock: FakeClock, s3: Any
) -> None:
    rig = payload_rig(memory, clock, s3, lambda m: None, delete_payloads=True)
    send_all(rig.queue, [offloaded(s3, "a" * 50), offloaded(s3, "b" * 50)])
    rig.worker.start()
    rig.wait_for("deleted", 2)
    wait_until(lambda: objects(s3) == [], what="the objects removed")
    assert rig.stop() == 0


def test_a_missing_object_goes_to_the_dead_letter_queue_unrun_with_its_pointer(
    memory: MemorySQS, clock: FakeClock, s3: Any
) -> None:
    ran = threading.Event()
    rig = payload_rig(memory, clock, s3, lambda m: ran.set(), delete_payloads=True)
    message = offloaded(s3, "c" * 50)
    s3.delete_object(Bucket=BUCKET, Key=json.loads(message.body)[1]["s3Key"])
    kept = offloaded(s3, "d" * 50)
    send_all(rig.queue, [message])
    rig.worker.start()
    rig.wait_for("rejected", 1)
    rig.wait_for("deleted", 1)
    assert rig.stop() == 0
    assert not ran.is_set()
    assert rig.dlq is not None
    (copy,) = rig.dlq.receive(10, 0, 30)
    # The copy is the pointer with its size attribute, so a redrive can fetch it again.
    assert copy.body == message.body
    assert copy.message_attributes[SIZE_ATTRIBUTE]["StringValue"] == "50"
    assert "PayloadMissing" in copy.message_attributes["sqsworker-error"]["StringValue"]
    assert json.loads(kept.body)[1]["s3Key"] in objects(s3)  # no other object touched


def test_a_rejected_offloaded_message_keeps_its_object_for_the_dead_letter_copy(
    memory: MemorySQS, clock: FakeClock, s3: Any
) -> None:
    def refuse(message: Message) -> None:
        raise Reject("not a video")

    rig = payload_rig(memory, clock, s3, refuse, delete_payloads=True)
    message = offloaded(s3, "e" * 50)
    send_all(rig.queue, [message])
    rig.worker.start()
    rig.wait_for("rejected", 1)
    rig.wait_for("deleted", 1)
    assert rig.stop() == 0
    assert rig.dlq is not None
    (copy,) = rig.dlq.receive(10, 0, 30)
    assert copy.body == message.body  # the pointer, not the fetched body
    assert len(objects(s3)) == 1


def test_an_unreachable_s3_is_a_failure_retried_after_the_backoff(
    memory: MemorySQS, clock: FakeClock, s3: Any
) -> None:
    from botocore.config import Config

    # Nothing listens on port 9 of this host: every fetch fails to connect.
    dead = boto3.client(
        "s3",
        region_name=REGION,
        endpoint_url="http://127.0.0.1:9",
        config=Config(retries={"total_max_attempts": 1}, connect_timeout=1),
    )
    ran = threading.Event()
    rig = Rig(memory, clock, lambda m: ran.set(), payloads=Payloads(client=dead))
    send_all(rig.queue, [offloaded(s3, "f" * 50)])
    rig.worker.start()
    rig.wait_for("failed", 1)
    assert rig.stop() == 0
    assert not ran.is_set() and rig.count("rejected") == 0
    assert rig.queue.counts().total == 1  # back in the queue after the backoff
    dead.close()


def test_an_idempotency_key_from_the_body_reads_the_offloaded_body(
    memory: MemorySQS, clock: FakeClock, s3: Any
) -> None:
    seen: list[str] = []
    rig = payload_rig(
        memory,
        clock,
        s3,
        lambda m: seen.append(m.idempotency_key),
        idempotency_store="memory://",
        idempotency_key="json:order",
    )
    send_all(rig.queue, [offloaded(s3, json.dumps({"order": "o-7", "pad": "x" * 100}))])
    rig.worker.start()
    rig.wait_for("deleted", 1)
    assert rig.stop() == 0
    assert seen == ["o-7"]


def test_a_fetch_that_outlasts_the_lease_does_not_run_the_handler(
    memory: MemorySQS, clock: FakeClock, s3: Any
) -> None:
    class Slow(Payloads):
        def fetch(self, pointer: Pointer) -> str:
            clock.advance(60)  # S3 took a minute; the lease was 10 s, never renewed meanwhile
            return super().fetch(pointer)

    ran = threading.Event()
    rig = Rig(memory, clock, lambda m: ran.set(), payloads=Slow(client=s3))
    send_all(rig.queue, [offloaded(s3, "g" * 50)])
    rig.worker.start()
    rig.wait_for("skipped", 1)
    assert rig.stop() == 0
    assert not ran.is_set()
