"""The per-message metric families: each thread counts on its own, no lock, nothing lost,
and a scrape reads exactly what prometheus_client's own families would."""

from __future__ import annotations

import gc
import random
import sys
import threading
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from sqsworker.metrics import DURATION_BUCKETS, TallyFamily


@pytest.fixture
def switching_often() -> Iterator[None]:
    """The interpreter handed between threads every microsecond, so that an increment
    split between its read and its write by another thread's would be lost."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def _lines(registry: CollectorRegistry) -> list[str]:
    """The exposition, less the ``_created`` lines (each family's own moment)."""
    text = generate_latest(registry).decode()
    return [line for line in text.splitlines() if "_created" not in line]


def test_threads_counting_at_once_lose_nothing(switching_often: None) -> None:
    family = TallyFamily("histogram", "took", "Took.", ["queue"], buckets=(1, 2, 3))
    counter = TallyFamily("counter", "seen", "Seen.", ["queue"])
    took, seen = family.labels(queue="q"), counter.labels(queue="q")

    def count() -> None:
        for i in range(20_000):
            took.observe(i % 4)  # 0 and 1 in the first bucket, 2, 3
            seen.inc()

    threads = [threading.Thread(target=count) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    counted = [80_000.0, 40_000.0, 40_000.0, 0.0, 8 * 5_000 * 6.0]
    assert took.read() == counted
    assert seen.read()[-1] == 160_000
    # Each thread's counts outlive it, and once it is gone they are summed in with the
    # others that went: threads that come and go leave no list behind.
    del threads, thread
    gc.collect()
    assert took.read() == counted and seen.read()[-1] == 160_000
    assert took._lists == [] and seen._lists == []


def test_a_scrape_reads_what_prometheus_clients_own_families_would() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    labels = ["queue", "handler", "outcome"]
    tally = TallyFamily("histogram", "took_seconds", "Took.", labels, buckets=DURATION_BUCKETS)
    ours.register(tally)
    histogram = Histogram(
        "took_seconds", "Took.", labels, buckets=DURATION_BUCKETS, registry=theirs
    )
    ours.register(counted := TallyFamily("counter", "done", "Done.", labels))
    counter = Counter("done", "Done.", labels, registry=theirs)
    rng = random.Random(7)
    for _ in range(2_000):
        # On a bound, between them, past the last; and integers, as receive counts are.
        value = rng.choice([*DURATION_BUCKETS, rng.uniform(0, 1000), float(rng.randrange(20))])
        key = {"queue": "q", "handler": "h", "outcome": rng.choice(["success", "failure"])}
        tally.labels(**key).observe(value)
        histogram.labels(**key).observe(value)
        counted.labels(**key).inc(3)
        counter.labels(**key).inc(3)
    assert _lines(ours) == _lines(theirs)
    created = [line for line in generate_latest(ours).decode().splitlines() if "_created{" in line]
    assert len(created) == 4  # a moment for each of the four series, as theirs have


def test_a_family_with_no_series_yet_is_exported_empty() -> None:
    registry = CollectorRegistry()
    registry.register(TallyFamily("histogram", "took", "Took.", ["queue"], buckets=(1,)))
    families = list(registry.collect())
    assert [(f.name, f.type, f.samples) for f in families] == [("took", "histogram", [])]
