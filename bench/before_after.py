"""``python -m bench.before_after REF``: this tree against REF on the rows of ``bench.grid``,
``bench.cpu`` and ``bench.coroutines``, in alternating rounds of one run.

For a change that must not cost speed (a restructuring, say). Each drain of
``bench.drain`` runs in a process of its own, REF's and this tree's one after the other,
which goes first alternating from round to round. Rows: the grid (concurrency 16 / 64 /
256 x handlers of 0 / 20 / 100 ms, in-memory SQS + 20 ms a request: msg/s), the CPU row
(no-op handlers, concurrency 16, metrics on, no latency: the worker's own CPU per
message), and the coroutine rows (``async def`` handlers of 100 ms at concurrency 1,000 +
20 ms a request: msg/s; no-op coroutines at 16: CPU per message). Prints each row's
median on each side and current / before (for CPU, before / current: above 1 is better
either way), and the median of the rows' ratios.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

from .grid import CONCURRENCY, HANDLER_MS, LATENCY_MS, messages_for
from .versus import ROOT, Runner, worktree


def rows(seconds: float, messages: int) -> list[tuple[str, list[str], str]]:
    """(name, bench.drain's arguments, the figure compared)."""
    found = []
    for concurrency in CONCURRENCY:
        for handler_ms in HANDLER_MS:
            handler = f"sleep{handler_ms}" if handler_ms else "noop"
            count = messages_for(concurrency, handler_ms, seconds)
            args = [
                handler,
                str(count),
                f"--latency-ms={LATENCY_MS}",
                f"--concurrency={concurrency}",
            ]
            found.append((f"grid {concurrency} x {handler_ms} ms", args, "rate"))
    found.append(
        ("cpu, no-op x 16", ["noop", str(messages), "--concurrency=16", "--metrics"], "own")
    )
    found.append(
        (
            "coroutines 1000 x 100 ms",
            ["asleep100", str(messages), f"--latency-ms={LATENCY_MS}", "--concurrency=1000"],
            "rate",
        )
    )
    found.append(("coroutines, no-op x 16", ["anoop", str(messages), "--concurrency=16"], "own"))
    return found


def figure(result: dict[str, Any], kind: str) -> float:
    if kind == "rate":
        return float(result["rate"])
    # The worker's own CPU per message: without the in-memory SQS's share.
    service = result.get("service_cpu_us_per_message", 0.0)
    return float(result["cpu_us_per_message"] - service)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("ref")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="of ideal work per grid drain")
    parser.add_argument("--messages", type=int, default=10_000, help="per CPU/coroutine drain")
    args = parser.parse_args()
    table = rows(args.seconds, args.messages)
    runs: dict[tuple[str, str], list[float]] = {}
    with worktree(args.ref) as old, tempfile.TemporaryDirectory() as folder:
        runner = Runner(Path(folder))
        sides = {"before": old, "current": ROOT}
        for round_ in range(args.rounds):
            for name, drain, kind in table:
                order = list(sides) if round_ % 2 == 0 else list(sides)[::-1]
                for side in order:
                    value = figure(runner.run(sides[side], "drain", *drain), kind)
                    runs.setdefault((name, side), []).append(value)
                    print(f"round {round_ + 1}, {name}, {side}: {value:.1f}", flush=True)

    print(f"\n{args.ref} (before) against this tree, {args.rounds} round(s), medians")
    print(f"{'row':28}{'figure':>16}{'before':>10}{'current':>10}{'ratio':>8}")
    ratios = []
    for name, _, kind in table:
        before = statistics.median(runs[name, "before"])
        current = statistics.median(runs[name, "current"])
        ratio = current / before if kind == "rate" else before / current
        ratios.append(ratio)
        label = "msg/s" if kind == "rate" else "worker µs/msg"
        print(f"{name:28}{label:>16}{before:>10.1f}{current:>10.1f}{ratio:>8.2f}")
    print(f"\nmedian ratio (above 1: current is faster): {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
