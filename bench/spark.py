"""The sqs source's micro-batch throughput, requests per message, and CPU per message.

    .venv/bin/python -m bench.spark [--messages 2000] [--latency 0.02 0.1] [--rounds 2]
                                    [--wal s3|local] [--in-flight 1 8]
    .venv/bin/python -m bench.spark --endpoint [--latency 0.02 0.1] [--in-flight 1 8]
                                    [--rounds 2] [--seconds 20]

``--endpoint`` measures a query already running against ``bench.endpoint`` instead of
moto's server (which serves one call at a time at about 1.7 ms of its CPU a message, so
no query against it passes about 590 msg/s): what the source alone can do
(``endpoint_rate``).

``--in-flight`` with several values alternates the runs over them too, so that
receivesInFlight 1 (one receive at a time, as before it existed) and the default
are measured side by side in one run, on the same machine load.

moto's server runs in a process of its own (``--serve``), so its CPU is not counted
as the source's; ``--latency`` seconds are added there to each SQS request (real SQS
answers in about 20 ms in-region; S3 requests get none). Requests are counted there,
those of the Spark driver and of every executor alike: SQS by action, S3 by method.
CPU seconds come from /proc: the driver (Spark's JVM, which in ``local[2]`` also runs
the executors' JVM side, and the source's Python on the driver) and the executors'
Python workers, which receive and write the log.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any
from urllib.parse import parse_qs

TICKS = os.sysconf("SC_CLK_TCK")


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
    latency: float = 0.0
    in_flight: int | None = None  # receivesInFlight; None: the source's default
    cpu: dict[str, float] = field(default_factory=dict)  # seconds, by process kind

    @property
    def rate(self) -> float:
        return self.messages / self.seconds

    @property
    def running_rate(self) -> float:
        """From the first trigger on: the rate of a query that is already running."""
        return self.messages / self.phases["triggers"]

    @property
    def requests_per_message(self) -> float:
        return self.sqs_requests / self.messages

    @property
    def sqs_requests(self) -> int:
        return sum(v for k, v in self.requests.items() if not k.startswith("S3 "))

    @property
    def s3_requests(self) -> int:
        return sum(v for k, v in self.requests.items() if k.startswith("S3 "))

    def cpu_per_1000(self, kind: str) -> float:
        return self.cpu.get(kind, 0.0) * 1000 / self.messages


# -- moto's server, in a process of its own -----------------------------------------------


def serve() -> None:
    """The child: moto's server; on stdin, ``latency S`` sets the latency added to each SQS
    request, ``counts`` prints the requests counted so far (JSON)."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication

    from sqsworker.local import LocalSQS

    counts: Counter[str] = Counter()
    lock = threading.Lock()
    latency = [0.0]
    original: Callable[..., Any] = DomainDispatcherApplication.__call__

    def counting(self: Any, environ: dict[str, Any], start_response: Any) -> Any:
        target = environ.get("HTTP_X_AMZ_TARGET", "")
        if target:
            action = target.rsplit(".", 1)[-1]
        elif "Action" in parse_qs(environ.get("QUERY_STRING", "")):
            action = parse_qs(environ["QUERY_STRING"])["Action"][0]
        else:
            action = f"S3 {environ.get('REQUEST_METHOD', '')}"
        with lock:
            counts[action] += 1
        if latency[0] and not action.startswith("S3 "):
            time.sleep(latency[0])
        return original(self, environ, start_response)

    DomainDispatcherApplication.__call__ = counting  # type: ignore[method-assign]
    with LocalSQS() as sqs:
        print(json.dumps(sqs.env()), flush=True)
        for line in sys.stdin:
            command, _, value = line.strip().partition(" ")
            if command == "latency":
                latency[0] = float(value)
            elif command == "counts":
                with lock:
                    print(json.dumps(counts), flush=True)


