"""``df.writeStream.format("sqs")``: rows to messages, on moto's server."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest
from pyspark.sql import Row, SparkSession

from spark_sink import SQSOptionError, SQSSendError
from spark_sink.options import SinkOptions
from spark_sink.sink import SQSStreamWriter
from sqsworker import Message
from sqsworker.local import LocalSQS
from sqsworker.payloads import SIZE_ATTRIBUTE, Payloads
from sqsworker.transports import Transport

from ..conftest import unique
from .conftest import drain, make_queue

pytestmark = pytest.mark.spark

SCHEMA = "body string, group_id string, idempotency_key string"


def write_rows(
    spark: SparkSession, queue: Transport, rows: list[dict[str, str]], tmp: Path, **options: str
) -> None:
    """Stream ``rows`` (from JSON files) into ``queue`` through the sqs sink."""
    source = tmp / "rows"
    source.mkdir()
    (source / "rows.json").write_text("\n".join(json.dumps(r) for r in rows))
    query = (
        spark.readStream.schema(SCHEMA)
        .json(str(source))
        .writeStream.format("sqs")
        .option("queue", queue.info.url)
        .option("checkpointLocation", str(tmp / "checkpoint"))
        .options(**options)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None


def test_rows_become_messages_with_their_idempotency_keys(
    spark: SparkSession, aws: LocalSQS, tmp_path: Path
) -> None:
    queue = make_queue(aws, "invoices")
    rows = [{"body": f"invoice {i}", "idempotency_key": f"inv-{i}"} for i in range(25)]
    write_rows(spark, queue, rows, tmp_path)
    received = []
    while batch := queue.receive(10, 0, 30):
        received += batch
        queue.delete_batch([(str(i), m.receipt_handle) for i, m in enumerate(batch)])
    assert sorted(m.body for m in received) == sorted(r["body"] for r in rows)
    keys = {m.body: m.message_attributes["idempotency-key"]["StringValue"] for m in received}
    assert keys == {r["body"]: r["idempotency_key"] for r in rows}


def test_a_fifo_queue_gets_each_group_in_order(
    spark: SparkSession, aws: LocalSQS, tmp_path: Path
) -> None:
    queue = make_queue(aws, "invoices.fifo")
    rows = [{"body": f"g{i % 3}-{i}", "group_id": f"g{i % 3}"} for i in range(30)]
    write_rows(spark, queue, rows, tmp_path)
    by_group: dict[str, list[str]] = defaultdict(list)
    for body in drain(queue):
        by_group[body.split("-")[0]].append(body)
    assert by_group == {
        f"g{g}": [r["body"] for r in rows if r["group_id"] == f"g{g}"] for g in range(3)
    }


def test_a_replayed_fifo_batch_is_not_sent_twice(aws: LocalSQS) -> None:
    queue = make_queue(aws, "replay.fifo")
    writer = SQSStreamWriter(SinkOptions(queue.info.url), queue.info, _schema("body", "group_id"))
    rows = [Row(body=f"m{i}", group_id="g") for i in range(12)]
    assert writer.write(iter(rows)).messages == 12
    assert writer.write(iter(rows)).messages == 12  # the same task again, as on a replay
    assert drain(queue) == [f"m{i}" for i in range(12)]  # SQS dropped the second sending


def test_a_standard_queue_keeps_a_rows_group_as_a_fair_queues_tenant(aws: LocalSQS) -> None:
    queue = make_queue(aws, "tenants")
    writer = SQSStreamWriter(SinkOptions(queue.info.url), queue.info, _schema("body", "group_id"))
    assert writer.write(iter([Row(body="a", group_id="tenant-1")])).messages == 1
    [message] = queue.receive(10, 0, 30)
    assert message.attributes["MessageGroupId"] == "tenant-1"
    assert "MessageDeduplicationId" not in message.attributes
    with pytest.raises(SQSSendError, match="has group_id 'ACME Corp', which SQS refuses"):
        writer.write(iter([Row(body="b", group_id="ACME Corp")]))


def test_bodies_over_the_threshold_go_to_s3_as_the_extended_clients_send_them(
    spark: SparkSession, aws: LocalSQS, tmp_path: Path
) -> None:
    import boto3

    bucket = unique("bodies")
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=bucket)
    s3.close()
    queue = make_queue(aws, "frames")
    rows = [{"body": f"{i}" + "f" * (300_000 if i % 2 else 10)} for i in range(6)]
    write_rows(spark, queue, rows, tmp_path, payloadBucket=bucket, payloadThreshold="262144")
    received = []
    while batch := queue.receive(10, 0, 30):
        received += batch
    pointers = [m for m in received if SIZE_ATTRIBUTE in m.message_attributes]
    assert len(pointers) == 3  # the large ones only
    bodies = []
    payloads = Payloads()
    for envelope in received:
        message = Message(envelope)
        message.fetch_body(payloads)
        bodies.append(message.body)
    payloads.close()
    assert sorted(bodies) == sorted(r["body"] for r in rows)


def test_a_sink_without_what_it_needs_says_so(aws: LocalSQS) -> None:
    fifo = make_queue(aws, "orders.fifo")
    with pytest.raises(SQSOptionError, match="needs a string column 'body'"):
        SQSStreamWriter(SinkOptions(fifo.info.url), fifo.info, _schema("text"))
    with pytest.raises(SQSOptionError, match="needs a column 'group_id'"):
        SQSStreamWriter(SinkOptions(fifo.info.url), fifo.info, _schema("body"))
    with pytest.raises(SQSOptionError, match="'payloadThreshold' needs 'payloadBucket'"):
        SinkOptions.parse({"queue": "q", "payloadThreshold": "1000"})
    with pytest.raises(SQSOptionError, match="'payloadBucket' must be an S3 bucket name"):
        SinkOptions.parse({"queue": "q", "payloadBucket": "No Such"})
    too_high = SinkOptions.parse({"queue": "q", "payloadBucket": "b-1", "payloadThreshold": "2000"})
    small = make_queue(aws, "small", MaximumMessageSize="1024")
    with pytest.raises(SQSOptionError, match=r"'payloadThreshold' \(2000\) is more than"):
        SQSStreamWriter(too_high, small.info, _schema("body"))


def _schema(*names: str):  # type: ignore[no-untyped-def]
    from pyspark.sql.types import StringType, StructField, StructType

    return StructType([StructField(n, StringType()) for n in names])


def test_a_task_sends_its_rows_in_a_producer_span_whose_context_they_carry(
    aws: LocalSQS, monkeypatch: pytest.MonkeyPatch
) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from sqsworker import tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_tracer", provider.get_tracer("test"))
    monkeypatch.setattr(tracing, "_configured", True)
    queue = make_queue(aws, "traced")
    writer = SQSStreamWriter(SinkOptions(queue.info.url), queue.info, _schema("body"))
    assert writer.write(iter([Row(body="a"), Row(body="b")])).messages == 2
    (span,) = exporter.get_finished_spans()
    assert span.name == f"send {queue.info.name}"
    received = queue.receive(10, 0, 30)
    parents = {m.message_attributes["traceparent"]["StringValue"][:52] for m in received}
    assert parents == {f"00-{span.context.trace_id:032x}-{span.context.span_id:016x}"}
    provider.shutdown()
