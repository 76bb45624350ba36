"""``python -m bench.coroutines``: async def handlers against thread handlers, side by side.

Each drain runs in a process of its own (``bench.drain``): the in-memory SQS with 20 ms
added to every request, ``--concurrency 1000``, and handlers that wait 100 ms each, as
coroutines awaiting ``asyncio.sleep`` (``asleep100``) or as threads in ``time.sleep``
(``sleep100``), alternating which goes first from round to round. Prints, as medians:
msg/s and its fraction of the ideal ``concurrency / handler time`` (10,000 msg/s), the
process's CPU time per message, its peak resident memory and most threads at once, and
SQS requests per message; then the async side's ratios to the thread side's. A second,
smaller pair (no-op handlers, concurrency 16, no latency) shows what running a message
as a coroutine costs in CPU against running it on a thread.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from .versus import ROOT, Runner

LATENCY_MS = 20
CONCURRENCY = 1000
HANDLER_MS = 100
FIELDS = ("rate", "cpu_us_per_message", "peak_rss_mb", "peak_threads", "requests_per_message")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=20_000)
    args = parser.parse_args()
    sides = {
        "async def": [f"asleep{HANDLER_MS}"],
        "threads": [f"sleep{HANDLER_MS}"],
        "async def, no-op": ["anoop"],
        "threads, no-op": ["noop"],
    }
    loaded = [f"--latency-ms={LATENCY_MS}", f"--concurrency={CONCURRENCY}"]
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory() as folder:
        runner = Runner(Path(folder))
        for round_ in range(args.rounds):
            for pair in (("async def", "threads"), ("async def, no-op", "threads, no-op")):
                order = pair if round_ % 2 == 0 else pair[::-1]
                for side in order:
                    options = loaded if "no-op" not in side else ["--concurrency=16"]
                    result = runner.run(ROOT, "drain", *sides[side], str(args.messages), *options)
                    runs[side].append(result)
                    print(f"round {round_ + 1}, {side}: {result['rate']:.0f} msg/s", flush=True)

    median = {s: {f: statistics.median(r[f] for r in runs[s]) for f in FIELDS} for s in runs}
    ideal = CONCURRENCY / (HANDLER_MS / 1000)
    print(
        f"\n{args.messages:,} messages, in-memory SQS, {args.rounds} round(s), medians; "
        f"concurrency {CONCURRENCY}, {HANDLER_MS} ms handlers, +{LATENCY_MS} ms a request"
    )
    print(
        f"{'':18}{'msg/s':>8}{'of ideal':>10}{'CPU µs/msg':>12}{'peak RSS':>10}"
        f"{'threads':>9}{'req/msg':>9}"
    )
    for side, m in median.items():
        of_ideal = f"{m['rate'] / ideal:.2f}" if "no-op" not in side else ""
        print(
            f"{side:18}{m['rate']:>8.0f}{of_ideal:>10}{m['cpu_us_per_message']:>12.0f}"
            f"{m['peak_rss_mb']:>8.0f}MB{m['peak_threads']:>9.0f}{m['requests_per_message']:>9.3f}"
        )
    a, t = median["async def"], median["threads"]
    print(
        f"\nasync / threads: msg/s {a['rate'] / t['rate']:.2f}x, CPU per message "
        f"{a['cpu_us_per_message'] / t['cpu_us_per_message']:.2f}x, peak RSS "
        f"{a['peak_rss_mb'] / t['peak_rss_mb']:.2f}x, threads {a['peak_threads']:.0f} vs "
        f"{t['peak_threads']:.0f}"
    )
    an, tn = median["async def, no-op"], median["threads, no-op"]
    print(
        f"no-op, concurrency 16: {an['cpu_us_per_message']:.0f} µs/msg as coroutines, "
        f"{tn['cpu_us_per_message']:.0f} on threads"
    )


if __name__ == "__main__":
    sys.exit(main())
