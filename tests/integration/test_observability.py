"""Metrics, probes and JSON logs of a real `sqsworker run` process on moto's server."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest

from sqsworker.local import LocalSQS

from ..conftest import http_get, wait_until
from .scenario import Scenario

pytestmark = pytest.mark.integration


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one series in Prometheus' text format (0 when absent)."""
    for line in text.splitlines():
        match = re.match(r"^(\w+)(?:\{(.*)\})? (\S+)$", line)
        if not match or match[1] != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match[2] or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(match[3])
    return 0.0


def served_port(log: Path) -> int:
    for line in log.read_text().splitlines():
        if line.startswith("{") and json.loads(line).get("port"):
            return int(json.loads(line)["port"])
    return 0


def test_metrics_probes_and_json_logs_follow_a_real_run(
    local_env: LocalSQS, tmp_path: Path
) -> None:
    scenario = Scenario(local_env, tmp_path, max_receive_count=1)
    try:
        scenario.send("normal", 20, secret="BODY-MUST-NOT-BE-LOGGED")
        scenario.send("fail", 5)
        worker = scenario.worker("--concurrency", "4", "--log-format", "json")
        log = tmp_path / "worker-0.log"
        wait_until(lambda: served_port(log) > 0, what="the metrics server's address in the log")
        url = f"http://127.0.0.1:{served_port(log)}"

        def scraped() -> str:
            return http_get(url + "/metrics")[1]

        wait_until(
            lambda: (
                metric(scraped(), "sqsworker_deletes_total") == 20
                and metric(scraped(), "sqsworker_messages_failed_total") == 5
            ),
            what="20 deletes and 5 failures",
        )
        text = scraped()
        assert metric(text, "sqsworker_messages_received_total", queue=scenario.name) == 25
        assert metric(text, "sqsworker_messages_succeeded_total") == 20
        assert metric(text, "sqsworker_messages_failed_total", exception="RuntimeError") == 5
        assert metric(text, "sqsworker_messages_dead_lettered_total", reason="max_receives") == 5
        assert metric(text, "sqsworker_messages_retried_total") == 0
        assert metric(text, "sqsworker_handler_duration_seconds_count", outcome="success") == 20
        assert metric(text, "sqsworker_sqs_requests_total", action="ReceiveMessage") > 0
        assert http_get(url + "/healthz")[0] == 200
        assert http_get(url + "/readyz")[0] == 200

        scenario.send("slow", 1, sleep=3)
        wait_until(lambda: scenario.ledger.count("start", "slow"), what="the slow handler")
        worker.send_signal(signal.SIGTERM)
        wait_until(lambda: http_get(url + "/readyz")[0] == 503, what="not ready while stopping")
        assert http_get(url + "/healthz")[0] == 200  # still finishing its message
        assert worker.wait(30) == 0
        assert list(scenario.ledger.count("done", "slow").values()) == [1]

        output = log.read_text()
        records = [json.loads(line) for line in output.splitlines()]  # every line is JSON
        assert "BODY-MUST-NOT-BE-LOGGED" not in output
        assert '"kind"' not in output
        processed = [r for r in records if r["event"] == "message processed"]
        assert len(processed) == 21
        assert all(r["queue"] == scenario.name and r["message_id"] for r in processed)
    finally:
        scenario.close()


def test_a_busy_metrics_port_fails_fast_with_one_sentence(
    local_env: LocalSQS, tmp_path: Path
) -> None:
    scenario = Scenario(local_env, tmp_path)
    try:
        first = scenario.worker()
        wait_until(lambda: served_port(tmp_path / "worker-0.log") > 0, what="the first worker")
        port = str(served_port(tmp_path / "worker-0.log"))
        second = scenario.worker("--metrics-port", port)
        assert second.wait(30) == 1
        text = (tmp_path / "worker-1.log").read_text()
        assert text.startswith(f"sqsworker: error: could not serve metrics on 0.0.0.0:{port}")
        assert text.count("\n") == 1
        first.send_signal(signal.SIGTERM)
        assert first.wait(30) == 0
    finally:
        scenario.close()


def test_metrics_can_be_turned_off(local_env: LocalSQS, tmp_path: Path) -> None:
    scenario = Scenario(local_env, tmp_path)
    try:
        worker = scenario.worker("--metrics-port", "off", "--burst")
        assert worker.wait(30) == 0
        assert "serving /metrics" not in scenario.logs()
    finally:
        scenario.close()
