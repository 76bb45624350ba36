"""sqsworker against the naive consumer (``naive.py``), side by side on the same workloads.

``python -m bench.compare [--chart PATH]`` prints the table and draws the chart (default
bench/results/compare.png; docs/comparison.png is drawn by ``bench.peers``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqsworker import Message, Worker, WorkerConfig
from sqsworker.local import REGION, LocalSQS
from sqsworker.transports import Transport, send_all
from sqsworker.transports.memory import MemorySQS
from sqsworker.transports.sqs import SQSTransport

from .common import Finish
from .naive import consume

ROOT = Path(__file__).resolve().parents[1]
CONSUMERS = ("sqsworker", "naive")


@dataclass
class Row:
    measure: str
    unit: str
    values: dict[str, float] = field(default_factory=dict)
    better: str = "higher"


def noop(message: Message) -> None:
    pass


def sleeper(seconds: float) -> Callable[[Message], None]:
    def handler(message: Message) -> None:
        time.sleep(seconds)

    return handler


def drain(
    consumer: str, transport: Transport, handler: Callable[[Message], None], count: int
) -> float:
    """Seconds from the start to the last delete (not to the final empty poll)."""
    last = Finish(count)
    started = time.perf_counter()
    if consumer == "naive":
        consume(transport, handler, 30, threading.Event(), until_empty=True, deleted=last.add)
    else:
        config = WorkerConfig(queue=transport.info.name, concurrency=16, wait_time=1, burst=True)
        Worker(handler, config, transport=transport, observer=last).run()
    assert last.at is not None, "not everything was deleted"
    return last.at - started


def throughput(rows: list[Row], sqs: LocalSQS) -> None:
    memory = MemorySQS()
    workloads = [
        ("memory", "no-op", 2000, noop),
        ("memory", "100 ms", 100, sleeper(0.1)),
        ("moto", "no-op", 200, noop),
        ("moto", "100 ms", 60, sleeper(0.1)),
    ]
    for where, what, count, handler in workloads:
        rate = Row(f"throughput, {where}, {what} handlers", "msg/s")
        cost = Row(f"SQS requests per message, {where}, {what}", "req/msg", better="lower")
        for consumer in CONSUMERS:
            name = f"compare-{where}-{what.replace(' ', '')}-{consumer}"
            if where == "memory":
                memory.create_queue(name)
                transport: Transport = memory.transport(name)
                requests = memory.requests
            else:
                sqs.create_queue(name, max_receive_count=None)
                transport = SQSTransport.connect(name, max_connections=24)
                requests = transport.requests
            send_all(transport, [f'{{"n": {i}}}' for i in range(count)])
            before = Counter(requests)
            seconds = drain(consumer, transport, handler, count)
            rate.values[consumer] = count / seconds
            cost.values[consumer] = sum((requests - before).values()) / count
        rows += [rate, cost]


def redeliveries(rows: list[Row]) -> None:
    """Two consumers of each kind; handlers of 3 s on a 2 s visibility timeout."""
    row = Row(
        "redeliveries: extra handler runs, 8 messages, 3 s handlers, 2 s visibility (naive: "
        "stopped after 48 s)",
        "runs",
        better="lower",
    )
    for consumer in CONSUMERS:
        memory = MemorySQS()
        memory.create_queue("slow")
        send_all(memory.transport("slow"), [f"m{i}" for i in range(8)])
        runs: Counter[str] = Counter()
        lock = threading.Lock()

        def slow(message: Message, runs: Counter[str] = runs, lock: Any = lock) -> None:
            time.sleep(3)
            with lock:
                runs[message.body] += 1

        stop = threading.Event()
        if consumer == "naive":
            threads = [
                threading.Thread(target=consume, args=(memory.transport("slow"), slow, 2, stop))
                for _ in range(2)
            ]
            for thread in threads:
                thread.start()
            # Its late deletes name stale handles, which delete nothing: it may never
            # finish, so it gets as long as the 8 messages take one at a time, twice over.
            give_up = time.monotonic() + 2 * 8 * 3
            while (
                sum(1 for n in runs.values() if n) < 8 or memory.transport("slow").counts().total
            ) and time.monotonic() < give_up:
                time.sleep(0.1)
            stop.set()
            for thread in threads:
                thread.join()
        else:
            # Short polls: a 2 s lease cannot cover a long poll plus the margin.
            config = WorkerConfig(queue="slow", concurrency=4, visibility_timeout=2, wait_time=0)
            workers = [Worker(slow, config, transport=memory.transport("slow")) for _ in range(2)]
            for worker in workers:
                worker.start()
            while len(runs) < 8 or memory.transport("slow").counts().total:
                time.sleep(0.1)
            for worker in workers:
                worker.request_stop()
            for worker in workers:
                worker.shutdown()
        row.values[consumer] = sum(runs.values()) - 8
    rows.append(row)


def sigterm_hand_back(rows: list[Row]) -> None:
    """Stop a consumer holding 10 messages (2 running): seconds until the 8 unstarted are
    visible again. Both use a 6 s visibility timeout."""
    row = Row("SIGTERM until the 8 unstarted messages are visible again", "s", better="lower")
    for consumer in CONSUMERS:
        memory = MemorySQS()
        memory.create_queue("held")
        queue = memory.transport("held")
        send_all(queue, [f"m{i}" for i in range(10)])
        started = threading.Event()

        def slow(message: Message, started: threading.Event = started) -> None:
            started.set()
            time.sleep(2)

        stop = threading.Event()
        if consumer == "naive":
            thread = threading.Thread(target=consume, args=(queue, slow, 6, stop))
            thread.start()
            started.wait(10)
            signalled = time.perf_counter()
            stop.set()
        else:
            config = WorkerConfig(
                queue="held", concurrency=2, prefetch=8, visibility_timeout=6, wait_time=1
            )
            worker = Worker(slow, config, transport=queue)
            worker.start()
            started.wait(10)
            while worker.in_hand < 10:
                time.sleep(0.01)
            signalled = time.perf_counter()
            worker.request_stop()
            thread = threading.Thread(target=worker.shutdown)
            thread.start()
        while queue.counts().visible < 8:
            time.sleep(0.01)
        row.values[consumer] = time.perf_counter() - signalled
        thread.join()
    rows.append(row)


def sigkill_recovery(rows: list[Row], sqs: LocalSQS, scratch: Path) -> None:
    """SIGKILL a consumer process mid-handler; seconds until a fresh one has finished its
    messages. The naive consumer's visibility must cover its longest handler (here 10 s);
    sqsworker renews a 3 s lease."""
    row = Row(
        "SIGKILL until the killed consumer's messages are done elsewhere", "s", better="lower"
    )
    env = {**os.environ, **sqs.env(), "PYTHONPATH": str(ROOT)}
    for consumer in CONSUMERS:
        queue = f"compare-kill-{consumer}"
        sqs.create_queue(queue, max_receive_count=None)
        transport = SQSTransport.connect(queue)
        send_all(transport, [f"m{i}" for i in range(3)])
        ledger = scratch / f"{consumer}.ledger"
        ledger.touch()
        if consumer == "naive":
            command = [sys.executable, "-m", "bench.naive", queue, "12", "bench.handlers:record"]
        else:
            command = [
                sys.executable,
                "-m",
                "sqsworker.cli",
                "run",
                "bench.handlers:record",
                "--queue",
                queue,
                "--visibility-timeout",
                "3",
                "--wait-time",
                "1",
                "--concurrency",
                "3",
                "--metrics-port",
                "off",
            ]

        def start(command: list[str] = command, ledger: Path = ledger) -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                command,
                env={**env, "LEDGER": str(ledger)},
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )

        first = start()
        while "start" not in ledger.read_text():
            time.sleep(0.01)
        first.kill()
        first.wait()
        killed = time.perf_counter()
        second = start()
        while (
            len(
                {
                    line.split()[1]
                    for line in ledger.read_text().splitlines()
                    if line.startswith("done")
                }
            )
            < 3
        ):
            time.sleep(0.05)
        row.values[consumer] = time.perf_counter() - killed
        second.send_signal(signal.SIGTERM)
        second.wait(30)
        transport.close()
    rows.append(row)


def peak_rss(rows: list[Row], messages: int) -> None:
    row = Row(f"peak RSS draining {messages:,} messages (in-memory SQS)", "MB", better="lower")
    for consumer in CONSUMERS:
        out = subprocess.run(
            [sys.executable, "-m", "bench.rss", consumer, str(messages)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=True,
        ).stdout
        row.values[consumer] = json.loads(out.splitlines()[-1])["peak_mb"]
    rows.append(row)


def chart(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 4, figsize=(16, 10))
    for ax, row in zip(axes.flat, rows, strict=False):
        values = [row.values[c] for c in CONSUMERS]
        bars = ax.bar(CONSUMERS, values, color=["#2b8a3e", "#adb5bd"])
        ax.bar_label(bars, labels=[f"{v:.3g}" for v in values])
        ax.set_title(row.measure, fontsize=8, wrap=True)
        ax.set_ylabel(f"{row.unit} ({row.better} is better)", fontsize=8)
    for ax in list(axes.flat)[len(rows) :]:
        ax.axis("off")
    fig.suptitle("sqsworker against a naive boto3-style consumer (python -m bench.compare)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--chart", type=Path, default=ROOT / "bench" / "results" / "compare.png")
    parser.add_argument("--rss-messages", type=int, default=100_000)
    args = parser.parse_args()
    rows: list[Row] = []
    with LocalSQS() as sqs, tempfile.TemporaryDirectory() as scratch:
        os.environ.update(sqs.env())
        os.environ.setdefault("AWS_REGION", REGION)
        throughput(rows, sqs)
        redeliveries(rows)
        sigterm_hand_back(rows)
        sigkill_recovery(rows, sqs, Path(scratch))
    peak_rss(rows, args.rss_messages)
    print(f"\n{'measure':<84}{'sqsworker':>12}{'naive':>12}  unit")
    for row in rows:
        s, n = row.values["sqsworker"], row.values["naive"]
        print(f"{row.measure:<84}{s:>12.3f}{n:>12.3f}  {row.unit}")
    chart(rows, args.chart)
    print(f"\nchart: {args.chart}")


if __name__ == "__main__":
    main()
