"""``python -m bench.grid [REF]``: the receive side at real SQS latency, this tree against REF.

Every SQS call of the in-memory SQS takes 20 ms more (``Latency``), as real SQS does
in-region. The grid: concurrency 16 / 64 / 256 x handlers of 0 / 20 / 100 ms, each drain in
its own process (``bench.drain``), alternating between REF's sqsworker (default c0f9802,
main before the receive side ran receives and lease calls in parallel) and this tree's.
Then an idle worker on an empty queue, each side: requests per minute, and seconds from a
stop request to the exit. Prints msg/s, the fraction of the ideal
``concurrency / handler time``, requests per message, and seconds from the last delete to
the exit of a burst-mode worker.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

from .versus import ROOT, Runner, worktree

BEFORE = "c0f9802"
CONCURRENCY = (16, 64, 256)
HANDLER_MS = (0, 20, 100)
LATENCY_MS = 20


def messages_for(concurrency: int, handler_ms: int, seconds: float) -> int:
    """About ``seconds`` of work at the ideal rate; no-op handlers get a fixed count."""
    if handler_ms == 0:
        return 4000
    return max(500, round(concurrency / (handler_ms / 1000) * seconds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("ref", nargs="?", default=BEFORE)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=4.0, help="of ideal work per drain")
    parser.add_argument("--idle", type=float, default=45.0, help="seconds idle, 0: skip")
    args = parser.parse_args()

    runs: dict[tuple[int, int, str], list[dict[str, Any]]] = {}
    idle: dict[str, dict[str, Any]] = {}
    with worktree(args.ref) as old, tempfile.TemporaryDirectory() as folder:
        runner = Runner(Path(folder))
        sides = {f"before ({args.ref})": old, "current": ROOT}
        for round_ in range(args.rounds):
            for concurrency in CONCURRENCY:
                for handler_ms in HANDLER_MS:
                    count = messages_for(concurrency, handler_ms, args.seconds)
                    handler = f"sleep{handler_ms}" if handler_ms else "noop"
                    order = list(sides) if round_ % 2 == 0 else list(sides)[::-1]
                    for side in order:
                        result = runner.run(
                            sides[side],
                            "drain",
                            handler,
                            str(count),
                            f"--latency-ms={LATENCY_MS}",
                            f"--concurrency={concurrency}",
                        )
                        result["messages"] = count
                        runs.setdefault((concurrency, handler_ms, side), []).append(result)
                        print(
                            f"{concurrency} x {handler_ms} ms, {side}: {result['rate']:.0f} msg/s, "
                            f"{result['requests_per_message']:.3f} req/msg",
                            flush=True,
                        )
        if args.idle:
            for side, tree in sides.items():
                idle[side] = runner.run(
                    tree, "drain", "noop", "0", f"--latency-ms={LATENCY_MS}", f"--idle={args.idle}"
                )

    before, current = sides
    print(f"\nin-memory SQS, +{LATENCY_MS} ms a call, {args.rounds} round(s), medians")
    print(
        f"{'concurrency':>11}{'handler':>9}{'msgs':>7}{'ideal':>7}"
        f"{'msg/s before':>14}{'current':>9}{'of ideal before':>17}{'current':>9}{'steady':>8}"
        f"{'busy req/msg before':>21}{'current':>9}{'exit s before':>15}{'current':>9}"
    )
    for concurrency in CONCURRENCY:
        for handler_ms in HANDLER_MS:
            old_runs, new_runs = (
                runs[concurrency, handler_ms, before],
                runs[concurrency, handler_ms, current],
            )
            ideal = concurrency / (handler_ms / 1000) if handler_ms else None

            def median(rows: list[dict[str, Any]], key: str) -> float:
                return statistics.median(r[key] for r in rows)

            old_rate, new_rate = median(old_runs, "rate"), median(new_runs, "rate")
            steady = median(new_runs, "steady_rate")
            fractions = (
                (f"{old_rate / ideal:.2f}", f"{new_rate / ideal:.2f}", f"{steady / ideal:.2f}")
                if ideal
                else ("-", "-", "-")
            )
            print(
                f"{concurrency:>11}{handler_ms:>7}ms{old_runs[0]['messages']:>7}"
                f"{ideal or 0:>7.0f}{old_rate:>14.0f}{new_rate:>9.0f}"
                f"{fractions[0]:>17}{fractions[1]:>9}{fractions[2]:>8}"
                f"{median(old_runs, 'busy_requests_per_message'):>21.3f}"
                f"{median(new_runs, 'busy_requests_per_message'):>9.3f}"
                f"{median(old_runs, 'exit_after_last_delete'):>15.2f}"
                f"{median(new_runs, 'exit_after_last_delete'):>9.2f}"
            )
    print(
        "msg/s from the worker's start to its last delete; ideal = concurrency / handler time; "
        "steady: the current side's msg/s from a tenth of the messages deleted to nine tenths "
        "(without the first receives and the last handlers and delete batch); "
        "busy req/msg: receives that returned messages, deletes and renewals, per message; "
        "exit s: from the last delete to the burst-mode worker's exit."
    )
    if idle:
        print(f"\nidle worker, empty queue, default --wait-time 20, {args.idle:.0f} s:")
        for side, r in idle.items():
            print(
                f"  {side:<22} {r['requests_per_minute']:>5.1f} requests a minute; "
                f"stop request to exit {r['stop_to_exit']:.2f} s"
            )


if __name__ == "__main__":
    main()
