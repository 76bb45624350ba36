"""`python -m bench` (or `make bench`): the worker's throughput and SQS cost, side by side.

Every figure comes from one run on this machine, so compare rows, not runs.
Requests per message are counted at the transport: each counted request is one
HTTP request on a real endpoint.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from bench.common import Finish
from bench.spark import print_runs, source_throughput
from sqsworker import Message, Worker, WorkerConfig
from sqsworker.events import Observer, Observers, Tally
from sqsworker.local import LocalSQS
from sqsworker.metrics import Metrics
from sqsworker.stores import Store, open_store
from sqsworker.telemetry import TelemetryServer
from sqsworker.transports import OutgoingMessage, Transport, send_all
from sqsworker.transports.memory import MemorySQS
from sqsworker.transports.sqs import SQSTransport


@dataclass
class Result:
    name: str
    messages: int
    seconds: float
    requests: Counter[str]
    empty_receives: int
    ideal: float | None = None

    @property
    def rate(self) -> float:
        return self.messages / self.seconds

    @property
    def saturated_requests_per_message(self) -> float:
        """Receives that returned messages, deletes and renewals: the cost while busy."""
        busy = (
            self.requests["ReceiveMessage"]
            - self.empty_receives
            + self.requests["DeleteMessageBatch"]
            + self.requests["ChangeMessageVisibilityBatch"]
        )
        return busy / self.messages

    @property
    def total_requests_per_message(self) -> float:
        return sum(self.requests.values()) / self.messages


def drain(
    name: str,
    transport: Transport,
    requests: Counter[str],
    messages: int,
    handler: Callable[[Message], None],
    concurrency: int,
    ideal: float | None = None,
    metrics: bool = False,
    store: Store | None = None,
    groups: int = 0,
    tracer: Any = None,
    attributes: Mapping[str, Mapping[str, Any]] | None = None,
) -> Result:
    """Send ``messages`` (round-robin over ``groups`` FIFO groups, if any; each with
    ``attributes``) and drain them."""
    send_all(
        transport,
        [
            OutgoingMessage(f'{{"n": {i}}}', group_id=f"g{i % groups}", deduplication_id=str(i))
            if groups
            else OutgoingMessage(f'{{"n": {i}}}', attributes or {})
            for i in range(messages)
        ],
    )
    before = Counter(requests)
    tally = Tally()
    config = WorkerConfig(
        queue=transport.info.name,
        concurrency=concurrency,
        wait_time=1,
        burst=True,
        visibility_timeout=30,
    )
    finish = Finish(messages)
    observers: list[Observer] = [tally, finish]
    if metrics:  # as `sqsworker run` wires them, scraped twice a second
        recorder = Metrics(config.queue, "bench.handler")
        observers.append(recorder)
    worker = Worker(
        handler,
        config,
        transport=transport,
        observer=Observers(observers),
        idempotency_store=store,
        tracer=tracer,
    )
    server = scraper = None
    if metrics:
        recorder.watch(worker)
        server = TelemetryServer(recorder.registry, worker.health, "127.0.0.1", 0).start()
        scraper = Scraper(f"http://127.0.0.1:{server.port}/metrics", every=0.5)
    started = time.perf_counter()
    worker.start()
    worker.wait()
    assert finish.at is not None
    elapsed = finish.at - started  # not burst mode's closing empty poll
    worker.shutdown()
    if server and scraper:
        scraper.stop()
        server.stop()
    assert tally.counts["deleted"] == messages, tally.counts
    return Result(name, messages, elapsed, requests - before, tally.counts["empty_receives"], ideal)


class Scraper:
    """A Prometheus stand-in: GET the metrics page every ``every`` seconds."""

    def __init__(self, url: str, every: float) -> None:
        self.url, self.every = url, every
        self.scrapes = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(self.every):
            with urllib.request.urlopen(self.url, timeout=10) as response:
                response.read()
            self.scrapes += 1

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


def side_by_side(
    rounds: int, run: Callable[[bool, str], Result]
) -> tuple[list[float], list[float]]:
    """``run(on, queue)`` ``rounds`` times each way, alternating: msg/s off, msg/s on."""
    rates: dict[bool, list[float]] = {False: [], True: []}
    for index in range(rounds * 2):
        on = index % 2 == 1
        rates[on].append(run(on, f"bench-side-by-side-{index}").rate)
    return rates[False], rates[True]


def metrics_cost(messages: int, rounds: int) -> tuple[list[float], list[float]]:
    """Throughput with metrics off and on, on the in-memory SQS, no-op handlers."""
    memory = MemorySQS()

    def run(on: bool, queue: str) -> Result:
        memory.create_queue(queue)
        return drain(
            queue, memory.transport(queue), memory.requests, messages, noop, 16, metrics=on
        )

    return side_by_side(rounds, run)


def tracing_cost(messages: int, rounds: int) -> tuple[list[float], list[float]]:
    """Throughput with tracing off and on (OpenTelemetry's SDK, its batch span processor,
    an exporter that drops the spans), on the in-memory SQS, no-op handlers, every
    message carrying a producer's traceparent."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Discard(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Discard()))
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    attributes = {"traceparent": {"DataType": "String", "StringValue": parent}}
    memory = MemorySQS()

    def run(on: bool, queue: str) -> Result:
        memory.create_queue(queue)
        tracer = provider.get_tracer("bench") if on else None
        transport = memory.transport(queue)
        return drain(
            queue,
            transport,
            memory.requests,
            messages,
            noop,
            16,
            tracer=tracer,
            attributes=attributes,
        )

    try:
        return side_by_side(rounds, run)
    finally:
        provider.shutdown()


