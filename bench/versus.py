"""``python -m bench.versus [REF]``: this work tree's sqsworker against git REF's, in one run.

REF (default 05a5714, main before the lease fixes of issue 13) is checked out into a
temporary ``git worktree``, removed afterwards. Each drain of ``bench.drain`` runs in its own
process, alternating between the two versions, for ``--rounds`` rounds; then, unless
``--rss-messages 0``, ``bench.rss_flat`` runs once on each. Prints median msg/s and SQS
requests per message of each side, and current / before: the ratio of the medians, with the
lowest and highest ratio of the rounds' pairs as its spread.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BEFORE = "05a5714"
# name, bench.drain's handler, messages, added latency per SQS call (ms)
SCENARIOS = [
    ("no-op handlers", "noop", 5000, 0),
    ("100 ms handlers", "sleep100", 1000, 0),
    ("no-op handlers, +20 ms a call", "noop", 2000, 20),
    ("100 ms handlers, +20 ms a call", "sleep100", 1000, 20),
]


@contextmanager
def worktree(ref: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="sqsworker-versus-") as folder:
        tree = Path(folder) / "tree"
        git = ["git", "-C", str(ROOT), "worktree"]
        subprocess.run([*git, "add", "--detach", str(tree), ref], check=True, capture_output=True)
        try:
            yield tree
        finally:
            subprocess.run([*git, "remove", "--force", str(tree)], check=True)


class Runner:
    """Runs ``python -m bench.MODULE`` against a given tree's sqsworker.

    A process's import path starts with its working folder, then $PYTHONPATH. Working in a
    folder that holds only a link to this bench/ makes bench this one and sqsworker the tree's.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        (folder / "bench").symlink_to(ROOT / "bench")

    def run(self, tree: Path, module: str, *args: str) -> dict[str, Any]:
        done = subprocess.run(
            [sys.executable, "-m", f"bench.{module}", *args],
            cwd=self.folder,
            env={**os.environ, "PYTHONPATH": str(tree)},
            capture_output=True,
            text=True,
        )
        lines = done.stdout.strip().splitlines()
        if not lines or not lines[-1].startswith("{"):
            raise SystemExit(f"bench.{module} {' '.join(args)} on {tree} failed:\n{done.stderr}")
        result: dict[str, Any] = json.loads(lines[-1])
        assert result["sqsworker"] == str(tree / "sqsworker"), result["sqsworker"]
        return result


def scaled(messages: int, scale: float) -> int:
    return max(100, round(messages * scale))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("ref", nargs="?", default=BEFORE)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--scale", type=float, default=1.0, help="times each drain's messages")
    parser.add_argument("--rss-messages", type=int, default=1_000_000, help="0: skip")
    args = parser.parse_args()

    with worktree(args.ref) as old, tempfile.TemporaryDirectory() as folder:
        runner = Runner(Path(folder))
        sides = {f"before ({args.ref})": old, "current": ROOT}
        runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for round_ in range(args.rounds):
            for name, handler, messages, latency in SCENARIOS:
                count = str(scaled(messages, args.scale))
                order = list(sides) if round_ % 2 == 0 else list(sides)[::-1]
                for side in order:
                    result = runner.run(
                        sides[side], "drain", handler, count, f"--latency-ms={latency}"
                    )
                    runs.setdefault((name, side), []).append(result)
                    print(f"round {round_ + 1}, {name}, {side}: {result['rate']:.0f} msg/s")
        rss = {}
        if args.rss_messages:
            for side, tree in sides.items():
                size = f"--messages={args.rss_messages}"
                rss[side] = runner.run(tree, "rss_flat", size, "--json")

    before, current = sides
    print(f"\nconcurrency 16, in-memory SQS, {args.rounds} rounds alternating, medians")
    print(
        f"{'scenario':<32}{'msgs':>6}{'before':>9}{'current':>9}{'ratio':>7}{'spread':>13}"
        f"{'req/msg before':>16}{'current':>9}"
    )
    for name, _, messages, _ in SCENARIOS:
        old_runs, new_runs = runs[name, before], runs[name, current]
        old_rate = statistics.median(r["rate"] for r in old_runs)
        new_rate = statistics.median(r["rate"] for r in new_runs)
        pairs = [n["rate"] / o["rate"] for o, n in zip(old_runs, new_runs, strict=True)]
        spread = f"{min(pairs):.2f}-{max(pairs):.2f}"
        old_cost = statistics.median(r["requests_per_message"] for r in old_runs)
        new_cost = statistics.median(r["requests_per_message"] for r in new_runs)
        print(
            f"{name:<32}{scaled(messages, args.scale):>6}{old_rate:>9.0f}"
            f"{new_rate:>9.0f}{new_rate / old_rate:>7.3f}{spread:>13}{old_cost:>16.3f}"
            f"{new_cost:>9.3f}"
        )
    print(
        "msg/s from the worker's start to its last delete; ratio = current / before (the bar: "
        "0.95); spread: the lowest and highest of the rounds' ratios."
    )
    if rss:
        print(f"\nRSS, {args.rss_messages:,} no-op messages (bench.rss_flat):")
        for side, r in rss.items():
            print(
                f"  {side:<18} {r['rss_at_warm_up_mb']:>6} MB at {r['warm_up']:,}, "
                f"{r['rss_at_end_mb']:>6} MB at the end: {r['growth_mb']:+} MB, "
                f"{r['slope_mb_per_100k']:+} MB per 100,000; flat: {'yes' if r['flat'] else 'NO'}"
            )


if __name__ == "__main__":
    main()
