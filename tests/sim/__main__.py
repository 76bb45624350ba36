"""Run the fault simulator by hand.

    python -m tests.sim --minutes 30          # soak: random seeds until the time is up
    python -m tests.sim --seeds 0:5000        # a range of seeds
    python -m tests.sim --replay 1234         # one seed, with its events, as the suite ran it

Exit status 1 if any schedule broke an invariant; each failure prints its seed.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Iterator

from .world import World, draw, run_world, simulate


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__.split("\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--minutes", type=float, help="soak: random seeds for this long")
    group.add_argument("--seeds", help="a range A:B of seeds")
    group.add_argument("--replay", type=int, help="run one seed and print its events")
    parser.add_argument("--events", type=int, default=200, help="events shown by --replay")
    args = parser.parse_args()
    if args.replay is not None:
        return replay(args.replay, args.events)
    return soak(_seeds(args), args.minutes)


def _seeds(args: argparse.Namespace) -> Iterator[int]:
    if args.seeds:
        first, _, last = args.seeds.partition(":")
        yield from range(int(first), int(last))
    else:
        rng = random.Random()
        while True:
            yield rng.randrange(10**9)


def soak(seeds: Iterator[int], minutes: float | None) -> int:
    started = time.monotonic()
    end = started + minutes * 60 if minutes else None
    ran = failed = 0
    for seed in seeds:
        if end is not None and time.monotonic() >= end:
            break
        schedule, violations = simulate(seed)
        ran += 1
        if violations:
            failed += 1
            print(f"seed {seed}: {violations[0]}\n  {schedule.describe()}", flush=True)
        if ran % 500 == 0:
            print(f".. {ran} schedules, {failed} failed, {time.monotonic() - started:.0f} s")
    print(f"{ran} schedules in {time.monotonic() - started:.0f} s, {failed} failed")
    return 1 if failed else 0


def replay(seed: int, events: int) -> int:
    world = World(draw(seed))
    run_world(world)
    print(world.schedule.describe())
    print("\n".join(world.trace[-events:]))
    for violation in world.violations:
        print(f"VIOLATION {violation}")
    return 1 if world.violations else 0


if __name__ == "__main__":
    sys.exit(main())
