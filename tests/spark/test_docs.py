"""The Spark blocks of README.md and docs/spark.md run as pasted into `pyspark`, whose
shell defines ``spark``: each reads "orders" and writes every order once, through the
documented pipeline."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from sqsworker.local import LocalSQS

from ..conftest import wait_until
from ..snippets import snippet
from .conftest import s3_bucket, s3_keys

pytestmark = pytest.mark.spark

LOG = "s3://my-bucket/orders/wal"
OBJECTS = "s3a://my-bucket/orders/"


@pytest.mark.parametrize(
    ("page", "naming"),
    [("README.md", "from spark_sink import"), ("docs/spark.md", "spark.readStream")],
    ids=["README", "spark page"],
)
def test_the_streaming_example_runs(
    page: str, naming: str, spark: SparkSession, aws: LocalSQS, tmp_path: Path
) -> None:
    # The one change: the bucket. The log goes to moto's S3; the checkpoint and the
    # output, on s3a:// in the block (no hadoop-aws jar here), to a folder of this test's.
    block = snippet(page, naming).text
    assert OBJECTS in block and LOG in block
    bucket = s3_bucket()
    block = block.replace(LOG, f"s3://{bucket}/orders/wal").replace(OBJECTS, f"{tmp_path}/")
    (output,) = re.findall(r'"path", "([^"]+)"', block)
    sqs = aws.client()
    url = aws.create_queue("orders", max_receive_count=None)  # the session's server
    orders = [json.dumps({"id": n}) for n in range(20)]
    for order in orders:
        sqs.send_message(QueueUrl=url, MessageBody=order)

    def drained() -> bool:
        """Every order deleted, and then its batch's slots removed from the log (the
        driver removes them once SQS answered the deletes: a moment after the queue is
        empty, and before the query is stopped here)."""
        names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
        counts = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"]
        return sum(map(int, counts.values())) == 0 and s3_keys(bucket) == []

    before = {query.id for query in spark.streams.active}
    try:
        exec(compile(block, page, "exec"), {"spark": spark})
        # deleted only once their batch committed: every order is in the output then
        wait_until(drained, timeout=90, what="the orders written, deleted and their slots removed")
    finally:
        for query in spark.streams.active:
            if query.id not in before:
                query.stop()
        sqs.delete_queue(QueueUrl=url)
    written = spark.read.parquet(output)  # what the file sink's own log lists
    assert sorted(row.body for row in written.collect()) == sorted(orders)
