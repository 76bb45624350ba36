"""The documented pipeline (docs/spark.md): dropDuplicatesWithinWatermark(["message_id"])
on received_at, then Spark's file sink, writes a message SQS delivers twice once."""

from __future__ import annotations

import io
import json
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from sqsworker.local import LocalSQS
from sqsworker.transports import Transport, send_all

from ..faults.proxy import FaultProxy, _answer
from .conftest import make_queue

pytestmark = pytest.mark.spark


class RefusingFirstDeliveries(FaultProxy):
    """moto's server, but a renewal or a delete naming any message's first receipt
    handle is answered 503: every first delivery's lease lapses, undeleted, and SQS
    delivers the message again (as when SQS is out of reach for longer than a lease)."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream, watch=self._received)
        self.first: dict[str, str] = {}  # message id -> its first receipt handle
        # Their handles, as a set the request threads only test membership in (another
        # thread adds to it meanwhile: iterating over it, or over ``first``, could fail).
        self.first_handles: set[str] = set()
        self.refused = 0

    def _received(self, target: str, body: bytes, status: int, answer: bytes) -> None:
        if target.endswith(".ReceiveMessage") and status == 200:
            for message in json.loads(answer).get("Messages", []):
                if message["MessageId"] not in self.first:
                    self.first[message["MessageId"]] = message["ReceiptHandle"]
                    self.first_handles.add(message["ReceiptHandle"])

    def _handle(self, request: BaseHTTPRequestHandler) -> None:
        target = request.headers.get("X-Amz-Target", "")
        if target.endswith((".DeleteMessageBatch", ".ChangeMessageVisibilityBatch")):
            length = int(request.headers.get("Content-Length", 0))
            body = request.rfile.read(length)
            handles = {e["ReceiptHandle"] for e in json.loads(body)["Entries"]}
            if any(handle in self.first_handles for handle in handles):
                self.refused += 1
                return _answer(request, 503, "ServiceUnavailable", "Service is unavailable")
            request.rfile = io.BytesIO(body)  # read again by the forwarding
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
    proxy = RefusingFirstDeliveries(aws.endpoint_url).start()
    try:
        read = documented(spark, queue, proxy.url, tmp_path)
    finally:
        proxy.stop()
    # Every message was read twice: the availableNow run reads what a lapsed lease put
    # back (waiting for it after the commit, if it is not visible yet).
    assert proxy.refused > 0
    assert read == 80
    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    assert sorted(row.message_id for row in rows) == sorted(sent)  # each written once
    assert queue.counts().total == 0
