"""The Spark blocks of README.md and docs/spark.md run as pasted into `pyspark`, whose
shell defines ``spark``: each reads "orders" and writes every order once."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from spark_sink import read_output
from sqsworker.local import LocalSQS

from ..conftest import wait_until
from ..snippets import snippet

pytestmark = pytest.mark.spark


@pytest.mark.parametrize(
    ("page", "naming", "shared"),
    [
        ("README.md", "from spark_sink import", "/shared/"),
        ("docs/spark.md", "spark.readStream", "/mnt/shared/orders/"),
    ],
    ids=["README", "spark page"],
)
def test_the_streaming_example_runs(
    page: str, naming: str, shared: str, spark: SparkSession, local_sqs: LocalSQS, tmp_path: Path
) -> None:
    # The one change: a folder of this test's for the shared storage the block names.
    block = snippet(page, naming).text
    assert shared in block
    block = block.replace(shared, f"{tmp_path}/")
    (output,) = re.findall(r'write_once\("([^"]+)"\)', block)
    sqs = local_sqs.client()
    url = local_sqs.create_queue("orders", max_receive_count=None)  # the session's server
    orders = [json.dumps({"id": n}) for n in range(20)]
    for order in orders:
        sqs.send_message(QueueUrl=url, MessageBody=order)

    def drained() -> bool:
        names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
        counts = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"]
        return sum(map(int, counts.values())) == 0

    before = {query.id for query in spark.streams.active}
    try:
        exec(compile(block, page, "exec"), {"spark": spark})
        # deleted only once their batch committed: every order is in the output then
        wait_until(drained, timeout=90, what="the orders written and deleted")
    finally:
        for query in spark.streams.active:
            if query.id not in before:
                query.stop()
        sqs.delete_queue(QueueUrl=url)
    written = read_output(spark, output)
    assert written is not None
    assert sorted(row.body for row in written.collect()) == sorted(orders)
