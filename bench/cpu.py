"""``python -m bench.cpu [REF]``: the worker's own cost per message, this tree against REF.

No-op handlers drain the in-memory SQS (no added latency) with the Prometheus metrics on,
each drain in a process of its own (``bench.drain --metrics``), alternating between REF's
sqsworker (default d7bf439) and this tree's. Prints, per side, msg/s and the process's CPU
time per message: every thread's, and the worker's alone (without what the in-memory SQS's
calls took: real SQS does that work elsewhere), medians over the rounds.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from .versus import ROOT, Runner, worktree

BEFORE = "d7bf439"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("ref", nargs="?", default=BEFORE)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    rates: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    own: dict[str, list[float]] = {}
    with worktree(args.ref) as old, tempfile.TemporaryDirectory() as folder:
        runner = Runner(Path(folder))
        sides = {f"before ({args.ref})": old, "current": ROOT}
        for round_ in range(args.rounds):
            order = list(sides) if round_ % 2 == 0 else list(sides)[::-1]
            for side in order:
                result = runner.run(
                    sides[side],
                    "drain",
                    "noop",
                    str(args.messages),
                    f"--concurrency={args.concurrency}",
                    "--metrics",
                )
                rates.setdefault(side, []).append(result["rate"])
                cpu.setdefault(side, []).append(result["cpu_us_per_message"])
                worker = result["cpu_us_per_message"] - result["service_cpu_us_per_message"]
                own.setdefault(side, []).append(worker)
                print(
                    f"round {round_ + 1}, {side}: {result['rate']:.0f} msg/s, "
                    f"{result['cpu_us_per_message']:.0f} us CPU a message, {worker:.0f} the "
                    "worker's",
                    flush=True,
                )
    print(
        f"\nno-op handlers, concurrency {args.concurrency}, metrics on, {args.messages} "
        f"messages, medians of {args.rounds}:"
    )
    for side in sides:
        print(
            f"  {side}: {statistics.median(rates[side]):.0f} msg/s, "
            f"{statistics.median(cpu[side]):.0f} us CPU a message, "
            f"{statistics.median(own[side]):.0f} the worker's (the in-memory SQS's left out)"
        )


if __name__ == "__main__":
    main()