class Server:
    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.spark", "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self._in: IO[str] = self.process.stdin
        self._out: IO[str] = self.process.stdout
        self.env: dict[str, str] = json.loads(self._out.readline())

    def latency(self, seconds: float) -> None:
        self._in.write(f"latency {seconds}\n")
        self._in.flush()

    def counts(self) -> Counter[str]:
        self._in.write("counts\n")
        self._in.flush()
        return Counter(json.loads(self._out.readline()))

    def close(self) -> None:
        self._in.close()
        self.process.wait(30)


# -- CPU from /proc --------------------------------------------------------------------


def cpu_by_kind(root: int, skip: int) -> dict[str, float]:
    """CPU seconds so far of ``root``'s descendants (``skip``'s apart), by kind: each
    process's own and its waited-for children's (a Python worker that ended is counted
    by the process that forked it, of the same kind, or by the JVM)."""
    parents: dict[int, int] = {}
    stats: dict[int, tuple[str, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        pid = int(entry.name)
        parents[pid] = int(fields[1])
        ticks = sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
        if "pyspark.daemon" in cmdline or "pyspark.worker" in cmdline:
            kind = "executors"
        elif "python_streaming_source_runner" in cmdline:
            kind = "driver py"  # the source's Python on the driver: counted in "driver" too
        else:
            kind = "driver"
        stats[pid] = (kind, ticks / TICKS)
    totals: Counter[str] = Counter()
    for pid, (kind, seconds) in stats.items():
        ancestor = parents.get(pid, 0)
        while ancestor not in (0, 1, root, skip):
            ancestor = parents.get(ancestor, 0)
        if pid == skip:
            totals["server"] += seconds  # moto's: not the source's, shown beside it
        elif ancestor == root:
            totals[kind] += seconds
    totals["driver"] += totals["driver py"]
    return dict(totals)


# -- the runs -----------------------------------------------------------------------------


@contextmanager
def spark_session(env: dict[str, str]) -> Iterator[Any]:
    from pyspark.sql import SparkSession

    from spark_sink import SQSDataSource
    from tests.spark.cluster import worker_python

    os.environ.update(env)
    # pyspark as installed, not recompiled from Spark's zip at every Python worker start
    os.environ.setdefault("PYSPARK_PYTHON", worker_python())
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(SQSDataSource)
    try:
        yield spark
    finally:
        spark.stop()


def source_throughput(
    messages: int,
    rounds: int,
    latency: float = 0.0,
    per_batch: int = 200,
    latencies: list[float] | None = None,
    wal: str = "local",
    in_flight: list[int | None] | None = None,
) -> list[SourceRun]:
    """Drain ``messages`` with numPartitions 1 and 2 (and each ``in_flight``), alternating,
    ``rounds`` times each at each latency, at most ``per_batch`` a micro-batch."""
    import boto3

    from sqsworker.transports import send_all
    from sqsworker.transports.sqs import SQSTransport

    server = Server()
    runs = []
    try:
        sqs = boto3.client("sqs", **_client_args(server.env, "SQS"))
        s3 = boto3.client("s3", **_client_args(server.env, "S3"))
        bucket = "bench-spark-wal"
        s3.create_bucket(Bucket=bucket)
        with spark_session(server.env) as spark, tempfile.TemporaryDirectory() as tmp:
            index = 0
            for seconds in latencies or [latency]:
                server.latency(seconds)
                flights = in_flight or [None]
                for _ in range(rounds * 2 * len(flights)):
                    partitions = 1 + index % 2
                    flight = flights[index // 2 % len(flights)]
                    name = f"bench-spark-{index}"
                    index += 1
                    url = sqs.create_queue(QueueName=name)["QueueUrl"]
                    queue = SQSTransport.connect(url)
                    server.latency(0)  # the sends are not what is measured
                    send_all(queue, [f'{{"n": {i}}}' for i in range(messages)])
                    server.latency(seconds)
                    log = f"s3://{bucket}/{name}/wal" if wal == "s3" else f"{tmp}/{name}/wal"
                    before, cpu_before = (
                        server.counts(),
                        cpu_by_kind(os.getpid(), server.process.pid),
                    )
                    started = time.perf_counter()
                    query = (
                        spark.readStream.format("sqs")
                        .option("queue", name)
                        .option("walPath", log)
                        .option("numPartitions", str(partitions))
                        .option("maxMessagesPerBatch", str(per_batch))
                        .option("waitTimeSeconds", "0")
                        .options(**({"receivesInFlight": str(flight)} if flight else {}))
                        .load()
                        .writeStream.format("noop")
                        .option("checkpointLocation", f"{tmp}/{name}/checkpoint")
                        .trigger(availableNow=True)
                        .start()
                    )
                    query.awaitTermination()
                    seconds_taken = time.perf_counter() - started
                    cpu_after = cpu_by_kind(os.getpid(), server.process.pid)
                    counts = server.counts() - before
                    server.latency(0)
                    assert queue.counts().total == 0, "the source left messages behind"
                    server.latency(seconds)
                    queue.close()
                    runs.append(_run(query, partitions, seconds, seconds_taken, counts))
                    runs[-1].in_flight = flight
                    runs[-1].cpu = {
                        k: cpu_after.get(k, 0.0) - cpu_before.get(k, 0.0) for k in cpu_after
                    }
        sqs.close()
        s3.close()
    finally:
        server.close()
    return runs


def endpoint_rate(
    latency: float,
    partitions: int,
    in_flight: int | None,
    *,
    per_batch: int = 1000,
    warmup: float = 10.0,
    seconds: float = 20.0,
) -> dict[str, float]:
    """A query already running against ``bench.endpoint`` (an SQS endpoint in a process
    of its own that serves fresh messages without end, answers every delete and renewal
    at once, ``latency`` seconds after each request, for a few tens of µs of its CPU a
    message), the log in a local folder: msg/s deleted over ``seconds`` once ``warmup``
    seconds have passed since the first delete, SQS requests a message, and CPU seconds
    per 1,000 messages by process kind. What the source alone can do, where moto's
    server (1.7 ms of its CPU a message, one call at a time) would cap the query near
    590 msg/s whatever the source did."""
    from .endpoint import Endpoint

    with Endpoint(latency_ms=latency * 1000) as endpoint, tempfile.TemporaryDirectory() as tmp:
        env = {  # any credentials: the endpoint checks none
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        with spark_session(env) as spark:
            query = (
                spark.readStream.format("sqs")
                .option("queue", "bench")
                # an option, not the environment: Spark's JVM keeps the environment its
                # first session started with, and each run has an endpoint of its own
                .option("endpointUrl", endpoint.url)
                .option("walPath", f"{tmp}/wal")
                .option("numPartitions", str(partitions))
                .option("maxMessagesPerBatch", str(per_batch))
                .option("waitTimeSeconds", "0")
                .options(**({"receivesInFlight": str(in_flight)} if in_flight else {}))
                .load()
                .writeStream.format("noop")
                .option("checkpointLocation", f"{tmp}/checkpoint")
                .start()
            )
            try:
                deadline = time.monotonic() + 300
                while not endpoint.stats().get("deleted"):
                    if time.monotonic() > deadline or not query.isActive:
                        raise RuntimeError(f"the query deleted nothing: {query.exception()}")
                    time.sleep(0.2)
                time.sleep(warmup)
                before, cpu_before, started = (
                    endpoint.stats(),
                    cpu_by_kind(os.getpid(), endpoint.pid),
                    time.perf_counter(),
                )
                time.sleep(seconds)
                after, cpu_after, elapsed = (
                    endpoint.stats(),
                    cpu_by_kind(os.getpid(), endpoint.pid),
                    time.perf_counter() - started,
                )
            finally:
                query.stop()
    deleted = after["deleted"] - before["deleted"]
    requests = sum(after["requests"].values()) - sum(before["requests"].values())
    result = {"rate": deleted / elapsed, "sqs_requests_per_message": requests / deleted}
    for kind in ("driver", "driver py", "executors", "server"):
        spent = cpu_after.get(kind, 0.0) - cpu_before.get(kind, 0.0)
        result[f"{kind} cpu per 1000"] = spent * 1000 / deleted
    return result


def _client_args(env: dict[str, str], service: str) -> dict[str, Any]:
    return {
        "endpoint_url": env[f"AWS_ENDPOINT_URL_{service}"],
        "region_name": env["AWS_DEFAULT_REGION"],
        "aws_access_key_id": env["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
    }


def _run(
    query: Any, partitions: int, latency: float, seconds: float, counts: Counter[str]
) -> SourceRun:
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
    return SourceRun(partitions, read, seconds, batches, counts, dict(phases), latency)


def print_runs(runs: list[SourceRun]) -> None:
    print(
        f"  {'ms':>4}{'parts':>6}{'flight':>7}{'msg/s':>8}{'running':>9}{'batches':>8}"
        f"{'SQS/msg':>8}{'S3/msg':>8}{'drv cpu':>8}{'exe cpu':>8}{'drv py':>7}{'srv cpu':>8}"
        f"{'start s':>8}"
        f"{'commit+look':>12}{'read+sink':>10}  requests"
    )
    for run in runs:
        requests = ", ".join(f"{k} {v}" for k, v in sorted(run.requests.items()))
        print(
            f"  {run.latency * 1000:>4.0f}{run.partitions:>6}{_flight(run.in_flight):>7}"
            f"{run.rate:>8.1f}{run.running_rate:>9.1f}{run.batches:>8}"
            f"{run.requests_per_message:>8.3f}{run.s3_requests / run.messages:>8.4f}"
            f"{run.cpu_per_1000('driver'):>8.2f}{run.cpu_per_1000('executors'):>8.2f}"
            f"{run.cpu_per_1000('driver py'):>7.2f}{run.cpu_per_1000('server'):>8.2f}"
            f"{run.phases['start']:>8.2f}"
            f"{run.phases['latestOffset']:>12.2f}{run.phases['addBatch']:>10.2f}  {requests}"
        )
    flights = list(dict.fromkeys(r.in_flight for r in runs))
    for latency in sorted({r.latency for r in runs}):
        at = [r for r in runs if r.latency == latency]
        warm = at[2 * len(flights) :]  # the first of each kind warms the session up
        means: dict[tuple[int | None, int], tuple[float, float]] = {}
        for flight in flights:
            for partitions in (1, 2):
                kind = [r for r in at if r.in_flight == flight and r.partitions == partitions]
                counted = [r for r in kind if r in warm] or kind
                if not counted:
                    continue
                means[flight, partitions] = (
                    sum(r.rate for r in counted) / len(counted),
                    sum(r.running_rate for r in counted) / len(counted),
                )
                whole, running = means[flight, partitions]
                print(
                    f"  {latency * 1000:.0f} ms, numPartitions {partitions}, receivesInFlight "
                    f"{_flight(flight)}: {whole:.1f} msg/s, {running:.1f} once running (mean)"
                )
            if (flight, 1) in means and (flight, 2) in means:
                one, two = means[flight, 1], means[flight, 2]
                print(
                    f"  {latency * 1000:.0f} ms, receivesInFlight {_flight(flight)}, 2 partitions"
                    f" / 1: {two[0] / one[0]:.2f}x, {two[1] / one[1]:.2f}x once running"
                )
        for flight in flights[1:]:
            if (flight, 1) in means and (flights[0], 1) in means:
                this, first = means[flight, 1], means[flights[0], 1]
                print(
                    f"  {latency * 1000:.0f} ms, 1 partition, receivesInFlight {_flight(flight)}"
                    f" / {_flight(flights[0])}: {this[0] / first[0]:.2f}x, "
                    f"{this[1] / first[1]:.2f}x once running"
                )


def endpoint_rows(args: argparse.Namespace) -> None:
    rows: dict[tuple[float, int, int | None], list[dict[str, float]]] = {}
    for round_ in range(args.rounds):
        for latency in args.latency:
            kinds = [(p, f) for f in (args.in_flight or [None]) for p in (1, 2)]
            for partitions, flight in kinds if round_ % 2 == 0 else kinds[::-1]:
                measured = endpoint_rate(
                    latency, partitions, flight, per_batch=args.per_batch, seconds=args.seconds
                )
                rows.setdefault((latency, partitions, flight), []).append(measured)
                print(
                    f"round {round_ + 1}, {latency * 1000:.0f} ms, numPartitions {partitions}, "
                    f"receivesInFlight {_flight(flight)}: {measured['rate']:.1f} msg/s",
                    flush=True,
                )
    print(
        f"\nspark_sink source against bench.endpoint (+ latency to each request), local[2], "
        f"maxMessagesPerBatch {args.per_batch}, the log in a local folder, a query already "
        f"running, {args.seconds:.0f} s measured, medians of {args.rounds} rounds; CPU "
        "seconds per 1,000 messages (drv py: the source's Python on the driver, part of drv):"
    )
    print(
        f"  {'ms':>4}{'parts':>6}{'flight':>7}{'msg/s':>9}{'SQS/msg':>9}{'drv cpu':>8}"
        f"{'drv py':>8}{'exe cpu':>8}{'srv cpu':>8}"
    )
    for (latency, partitions, flight), runs in rows.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(
            f"  {latency * 1000:>4.0f}{partitions:>6}{_flight(flight):>7}{med['rate']:>9.1f}"
            f"{med['sqs_requests_per_message']:>9.3f}{med['driver cpu per 1000']:>8.2f}"
            f"{med['driver py cpu per 1000']:>8.2f}{med['executors cpu per 1000']:>8.2f}"
            f"{med['server cpu per 1000']:>8.2f}"
        )


def _flight(in_flight: int | None) -> str:
    return "dflt" if in_flight is None else str(in_flight)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2, help="runs of each numPartitions")
    parser.add_argument(
        "--latency", type=float, nargs="+", default=[0.02, 0.1], help="seconds added a request"
    )
    parser.add_argument("--per-batch", type=int, default=1000, help="maxMessagesPerBatch")
    parser.add_argument("--wal", choices=["s3", "local"], default="s3", help="where the log goes")
    parser.add_argument(
        "--in-flight",
        type=int,
        nargs="+",
        help="receivesInFlight, runs alternating over several (default: the source's)",
    )
    parser.add_argument(
        "--endpoint",
        action="store_true",
        help="a running query's rate against bench.endpoint (endless, cheap), not moto's "
        "server: numPartitions 1 and 2, each --in-flight, rounds alternating",
    )
    parser.add_argument("--seconds", type=float, default=20.0, help="measured, --endpoint")
    args = parser.parse_args()
    if args.serve:
        serve()
        return
    if args.endpoint:
        return endpoint_rows(args)
    runs = source_throughput(
        args.messages,
        args.rounds,
        per_batch=args.per_batch,
        latencies=args.latency,
        wal=args.wal,
        in_flight=args.in_flight,
    )
    print(
        f"spark_sink source (moto's server in its own process, + latency to each SQS request, "
        f"local[2], {args.messages} msgs, maxMessagesPerBatch {args.per_batch}, log on "
        f"{args.wal}, receivesInFlight {args.in_flight or 'default'}, runs alternating; "
        "msg/s counts the query's start, running from its first "
        "trigger; CPU seconds per 1,000 messages, drv py the source's Python on the driver, "
        "part of drv cpu):"
    )
    print_runs(runs)


if __name__ == "__main__":
    main()
