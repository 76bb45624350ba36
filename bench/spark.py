"""The sqs source's micro-batch throughput and SQS requests per message.

Requests are counted at moto's server, in this process, so those of the Spark
driver and of every executor are counted alike.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from sqsworker.local import REGION, LocalSQS
from sqsworker.transports import send_all
from sqsworker.transports.sqs import SQSTransport


@dataclass
class SourceRun:
    partitions: int
    messages: int
    seconds: float
    batches: int
    requests: Counter[str]

    @property
    def rate(self) -> float:
        return self.messages / self.seconds

    @property
    def requests_per_message(self) -> float:
        return sum(self.requests.values()) / self.messages


@contextmanager
def counted_requests() -> Iterator[Counter[str]]:
    """Count every request moto's server answers, by SQS action, while inside."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication

    counts: Counter[str] = Counter()
    lock = threading.Lock()
    original: Callable[..., Any] = DomainDispatcherApplication.__call__

    def counting(self: Any, environ: dict[str, Any], start_response: Any) -> Any:
        target = environ.get("HTTP_X_AMZ_TARGET", "")
        action = target.rsplit(".", 1)[-1] if target else ""
        if not action:
            action = parse_qs(environ.get("QUERY_STRING", "")).get("Action", ["other"])[0]
        with lock:
            counts[action] += 1
        return original(self, environ, start_response)

    DomainDispatcherApplication.__call__ = counting  # type: ignore[method-assign]
    try:
        yield counts
    finally:
        DomainDispatcherApplication.__call__ = original  # type: ignore[method-assign]


def source_throughput(messages: int, rounds: int) -> list[SourceRun]:
    """Drain ``messages`` with numPartitions 1 and 2, alternating, ``rounds`` times each."""
    from pyspark.sql import SparkSession

    from spark_sink import SQSDataSource

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    runs = []
    with counted_requests() as counts, LocalSQS() as sqs, tempfile.TemporaryDirectory() as tmp:
        os.environ.update(sqs.env())
        spark = (
            SparkSession.builder.master("local[2]")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        spark.dataSource.register(SQSDataSource)
        for index in range(rounds * 2):
            partitions = 1 + index % 2
            name = f"bench-spark-{index}"
            sqs.create_queue(name, max_receive_count=None)
            queue = SQSTransport.connect(name, endpoint_url=sqs.endpoint_url, region=REGION)
            send_all(queue, [f'{{"n": {i}}}' for i in range(messages)])
            before = Counter(counts)
            started = time.perf_counter()
            query = (
                spark.readStream.format("sqs")
                .option("queue", name)
                .option("walPath", f"{tmp}/{name}/wal")
                .option("numPartitions", str(partitions))
                .option("maxMessagesPerBatch", "200")
                .option("waitTimeSeconds", "0")
                .load()
                .writeStream.format("noop")
                .option("checkpointLocation", f"{tmp}/{name}/checkpoint")
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            seconds = time.perf_counter() - started
            assert queue.counts().total == 0, "the source left messages behind"
            read = sum(p["numInputRows"] for p in query.recentProgress)
            batches = sum(1 for p in query.recentProgress if p["numInputRows"])
            runs.append(SourceRun(partitions, read, seconds, batches, counts - before))
            queue.close()
        spark.stop()
    return runs
