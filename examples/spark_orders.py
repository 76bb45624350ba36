"""Orders from SQS through Spark Structured Streaming to Parquet aggregates, each order once.

    .venv/bin/python examples/spark_orders.py

Starts an embedded SQS (moto's server), sends 300 orders, 20 of them twice (a
producer that retried), and runs one Spark query over the queue with
``Trigger.AvailableNow``: every order is written once to Parquet by Spark's file
sink, duplicates of an ``order_id`` dropped within an hour of ``received_at``
(``dropDuplicatesWithinWatermark``), then the totals per customer are computed
from that output and written as Parquet too. The queue is empty at the end.
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
from pathlib import Path

try:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as f
except ModuleNotFoundError as missing:  # `make demo` installs no Spark
    if __name__ != "__main__" or (missing.name or "").split(".")[0] != "pyspark":
        raise
    sys.exit(
        "examples/spark_orders.py needs Spark, and pyspark is not installed here "
        "(`make demo` installs only the worker and the embedded SQS): run `make test` "
        "first, which installs Spark and the test tools into .venv (Spark also needs Java "
        "17 or later), then .venv/bin/python examples/spark_orders.py again"
    )

from spark_sink import SQSDataSource
from sqsworker.local import REGION, LocalSQS
from sqsworker.transports import send_all
from sqsworker.transports.sqs import SQSTransport

ORDER = "order_id string, customer string, amount double"
CUSTOMERS = ["ada", "grace", "linus", "margaret"]


def orders(count: int, seed: int = 7) -> list[dict[str, object]]:
    rng = random.Random(seed)
    return [
        {"order_id": f"o-{n}", "customer": rng.choice(CUSTOMERS), "amount": rng.randint(1, 500)}
        for n in range(count)
    ]


def pipeline(spark: SparkSession, sqs: LocalSQS, folder: Path) -> dict[str, tuple[int, float]]:
    """Send the orders, run the query, return {customer: (orders, total)} as written."""
    sqs.create_queue("orders", max_receive_count=3)
    queue = SQSTransport.connect("orders", endpoint_url=sqs.endpoint_url, region=REGION)
    sent = orders(300)
    send_all(queue, [json.dumps(o) for o in sent + sent[:20]])  # 20 sent twice

    spark.dataSource.register(SQSDataSource)
    messages = (
        spark.readStream.format("sqs")
        .option("queue", "orders")
        .option("endpointUrl", sqs.endpoint_url)
        .option("region", REGION)
        .option("walPath", str(folder / "wal"))
        .option("maxMessagesPerBatch", "200")
        .load()
    )
    parsed = messages.select(
        "message_id", "received_at", f.from_json("body", ORDER).alias("order")
    ).select("message_id", "received_at", "order.*")
    query = (
        # A producer's retry is another message with the same order_id: dropped here
        # within an hour of the first, with SQS's own redeliveries.
        parsed.withWatermark("received_at", "1 hour")
        .dropDuplicatesWithinWatermark(["order_id"])
        .writeStream.format("parquet")
        .option("path", str(folder / "orders"))
        .option("checkpointLocation", str(folder / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()

    written = spark.read.parquet(str(folder / "orders"))
    totals = written.groupBy("customer").agg(
        f.count("*").alias("orders"), f.sum("amount").alias("total")
    )
    totals.write.mode("overwrite").parquet(str(folder / "totals"))
    result = {r.customer: (r.orders, r.total) for r in totals.collect()}
    print(f"queue after the query: {queue.counts()}")
    return result


def main() -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    with LocalSQS() as sqs, tempfile.TemporaryDirectory() as scratch:
        os.environ.update(sqs.env())
        spark = SparkSession.builder.master("local[2]").appName("orders").getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        try:
            totals = pipeline(spark, sqs, Path(scratch))
        finally:
            spark.stop()
    print(f"\n{'customer':<10}{'orders':>8}{'total':>10}")
    for customer, (count, total) in sorted(totals.items()):
        print(f"{customer:<10}{count:>8}{total:>10.0f}")
    print(f"{'all':<10}{sum(c for c, _ in totals.values()):>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
