"""`sqsworker local`: the embedded SQS endpoint a developer starts by hand."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sqsworker.transports.sqs import SQSTransport

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def test_local_serves_queues_with_dead_letter_queues_and_prints_the_env(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sqsworker.cli",
            "local",
            "--port",
            "0",
            "--queue",
            "orders",
            "--queue",
            "payments.fifo",
            "--max-receive-count",
            "4",
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert proc.stdout is not None
        exports: dict[str, str] = {}
        for line in proc.stdout:
            if line.startswith("export "):
                key, _, value = line.removeprefix("export ").strip().partition("=")
                exports[key] = value
            if line.startswith("# queue payments.fifo"):
                break
        for key, value in exports.items():
            monkeypatch.setenv(key, value)
        orders = SQSTransport.connect("orders")
        assert orders.info.max_receive_count == 4
        assert (orders.info.dead_letter_arn or "").endswith(":orders-dlq")
        payments = SQSTransport.connect("payments.fifo")
        assert payments.info.fifo
        assert (payments.info.dead_letter_arn or "").endswith(":payments-dlq.fifo")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
