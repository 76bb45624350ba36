"""Workers killed with SIGKILL at random moments and restarted, as a crash-looping pod would be."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from sqsworker.transports import OutgoingMessage, send_all

from ..conftest import wait_until
from ..integration.scenario import Scenario
from ..integration.test_idempotency import Effects, keyed, suppressed
from ..integration.test_idempotency import effects as effects  # the fixture: SQLite, PostgreSQL

pytestmark = pytest.mark.integration


def test_random_kills_lose_nothing_and_repeat_no_effect(
    scenario: Scenario,
    tmp_path: Path,
    effects: Effects,
    soak: bool,
    report: Callable[[str], None],
) -> None:
    normal, poison, chaos_seconds = (1500, 20, 90.0) if soak else (300, 6, 12.0)
    options = [
        "--visibility-timeout",
        "3",
        "--concurrency",
        "4",
        "--idempotency-store",
        effects.store,
        "--log-format",
        "json",
    ]
    keys = [f"order-{i}" for i in range(normal)]
    send_all(scenario.queue, [keyed(k) for k in keys])
    poison_ids = set(
        send_all(scenario.queue, [OutgoingMessage(f"<poison {i}/>") for i in range(poison)])
    )

    def start() -> subprocess.Popen[bytes]:
        return scenario.worker(*options, handler="pay")

    workers = [start() for _ in range(3)]
    rng = random.Random(11)
    kills = 0
    pause = threading.Event()
    deadline = chaos_seconds
    while deadline > 0 and scenario.queue.counts().total > 0:
        wait = rng.uniform(0.3, 1.5)
        pause.wait(wait)
        deadline -= wait
        victim = rng.choice(workers)
        victim.kill()  # SIGKILL: no handing back, no deletes flushed
        victim.wait()
        kills += 1
        workers[workers.index(victim)] = start()

    wait_until(
        scenario.drained,
        timeout=900 if soak else 180,
        what="the survivors to drain",
    )
    logs = [tmp_path / f"worker-{scenario.procs.index(w)}.log" for w in workers]
    wait_until(
        lambda: all('"worker started"' in log.read_text() for log in logs),
        what="every worker to be up (its signal handlers in place) before SIGTERM",
    )
    for worker in workers:
        worker.send_signal(signal.SIGTERM)
    assert [w.wait(60) for w in workers] == [0, 0, 0], scenario.logs()

    ledger = effects.per_key()
    dead = []
    while batch := scenario.dlq.receive(10, 1, 30):
        dead += batch
    missing = sorted(set(keys) - set(ledger))
    where = {
        k: [m.body for m in dead if m.body.startswith("{") and json.loads(m.body)["key"] == k]
        for k in missing
    }
    assert not missing, f"not processed: {missing}; of them in the DLQ: {where}"
    assert set(ledger.values()) == {1}, {k: n for k, n in ledger.items() if n > 1}
    sources = Counter(
        m.message_attributes["sqsworker-source-message-id"]["StringValue"] for m in dead
    )
    assert set(sources) == poison_ids  # exactly the poison messages reached the DLQ
    redelivered = sum(
        1
        for line in scenario.logs().splitlines()
        if line.startswith("{")
        and json.loads(line).get("event") == "message processed"
        and json.loads(line).get("receive_count", 1) > 1
    )
    report(
        f"SIGKILL chaos ({effects.store.split(':')[0]}): {kills} kills in "
        f"{chaos_seconds:.0f} s, 3 workers; {normal} messages "
        f"processed once each (0 lost, 0 effects twice), {redelivered} run again after a kill, "
        f"{sum(suppressed(scenario.logs()).values())} duplicates suppressed; "
        f"{len(sources)} of {poison} poison messages in the DLQ "
        f"({sum(sources.values())} copies)"
    )
