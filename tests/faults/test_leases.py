"""A worker paused past its visibility timeout (a long GC pause, a frozen VM)."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ..conftest import http_get, wait_until
from ..integration.scenario import Scenario
from .test_network import serving_port

pytestmark = pytest.mark.integration


def test_a_paused_worker_loses_its_lease_and_never_reports_the_message_done(
    scenario: Scenario, tmp_path: Path, report: Callable[[str], None]
) -> None:
    options = ["--visibility-timeout", "3", "--log-format", "json"]
    workers = [scenario.worker(*options), scenario.worker(*options)]
    logs = [tmp_path / "worker-0.log", tmp_path / "worker-1.log"]
    wait_until(lambda: all(serving_port(log) for log in logs), timeout=30, what="both up")
    scenario.send("normal", 1, sleep=1)
    wait_until(lambda: bool(scenario.ledger.count("start")), what="a handler to start")
    [(_, _, _, _, pid)] = [line for line in scenario.ledger.lines() if line[0] == "start"]
    paused = next(i for i, w in enumerate(workers) if w.pid == int(pid))
    stopped = time.monotonic()
    os.kill(int(pid), signal.SIGSTOP)  # the lease (3 s) lapses: nothing renews it
    try:
        wait_until(
            lambda: len(scenario.ledger.count("done")) == 1, what="the other worker to finish it"
        )
    finally:
        os.kill(int(pid), signal.SIGCONT)
    paused_for = time.monotonic() - stopped
    wait_until(lambda: "lease lost" in logs[paused].read_text(), what="the loss to be logged")
    wait_until(
        lambda: sum(1 for line in scenario.ledger.lines() if line[0] == "done") == 2,
        what="the paused handler to finish too",
    )
    _, metrics = http_get(f"http://127.0.0.1:{serving_port(logs[paused])}/metrics")
    for worker in workers:
        worker.send_signal(signal.SIGTERM)
    assert [w.wait(30) for w in workers] == [0, 0], scenario.logs()

    counted = {
        name: float(value)
        for name, value in (line.rsplit(" ", 1) for line in metrics.splitlines())
        if name.startswith(("sqsworker_deletes_total", "sqsworker_leases_lost_total"))
    }
    assert sum(v for k, v in counted.items() if k.startswith("sqsworker_deletes")) == 0
    assert sum(v for k, v in counted.items() if k.startswith("sqsworker_leases_lost")) == 1
    events = [
        json.loads(line)["event"]
        for line in logs[paused].read_text().splitlines()
        if line.startswith("{")
    ]
    assert any(e.startswith("lease lost") for e in events)
    assert scenario.queue.counts().total == 0
    report(
        f"lease fault: a worker stopped for {paused_for:.1f} s mid-handler (visibility 3 s); "
        "the other worker processed the message; the paused one logged the lost lease and "
        "counted 0 deletes, 1 lease lost (its handler's effect ran twice: at least once, as "
        "documented)"
    )
