"""``format("sqs")`` in a real local SparkSession against moto's server."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession

from spark_sink import read_output, write_once
from sqsworker.local import LocalSQS
from sqsworker.transports import Transport, send_all

from .conftest import files, make_queue

pytestmark = pytest.mark.spark


def run(
    spark: SparkSession,
    queue: Transport,
    tmp_path: Path,
    sink: Callable[[DataFrame, int], None],
    **options: str,
) -> None:
    """One AvailableNow run of the query; raises what the query raised."""
    stream = (
        spark.readStream.format("sqs")
        .option("queue", queue.info.url)
        .option("walPath", str(tmp_path / "wal"))
        .option("waitTimeSeconds", "0")
        .options(**options)
        .load()
    )
    query = (
        stream.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(180)
    finally:
        query.stop()


def output_ids(spark: SparkSession, path: Path) -> list[str]:
    output = read_output(spark, str(path))
    return [] if output is None else [r.message_id for r in output.select("message_id").collect()]


def test_every_message_is_written_once_and_deleted(
    spark: SparkSession, aws: LocalSQS, tmp_path: Path
) -> None:
    queue = make_queue(aws, "orders")
    # Three batches; 1,000 messages took close to the 120 s test limit on moto's server.
    sent = send_all(queue, [f'{{"order": {i}}}' for i in range(500)])
    run(spark, queue, tmp_path, write_once(str(tmp_path / "out")), maxMessagesPerBatch="200")
    ids = output_ids(spark, tmp_path / "out")
    assert len(ids) == 500 and set(ids) == set(sent)
    assert queue.counts().total == 0  # every message deleted once its batch committed
    assert files(tmp_path / "wal") == []  # and the log of each batch cleaned up


def test_a_failed_query_restarted_from_its_checkpoint_loses_and_repeats_nothing(
    spark: SparkSession, aws: LocalSQS, tmp_path: Path
) -> None:
    queue = make_queue(aws, "orders")
    sent = send_all(queue, [f'{{"order": {i}}}' for i in range(120)])
    write = write_once(str(tmp_path / "out"))
    failures = {1: "after", 2: "before"}  # batch id -> fail after or before writing it

    def flaky(batch: DataFrame, batch_id: int) -> None:
        when = failures.pop(batch_id, None)
        if when == "before":
            raise RuntimeError(f"batch {batch_id} fails before it is written")
        write(batch, batch_id)
        if when == "after":
            raise RuntimeError(f"batch {batch_id} fails after it was written")

    options = {"maxMessagesPerBatch": "30", "visibilityTimeout": "3"}
    for _ in range(2):  # each run stops at its failure; the restart replays that batch
        with pytest.raises(StreamingQueryException, match="fails"):
            run(spark, queue, tmp_path, flaky, **options)
    run(spark, queue, tmp_path, flaky, **options)
    ids = output_ids(spark, tmp_path / "out")
    assert sorted(ids) == sorted(sent)  # each once: nothing lost, nothing twice
    assert queue.counts().total == 0


def test_a_batch_slower_than_the_visibility_timeout_keeps_its_messages(
    spark: SparkSession, aws: LocalSQS, tmp_path: Path
) -> None:
    queue = make_queue(aws, "orders")
    send_all(queue, [f'{{"order": {i}}}' for i in range(20)])
    other = queue.open(queue.info.url)
    stolen: list[str] = []
    checks: list[int] = []

    def slow(batch: DataFrame, batch_id: int) -> None:
        count = batch.count()
        tick = threading.Event()
        for _ in range(6):  # 6 s: three times the 2 s visibility timeout
            tick.wait(1)
            stolen.extend(m.body for m in other.receive(10, 0, 30))
            checks.append(count)
        write_once(str(tmp_path / "out"))(batch, batch_id)

    run(spark, queue, tmp_path, slow, visibilityTimeout="2")
    assert checks and stolen == []  # another consumer saw nothing while the batch ran
    assert len(output_ids(spark, tmp_path / "out")) == 20
    assert queue.counts().total == 0


@pytest.mark.parametrize(
    ("options", "sentence"),
    [
        ({"walPath": "/tmp/w"}, "the sqs option 'queue' is missing"),
        ({"queue": "QUEUE"}, "the sqs option 'walPath' is missing"),
        ({"queue": "no-such-queue", "walPath": "/tmp/w"}, "queue 'no-such-queue' does not exist"),
        (
            {"queue": "QUEUE", "walPath": "/tmp/w", "visibilityTimeout": "50000"},
            "'visibilityTimeout' must be from 1 to 43200; got 50000",
        ),
    ],
)
def test_bad_options_stop_the_query_at_start_with_one_sentence(
    spark: SparkSession, aws: LocalSQS, tmp_path: Path, options: dict[str, Any], sentence: str
) -> None:
    queue = make_queue(aws, "orders")
    given = {k: (queue.info.url if v == "QUEUE" else v) for k, v in options.items()}
    with pytest.raises(Exception, match=r"sqs option|does not exist") as raised:
        stream = spark.readStream.format("sqs").options(**given).load()
        query = (
            stream.writeStream.format("noop")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(60)
    assert sentence in str(raised.value)
