"""The receive side on a real HTTP endpoint (moto's server behind a proxy that adds
20 ms to every request, as real SQS takes): receives overlap while the queue is busy,
one long poll waits while it is idle, and SIGTERM waits that poll out and says so."""

from __future__ import annotations

import signal
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from ..conftest import wait_until
from ..faults.proxy import FaultProxy
from .scenario import Scenario

pytestmark = pytest.mark.integration


class Counting(FaultProxy):
    """Counts the ReceiveMessage requests under way at once, and all of them."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.receiving = 0
        self.most = 0
        self.receives = 0
        self._counts = threading.Lock()

    def _handle(self, request: BaseHTTPRequestHandler) -> None:
        receive = request.headers.get("X-Amz-Target", "").endswith(".ReceiveMessage")
        if receive:
            with self._counts:
                self.receiving += 1
                self.receives += 1
                self.most = max(self.most, self.receiving)
        try:
            super()._handle(request)
        finally:
            if receive:
                with self._counts:
                    self.receiving -= 1


def test_receives_overlap_while_busy_and_one_long_poll_waits_while_idle(
    scenario: Scenario, tmp_path: Path
) -> None:
    proxy = Counting(scenario.server.endpoint_url).start()
    proxy.set(latency=0.02)
    try:
        scenario.send("ok", 400, sleep=0.01)
        worker = scenario.worker(
            "--endpoint-url",
            proxy.url,
            "--concurrency",
            "40",
            "--wait-time",
            "2",
            "--visibility-timeout",
            "30",
        )
        wait_until(lambda: scenario.ledger.count("done").total() == 400, timeout=120)
        assert proxy.most >= 2, "receives went one after another while the queue was full"

        # Idle: the receives under way when the queue ran dry end within a long poll;
        # from then on one long poll at a time.
        wait_until(lambda: proxy.receiving <= 1, timeout=10)
        with proxy._counts:
            proxy.most = proxy.receiving
            seen = proxy.receives
        wait_until(lambda: proxy.receives >= seen + 3, timeout=15)  # three 2 s long polls
        assert proxy.most == 1

        wait_until(lambda: proxy.receiving == 1, timeout=5)  # a long poll under way
        asked = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=15) == 0
        took = time.monotonic() - asked
        assert took < 2 + 2, took  # the long poll's rest, and the exit
        logs = scenario.logs()
        assert "waiting for the receives under way to end" in logs
        assert scenario.ledger.count("done").total() == 400  # each once
        assert scenario.drained()
    finally:
        proxy.stop()
