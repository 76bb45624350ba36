"""The documented pipeline (docs/spark.md): dropDuplicatesWithinWatermark(["message_id"])
on received_at, then Spark's file sink, writes a message SQS delivers twice once."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from sqsworker.local import LocalSQS
from sqsworker.transports import Transport, send_all

from ..conftest import wait_until
from ..faults.proxy import FaultProxy, _answer
from .conftest import make_queue

pytestmark = pytest.mark.spark


class RefusingDeletes(FaultProxy):
    """moto's server, but every DeleteMessageBatch answered 503 while ``refusing``."""

    refusing = False
    refused = 0

    def _handle(self, request: BaseHTTPRequestHandler) -> None:
        if self.refusing and request.headers.get("X-Amz-Target", "").endswith(
            ".DeleteMessageBatch"
        ):
            length = int(request.headers.get("Content-Length", 0))
            request.rfile.read(length)
            self.refused += 1
            return _answer(request, 503, "ServiceUnavailable", "Service is unavailable")
        return super()._handle(request)


def documented(spark: SparkSession, queue: Transport, endpoint: str, folder: Path) -> int:
    """One availableNow run of the pipeline; the rows it read."""
    orders = (
        spark.readStream.format("sqs")
        .option("queue", queue.info.url)
        .option("endpointUrl", endpoint)
        .option("walPath", str(folder / "wal"))
        .option("visibilityTimeout", "2")
        .option("waitTimeSeconds", "0")
        .load()
    )
    query = (
        orders.withWatermark("received_at", "1 hour")
        .dropDuplicatesWithinWatermark(["message_id"])
        .writeStream.format("parquet")
        .option("path", str(folder / "out"))
        .option("checkpointLocation", str(folder / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(240)
    finally:
        query.stop()
    return sum(int(p["numInputRows"]) for p in query.recentProgress)


@pytest.mark.timeout(300)  # a first batch with state takes a while on a loaded machine
def test_a_message_delivered_twice_is_written_once(
    spark: SparkSession, aws: LocalSQS, tmp_path: Path
) -> None:
    queue = make_queue(aws, "orders")
    sent = send_all(queue, [f'{{"order": {i}}}' for i in range(40)])
    proxy = RefusingDeletes(aws.endpoint_url).start()
    proxy.refusing = True

    def release() -> None:
        # The first batch is written and committed, but its deletes are refused: once
        # the leases lapsed and SQS shows the messages again, deletes go through.
        wait_until(lambda: proxy.refused > 0, timeout=180, what="a delete refused")
        wait_until(lambda: queue.counts().visible > 0, timeout=180, what="leases lapsed")
        proxy.refusing = False

    releasing = threading.Thread(target=release)
    releasing.start()
    try:
        read = documented(spark, queue, proxy.url, tmp_path)
    finally:
        releasing.join()
        proxy.stop()
    assert read > 40  # some messages were delivered twice, and read twice
    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    assert sorted(row.message_id for row in rows) == sorted(sent)  # each written once
    assert queue.counts().total == 0
