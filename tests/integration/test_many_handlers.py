"""Several handlers in one `sqsworker run` process, each on its own queue of moto's server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sqsworker.local import LocalSQS

from ..conftest import wait_until
from .scenario import ROOT, Scenario

pytestmark = pytest.mark.integration


def test_two_queues_in_one_process_each_with_its_options_and_one_sigterm(
    local_env: LocalSQS, tmp_path: Path
) -> None:
    """Two handlers, two queues, per-handler options from the command line and from the
    environment; SIGTERM stops both: their running messages finish, the unstarted ones are
    handed back on both queues, and the process exits 0."""
    orders = Scenario(local_env, tmp_path, visibility=30)
    refunds = Scenario(local_env, tmp_path, visibility=30)
    orders.send("a", 8, sleep=2)
    refunds.send("b", 8, sleep=2)
    env = {
        **os.environ,
        **local_env.env(),
        "LEDGER": str(orders.ledger.path),
        "PYTHONPATH": str(ROOT),
        "SQSWORKER_WORK_TOO__QUEUE": refunds.name,  # one handler's option, from the environment
        "SQSWORKER_CONCURRENCY": "2",  # every handler's
    }
    argv = [
        *(sys.executable, "-m", "sqsworker.cli", "run"),
        *("tests.integration.apps:work", "tests.integration.apps:work_too"),
        *("--set", f"work.queue={orders.name}", "--set", "work_too.concurrency=3"),
        *("--wait-time", "1", "--visibility-timeout", "30", "--metrics-port", "0"),
        *("--prefetch", "4"),
    ]
    log_path = tmp_path / "worker-0.log"
    with open(log_path, "wb") as log:
        worker = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    try:

        def started(kind: str) -> int:
            return sum(orders.ledger.count("start", kind).values())

        wait_until(lambda: (started("a"), started("b")) == (2, 3), timeout=30, what="5 starts")
        wait_until(
            lambda: (orders.queue.counts().in_flight, refunds.queue.counts().in_flight) == (6, 7),
            what="each worker holding its running messages and its prefetch",
        )
        signalled = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        # Both queues' unstarted messages are visible again while the running ones run.
        wait_until(
            lambda: (orders.queue.counts().visible, refunds.queue.counts().visible) == (6, 5),
            timeout=10,
            what="the unstarted messages of both queues handed back",
        )
        handed_back_after = time.monotonic() - signalled
        assert worker.wait(30) == 0, log_path.read_text()
        print(
            f"\nSIGTERM -> both queues' unstarted messages visible after {handed_back_after:.2f} s"
        )
    finally:
        if worker.poll() is None:
            worker.kill()
    done = orders.ledger.count("done")
    assert sum(v for k, v in done.items() if k.startswith("a ")) == 2
    assert sum(v for k, v in done.items() if k.startswith("b ")) == 3
    for scenario, left in ((orders, 6), (refunds, 5)):
        counts = scenario.queue.counts()
        assert (counts.visible, counts.in_flight) == (left, 0)
    lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
    started_lines = {
        (e["queue"], e["concurrency"]) for e in lines if e["event"] == "worker started"
    }
    assert started_lines == {(orders.name, 2), (refunds.name, 3)}
    summaries = {e["handler"]: e["succeeded"] for e in lines if e["event"] == "summary"}
    assert summaries == {
        "tests.integration.apps.work": 2,
        "tests.integration.apps.work_too": 3,
    }


def test_a_handler_that_cannot_start_is_named_at_once_and_the_others_stop(
    local_env: LocalSQS, tmp_path: Path
) -> None:
    orders = Scenario(local_env, tmp_path, visibility=30)
    env = {
        **os.environ,
        **local_env.env(),
        "LEDGER": str(orders.ledger.path),
        "PYTHONPATH": str(ROOT),
    }
    argv = [
        *(sys.executable, "-m", "sqsworker.cli", "run"),
        *("tests.integration.apps:work", "tests.integration.apps:work_too"),
        *("--set", f"work.queue={orders.name}", "--set", "work_too.queue=no-such-queue"),
        *("--wait-time", "1", "--metrics-port", "0"),
    ]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    [error] = [n for n, line in enumerate(lines) if line.startswith("sqsworker: error: ")]
    assert lines[error].startswith(
        "sqsworker: error: handler work_too: queue 'no-such-queue' does not exist"
    )
    events = {json.loads(line)["event"]: n for n, line in enumerate(lines) if line.startswith("{")}
    # Said before the handler that did start is stopped (which waits out its long poll).
    assert events["worker started"] < error < events["stopped"]
