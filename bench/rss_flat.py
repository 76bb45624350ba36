"""``python -m bench.rss_flat [--messages N]``: a worker's memory stays flat, message after message.

A real ``Worker`` (no-op handler, concurrency 16, burst mode) runs a million messages on
the in-memory SQS, with the observers ``sqsworker run`` installs (``Tally`` and ``Metrics``;
the log lines are left out, as they keep nothing). The queue is not filled up front, which
would hold every message: a feeder keeps about ``--queued`` waiting. This process's resident
memory is sampled every ``--every`` messages. After ``--warm-up`` messages it must grow by
less than ``--bound`` MB; the exit status is 1 when it does not. ``--trace`` starts
tracemalloc at the warm-up and prints the source lines whose memory grew (much slower).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
import tracemalloc
from collections.abc import Sequence
from pathlib import Path

import sqsworker
from sqsworker import Message, Worker, WorkerConfig
from sqsworker.events import Observer, Observers, Tally
from sqsworker.metrics import Metrics
from sqsworker.transports import Transport, send_all
from sqsworker.transports.memory import MemorySQS

from .rss import resident_mb


class Progress(Observer):
    """Counts deleted messages; samples RSS each time another ``every`` are done."""

    def __init__(self, every: int, trace: tuple[int, int, int] | None = None) -> None:
        self.every = every
        self.done = 0
        self.samples: list[tuple[int, float]] = [(0, resident_mb())]
        # tracemalloc: started after trace[0] messages, snapshots after trace[1] and trace[2]
        self.trace = trace
        self.snapshots: list[tracemalloc.Snapshot] = []
        self._lock = threading.Lock()

    def deleted(self, messages: Sequence[Message]) -> None:
        with self._lock:
            before, self.done = self.done, self.done + len(messages)
            if self.trace:
                start, *marks = self.trace
                if before < start <= self.done:
                    tracemalloc.start()
                if any(before < mark <= self.done for mark in marks):
                    self.snapshots.append(tracemalloc.take_snapshot())
            if before // self.every != self.done // self.every:
                self.samples.append((self.done, resident_mb()))


def feed(queue: Transport, sent: int, total: int, queued: int, progress: Progress) -> None:
    """Send the rest of ``total`` messages, a thousand at a time, keeping about ``queued``
    of them waiting."""
    while sent < total:
        if sent - progress.done > queued - 1000:
            time.sleep(0.005)
            continue
        send_all(queue, [f'{{"n": {i}}}' for i in range(sent, sent + 1000)])
        sent += 1000


def noop(message: Message) -> None:
    pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--queued", type=int, default=20_000)
    parser.add_argument("--every", type=int, default=50_000)
    parser.add_argument("--warm-up", type=int, default=100_000)
    parser.add_argument("--bound", type=float, default=5.0, help="MB of growth after the warm-up")
    parser.add_argument("--trace", action="store_true")
    parser.add_argument("--json", action="store_true", help="print one JSON line (bench.versus)")
    args = parser.parse_args()
    if args.messages % 1000 or args.warm_up >= args.messages:
        parser.error("--messages must be a multiple of 1000 and more than --warm-up")
    memory = MemorySQS()
    memory.create_queue("flat")
    queue = memory.transport("flat")
    # Snapshots one interval after the warm-up and when the feeder has sent the last message:
    # both while about --queued messages wait, so the queue's own contents cancel out.
    marks = (args.warm_up, args.warm_up + args.every, args.messages - args.queued)
    progress = Progress(args.every, marks if args.trace else None)
    config = WorkerConfig(queue="flat", concurrency=16, wait_time=1, burst=True)
    metrics = Metrics(config.queue, "bench.rss_flat:noop")
    worker = Worker(noop, config, transport=queue, observer=Observers([Tally(), metrics, progress]))
    metrics.watch(worker)
    first = min(args.queued, args.messages) // 1000 * 1000  # burst mode stops on an empty queue
    feed(queue, 0, first, args.queued, progress)
    feeder = threading.Thread(
        target=feed, args=(queue, first, args.messages, args.queued, progress)
    )
    feeder.start()
    started = time.perf_counter()
    worker.run()
    seconds = time.perf_counter() - started
    feeder.join()
    if progress.done != args.messages:
        sys.exit(f"burst mode stopped after {progress.done} messages: the feeder fell behind")
    if progress.samples[-1][0] != progress.done:
        progress.samples.append((progress.done, resident_mb()))

    after = [(n, mb) for n, mb in progress.samples if n >= args.warm_up]
    warm_mb, end_mb = after[0][1], after[-1][1]
    slope = statistics.linear_regression([n for n, _ in after], [mb for _, mb in after]).slope
    summary = {
        "messages": args.messages,
        "msg_per_s": round(args.messages / seconds),
        "warm_up": after[0][0],
        "rss_at_warm_up_mb": round(warm_mb, 1),
        "rss_at_end_mb": round(end_mb, 1),
        "growth_mb": round(end_mb - warm_mb, 1),
        "slope_mb_per_100k": round(slope * 100_000, 2),
        "flat": end_mb - warm_mb < args.bound,
        "sqsworker": str(Path(sqsworker.__file__).parent),
    }
    if args.json:
        print(json.dumps(summary))
    else:
        report(progress, summary, args.bound)
    if len(progress.snapshots) == 2:
        grown = progress.snapshots[1].compare_to(progress.snapshots[0], "lineno")
        print(f"\ngrowth from {marks[1]:,} to {marks[2]:,} messages (tracemalloc):")
        for stat in grown[:10]:
            print(f"  {stat.size_diff / 2**20:+8.2f} MB {stat.count_diff:+9} blocks  {stat}")
    sys.exit(0 if summary["flat"] else 1)


def report(progress: Progress, summary: dict[str, object], bound: float) -> None:
    print(f"{'messages':>10}{'RSS MB':>9}")
    for n, mb in progress.samples:
        print(f"{n:>10,}{mb:>9.1f}")
    print(
        f"\n{summary['messages']:,} messages at {summary['msg_per_s']:,} msg/s. "
        f"RSS {summary['rss_at_warm_up_mb']} MB at {summary['warm_up']:,}, "
        f"{summary['rss_at_end_mb']} MB at the end: {summary['growth_mb']:+} MB, "
        f"{summary['slope_mb_per_100k']:+} MB per 100,000 messages. "
        f"Flat (under {bound} MB): {'yes' if summary['flat'] else 'NO'}."
    )


if __name__ == "__main__":
    main()