def idempotency_cost(messages: int, rounds: int) -> tuple[list[float], list[float]]:
    """Throughput without and with a SQLite idempotency store: 10 ms handlers, concurrency 16."""
    memory = MemorySQS()
    handler = sleeper(0.01)
    with tempfile.TemporaryDirectory() as folder:

        def run(on: bool, queue: str) -> Result:
            memory.create_queue(queue)
            store = open_store(f"sqlite:///{folder}/{queue}.db") if on else None
            return drain(
                queue, memory.transport(queue), memory.requests, messages, handler, 16, store=store
            )

        return side_by_side(rounds, run)


def fifo_groups(per_group: int, counts: list[int]) -> list[Result]:
    """FIFO throughput against the number of groups: 50 ms handlers, concurrency 16."""
    memory = MemorySQS()
    results = []
    for groups in counts:
        queue = f"bench-fifo-{groups}.fifo"
        memory.create_queue(queue, {"FifoQueue": "true"})
        name = f"memory FIFO, {groups} group{'s' if groups > 1 else ''}, 50 ms, concurrency 16"
        ideal = min(groups, 16) / 0.05
        results.append(
            drain(
                name,
                memory.transport(queue),
                memory.requests,
                per_group * groups,
                sleeper(0.05),
                16,
                ideal,
                groups=groups,
            )
        )
    return results


def print_side_by_side(
    title: str, labels: tuple[str, str], off: list[float], on: list[float]
) -> None:
    print(f"\n{title}:")
    for label, rates in zip(labels, (off, on), strict=True):
        runs = " ".join(f"{r:.0f}" for r in rates)
        print(f"  {label:<10} msg/s: {runs}  median {statistics.median(rates):.0f}")
    ratio = statistics.median(on) / statistics.median(off)
    print(f"  {labels[1]} / {labels[0]} (medians): {ratio:.3f}")


def noop(message: Message) -> None:
    pass


