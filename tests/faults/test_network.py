"""Network faults between a worker and SQS: latency, stalls, resets, throttling, 5xx."""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sqsworker.local import LocalSQS

from ..conftest import http_get, wait_until
from ..integration.scenario import Scenario
from .proxy import FaultProxy

pytestmark = pytest.mark.integration


@pytest.fixture
def proxy(local_env: LocalSQS) -> Iterator[FaultProxy]:
    made = FaultProxy(local_env.endpoint_url, seed=5).start()
    yield made
    made.stop()


def serving_port(log: Path) -> int | None:
    for line in log.read_text().splitlines():
        if line.startswith("{") and json.loads(line).get("event", "").startswith("serving"):
            return int(json.loads(line)["port"])
    return None


def errors_by_code(metrics: str) -> dict[str, int]:
    """SQS requests that failed, summed over actions, by error code, from /metrics."""
    totals: dict[str, int] = {}
    pattern = r'^sqsworker_sqs_requests_total\{.*outcome="(\w+)".*\} (\S+)$'
    for code, value in re.findall(pattern, metrics, re.M):
        if code != "success":
            totals[code] = totals.get(code, 0) + int(float(value))
    return totals


def test_the_worker_rides_through_network_faults(
    scenario: Scenario,
    proxy: FaultProxy,
    tmp_path: Path,
    soak: bool,
    report: Callable[[str], None],
) -> None:
    per_phase = 200 if soak else 40
    worker = scenario.worker(
        "--endpoint-url",
        proxy.url,
        "--concurrency",
        "4",
        "--visibility-timeout",
        "5",
        "--backoff-base",
        "0.2",
        "--backoff-max",
        "1",
        "--log-format",
        "json",
    )
    log = tmp_path / "worker-0.log"
    wait_until(lambda: serving_port(log) is not None, timeout=30, what="the worker to start")
    phases = [
        {"latency": 0.1},
        {"reset": 0.3},
        {"stall": 0.2, "stall_seconds": 2.0},
        {"throttle": 0.3, "unavailable": 0.2},
    ]
    sent = 0
    for faults in phases:
        proxy.set(**faults)
        scenario.send("normal", per_phase)
        sent += per_phase
        wait_until(
            lambda n=sent: len(scenario.ledger.count("done")) >= n,
            timeout=120,
            what=f"{sent} messages done under {faults}",
        )
    proxy.set()
    wait_until(lambda: scenario.queue.counts().total == 0, timeout=60, what="the queue to drain")
    injected = {
        code: proxy.injected[fault]
        for code, fault in (
            ("ThrottlingException", "throttle"),
            ("ServiceUnavailable", "unavailable"),
            ("ConnectionError", "reset"),
        )
        if proxy.injected[fault]
    }
    url = f"http://127.0.0.1:{serving_port(log)}/metrics"
    # The metrics name exactly what was injected: every fault that reached the worker
    # (a call answered with a fault just now may still be on its way to being counted).
    wait_until(lambda: errors_by_code(http_get(url)[1]) == injected, timeout=10)
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(60) == 0, scenario.logs()

    done = scenario.ledger.count("done")
    duplicates = sum(n - 1 for n in done.values())
    assert len(done) == sent  # every message processed: none lost
    logs = scenario.logs()
    assert "SQS request failed; retrying" in logs  # each retried call says so
    assert "Traceback" not in logs
    report(
        f"network faults: {sent} sent through {len(phases)} phases, injected "
        f"{dict(proxy.injected)}; processed {len(done)}, duplicates {duplicates}, "
        f"lost {sent - len(done)}"
    )
