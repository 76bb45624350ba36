"""The sqs source's micro-batch throughput and SQS requests per message.

    .venv/bin/python -m bench.spark [--messages 2000] [--latency 0.02] [--rounds 2]

Requests are counted at moto's server, in this process, so those of the Spark
driver and of every executor are counted alike; ``--latency`` seconds are added
to each one there (real SQS answers in about 20 ms in-region).
"""

from __future__ import annotations

import argparse
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
    # Spark's own timing of the query's triggers, summed, in seconds: "latestOffset"
    # (the source's commit of the batch before, then a look at the queue), "addBatch"
    # (the executors' receives and the sink), the triggers' "other" steps (Spark's
    # offset and commit logs, planning), and the query's "start" before its first
    phases: dict[str, float]

    @property
    def rate(self) -> float:
        return self.messages / self.seconds

    @property
    def running_rate(self) -> float:
        """From the first trigger on: the rate of a query that is already running."""
        return self.messages / self.phases["triggers"]

    @property
    def requests_per_message(self) -> float:
        return sum(self.requests.values()) / self.messages


@contextmanager
def counted_requests(latency: float = 0.0) -> Iterator[Counter[str]]:
    """Count every request moto's server answers, by SQS action, while inside, each
    answered ``latency`` seconds late (the server serves each request on a thread)."""
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
        if latency:
            time.sleep(latency)
        return original(self, environ, start_response)

    DomainDispatcherApplication.__call__ = counting  # type: ignore[method-assign]
    try:
        yield counts
    finally:
        DomainDispatcherApplication.__call__ = original  # type: ignore[method-assign]


def source_throughput(
    messages: int, rounds: int, latency: float = 0.0, per_batch: int = 200
) -> list[SourceRun]:
    """Drain ``messages`` with numPartitions 1 and 2, alternating, ``rounds`` times each,
    at most ``per_batch`` a micro-batch."""
    from pyspark.sql import SparkSession

    from spark_sink import SQSDataSource

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    runs = []
    with (
        counted_requests(latency) as counts,
        LocalSQS() as sqs,
        tempfile.TemporaryDirectory() as tmp,
    ):
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
                .option("maxMessagesPerBatch", str(per_batch))
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
            phases: Counter[str] = Counter()
            for progress in query.recentProgress:
                durations = progress["durationMs"]
                phases["latestOffset"] += durations.get("latestOffset", 0) / 1000
                phases["addBatch"] += durations.get("addBatch", 0) / 1000
                phases["triggers"] += durations.get("triggerExecution", 0) / 1000
            phases["start"] = seconds - phases["triggers"]  # the query's, before its first
            phases["other"] = phases["triggers"] - phases["latestOffset"] - phases["addBatch"]
            runs.append(
                SourceRun(partitions, read, seconds, batches, counts - before, dict(phases))
            )
            queue.close()
        spark.stop()
    return runs


def print_runs(runs: list[SourceRun]) -> None:
    print(
        f"  {'numPartitions':>13}{'msg/s':>9}{'running':>9}{'batches':>9}{'req/msg':>9}"
        f"{'start s':>9}{'commit+look s':>15}{'read+sink s':>13}{'other s':>9}  requests"
    )
    for run in runs:
        requests = ", ".join(f"{k} {v}" for k, v in sorted(run.requests.items()))
        print(
            f"  {run.partitions:>13}{run.rate:>9.1f}{run.running_rate:>9.1f}{run.batches:>9}"
            f"{run.requests_per_message:>9.3f}{run.phases['start']:>9.2f}"
            f"{run.phases['latestOffset']:>15.2f}"
            f"{run.phases['addBatch']:>13.2f}{run.phases['other']:>9.2f}  {requests}"
        )
    means = {}
    for partitions in (1, 2):
        # The first run warms the session up: it is left out of the mean.
        counted = [r for r in runs[2:] if r.partitions == partitions] or [
            r for r in runs if r.partitions == partitions
        ]
        means[partitions] = (
            sum(r.rate for r in counted) / len(counted),
            sum(r.running_rate for r in counted) / len(counted),
        )
        whole, running = means[partitions]
        print(f"  numPartitions {partitions}: {whole:.1f} msg/s, {running:.1f} once running (mean)")
    if 1 in means and 2 in means:
        print(
            f"  2 partitions / 1: {means[2][0] / means[1][0]:.2f}x, "
            f"{means[2][1] / means[1][1]:.2f}x once running"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2, help="runs of each numPartitions")
    parser.add_argument("--latency", type=float, default=0.02, help="seconds added a request")
    parser.add_argument("--per-batch", type=int, default=1000, help="maxMessagesPerBatch")
    args = parser.parse_args()
    runs = source_throughput(args.messages, args.rounds, args.latency, args.per_batch)
    print(
        f"spark_sink source (moto server + {args.latency * 1000:.0f} ms a request, local[2], "
        f"{args.messages} msgs, maxMessagesPerBatch {args.per_batch}, runs alternating; "
        "msg/s counts the query's start, running from its first trigger):"
    )
    print_runs(runs)


if __name__ == "__main__":
    main()
