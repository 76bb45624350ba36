"""examples/spark_orders.py: each order once in the aggregates, the queue empty."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from examples.spark_orders import orders, pipeline
from sqsworker.local import LocalSQS

pytestmark = pytest.mark.spark


def test_the_orders_pipeline_counts_every_order_once(
    spark: SparkSession, aws: LocalSQS, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``aws``: this process's credentials; the example runs its own server."""
    with LocalSQS() as sqs:  # its own server: the example makes a queue named "orders"
        totals = pipeline(spark, sqs, tmp_path)
    expected: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for order in orders(300):
        expected[str(order["customer"])][0] += 1
        expected[str(order["customer"])][1] += float(order["amount"])  # type: ignore[arg-type]
    assert {c: (n, total) for c, (n, total) in totals.items()} == {
        c: (int(n), total) for c, (n, total) in expected.items()
    }
    assert "visible=0, in_flight=0, delayed=0" in capsys.readouterr().out
