"""Fixtures of the unit tests that read what the worker reports: its metrics and its
JSON log lines."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest
import structlog

from sqsworker import log_output
from sqsworker.clock import FakeClock
from sqsworker.logs import configure
from sqsworker.metrics import Metrics


class LogStream(io.StringIO):
    """Where the log lines go in a test: reading it writes out the lines still gathered
    (an INFO line reaches the stream within 0.05 s, from a thread of its own)."""

    def getvalue(self) -> str:
        log_output.flush()
        return super().getvalue()


@pytest.fixture
def metrics(clock: FakeClock) -> Metrics:
    return Metrics("jobs", "tests.handler", clock=clock)


@pytest.fixture
def json_logs(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    """Every log line the process writes, as JSON, in a string."""
    stream = LogStream()
    monkeypatch.setattr("sys.stderr", stream)
    configure("info", "json")
    yield stream
    structlog.reset_defaults()
    logging.getLogger().handlers = []


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(
        name, {"queue": "jobs", "handler": "tests.handler", **labels}
    )
    return 0.0 if value is None else value