def sleeper(seconds: float) -> Callable[[Message], None]:
    def handler(message: Message) -> None:
        time.sleep(seconds)

    return handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--memory-messages", type=int, default=5000)
    parser.add_argument("--moto-messages", type=int, default=500)
    parser.add_argument("--slow-messages", type=int, default=2000)
    parser.add_argument("--metrics-messages", type=int, default=5000)
    parser.add_argument("--metrics-rounds", type=int, default=5)
    parser.add_argument("--tracing-messages", type=int, default=5000)
    parser.add_argument("--tracing-rounds", type=int, default=5)
    parser.add_argument("--idempotency-messages", type=int, default=2000)
    parser.add_argument("--idempotency-rounds", type=int, default=5)
    parser.add_argument("--fifo-per-group", type=int, default=40)
    parser.add_argument("--spark-messages", type=int, default=400)
    parser.add_argument("--spark-rounds", type=int, default=2)
    parser.add_argument("--no-spark", action="store_true", help="skip the Spark source runs")
    args = parser.parse_args()

    spark_runs = [] if args.no_spark else source_throughput(args.spark_messages, args.spark_rounds)

    off, on = metrics_cost(args.metrics_messages, args.metrics_rounds)
    no_store, sqlite = idempotency_cost(args.idempotency_messages, args.idempotency_rounds)
    untraced, traced = tracing_cost(args.tracing_messages, args.tracing_rounds)

    results: list[Result] = []
    memory = MemorySQS()
    for name, count, handler, concurrency, ideal in [
        ("memory, no-op handlers, concurrency 16", args.memory_messages, noop, 16, None),
        ("memory, 100 ms handlers, concurrency 16", args.slow_messages, sleeper(0.1), 16, 160.0),
    ]:
        queue = f"bench-{len(results)}"
        memory.create_queue(queue)
        results.append(
            drain(
                name, memory.transport(queue), memory.requests, count, handler, concurrency, ideal
            )
        )

    results += fifo_groups(args.fifo_per_group, [1, 4, 16])

    with LocalSQS() as server:
        os.environ.update(server.env())
        for name, handler, ideal in [
            ("moto server, no-op handlers, concurrency 16", noop, None),
            ("moto server, 100 ms handlers, concurrency 16", sleeper(0.1), 160.0),
        ]:
            queue = f"bench-moto-{len(results)}"
            server.create_queue(queue, max_receive_count=None)
            transport = SQSTransport.connect(queue, max_connections=24)
            results.append(
                drain(name, transport, transport.requests, args.moto_messages, handler, 16, ideal)
            )
            transport.close()

    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"\n{'scenario':<46}{'msgs':>6}{'msg/s':>9}{'req/msg busy':>14}{'req/msg all':>13}"
        f"{'of ideal':>10}"
    )
    for r in results:
        of_ideal = f"{r.rate / r.ideal:.2f}" if r.ideal else "-"
        print(
            f"{r.name:<46}{r.messages:>6}{r.rate:>9.0f}{r.saturated_requests_per_message:>14.3f}"
            f"{r.total_requests_per_message:>13.3f}{of_ideal:>10}"
        )
    print_side_by_side(
        f"metrics cost (memory, no-op handlers, {args.metrics_messages} msgs, "
        f"{args.metrics_rounds} alternating rounds, scraped every 0.5 s)",
        ("off", "on"),
        off,
        on,
    )
    print_side_by_side(
        f"tracing cost (memory, no-op handlers, concurrency 16, {args.tracing_messages} msgs, "
        f"{args.tracing_rounds} alternating rounds, OpenTelemetry SDK, spans dropped)",
        ("off", "on"),
        untraced,
        traced,
    )
    print_side_by_side(
        f"idempotency cost (memory, 10 ms handlers, concurrency 16, ideal 1600 msg/s, "
        f"{args.idempotency_messages} msgs, {args.idempotency_rounds} alternating rounds)",
        ("no store", "sqlite"),
        no_store,
        sqlite,
    )
    if spark_runs:
        print(
            f"\nspark_sink source (moto server, local[2], {args.spark_messages} msgs, "
            "maxMessagesPerBatch 200, runs alternating; at 20 ms a request: python -m bench.spark):"
        )
        print_runs(spark_runs)
    print(f"\npeak RSS of the benchmark process: {peak_mb:.0f} MB")
    print(
        "req/msg busy: receives that returned messages + deletes + renewals, per message "
        "(floor 0.2)."
    )
    print(
        "req/msg all: every request, including the empty receives and queue-size checks "
        "with which burst mode ends."
    )


if __name__ == "__main__":
    main()
