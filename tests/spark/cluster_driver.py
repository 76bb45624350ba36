"""A driver on the test cluster: the documented pipeline, run until the queue is drained.

    python -m tests.spark.cluster_driver '{"master": "spark://...", "queue": ..., ...}'

Run by ``cluster.Driver`` in a process of its own. Its environment (AWS's variables,
moto's endpoints) is passed on to the executors through ``spark.executorEnv.*``. It
prints ``BATCH DONE <id> <rows>`` after each batch with rows, and exits 0 once the
queue holds no message (every one deleted, so every batch committed), or with the
query's error.

With ``"refused": {"queue": ..., "wal": ...}`` it first starts the same pipeline on
that queue and log in this session, which must be refused at start: it prints
``REFUSED <the error>`` (or ``NOT REFUSED``) before the pipeline proper starts, so
one session on the cluster serves both.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from spark_sink import SQSDataSource
from sqsworker.transports.sqs import SQSTransport

PASSED = ("AWS_", "PYSPARK_PYTHON", "PYTHONPATH")


def session(master: str) -> SparkSession:
    builder = (
        SparkSession.builder.master(master)
        .appName("spark_sink cluster test")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.executor.memory", "512m")
        .config("spark.executor.cores", "1")
        .config("spark.cores.max", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
    )
    for name, value in os.environ.items():
        if name.startswith(PASSED):
            builder = builder.config(f"spark.executorEnv.{name}", value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(SQSDataSource)
    return spark


def pipeline(spark: SparkSession, config: dict[str, Any]) -> StreamingQuery:
    """The documented pipeline (docs/spark.md): a redelivered message has the same
    message_id, dropped within the watermark on received_at; Spark's file sink writes
    each batch once."""
    orders = (
        spark.readStream.format("sqs")
        .option("queue", config["queue"])
        .option("walPath", config["wal"])
        .options(**config.get("options", {}))
        .load()
    )
    return (
        orders.withWatermark("received_at", "10 minutes")
        .dropDuplicatesWithinWatermark(["message_id"])
        .writeStream.format("parquet")
        .option("path", config["output"])
        .option("checkpointLocation", config["checkpoint"])
        .trigger(processingTime="0 seconds")
        .start()
    )


def refused(spark: SparkSession, config: dict[str, Any]) -> None:
    """Start the pipeline (a checkpoint and output of its own); say whether it was
    refused at start."""
    error: BaseException | None
    try:
        query = pipeline(spark, config)
        query.awaitTermination(120)  # a refusal ends the query with its error
        error = query.exception()
        query.stop()
    except Exception as exc:  # refused before the query started
        error = exc
    print(f"REFUSED {error}" if error is not None else "NOT REFUSED", flush=True)


def main(config: dict[str, Any]) -> None:
    spark = session(config["master"])
    if "refused" in config:
        refused(
            spark,
            {
                **config,
                **config["refused"],
                "checkpoint": config["checkpoint"] + "-refused",
                "output": config["output"] + "-refused",
            },
        )
    query = pipeline(spark, config)
    queue = SQSTransport.connect(config["queue"])
    done = threading.Event()
    reported: set[int] = set()
    try:
        while query.isActive:
            for progress in query.recentProgress:
                batch = int(progress["batchId"])
                if progress["numInputRows"] and batch not in reported:
                    reported.add(batch)
                    durations = json.dumps(progress["durationMs"])
                    rows = progress["numInputRows"]
                    print(f"BATCH DONE {batch} {rows} {durations}", flush=True)
            if query.lastProgress is not None and queue.counts().total == 0:
                break  # every message deleted: every batch that read one is committed
            done.wait(0.2)  # the queue's counts are the only way to know
        if query.exception() is not None:
            raise SystemExit(f"the query failed: {query.exception()}")
    finally:
        query.stop()
        queue.close()
        spark.stop()
    print("DRAINED", flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
