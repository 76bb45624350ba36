from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sqsworker.clock import FakeClock
from sqsworker.local import LocalSQS
from sqsworker.transports.memory import MemorySQS

from .postgres import PostgresServer

DEFAULT_METRICS_PORT = 9000  # --metrics-port's default
# The user property of a fault-injection scenario's line for the closing summary
# (tests/faults/conftest.py): a test's properties travel with its report, so the lines
# reach the summary from a worker process too when pytest-xdist runs the suite.
FAULT_REPORT = "fault injection"
FAULT_REPORTS: list[str] = []


def written_lines(path: Path) -> list[str]:
    """The lines of a file other processes append to, each whole: a line whose write is
    still under way (read before its newline is there) is not one yet."""
    text = path.read_text()
    return text[: text.rfind("\n") + 1].splitlines()


def wait_until(
    predicate: Callable[[], bool],
    timeout: float = 15.0,
    what: str | Callable[[], str] = "",
) -> None:
    """Wait on state: return once ``predicate()`` holds; fail the test after ``timeout``.
    ``what`` names what was awaited (a callable: read when the wait fails, so it can tell
    the state then)."""
    deadline = time.monotonic() + timeout
    event = threading.Event()
    while not predicate():
        if time.monotonic() > deadline:
            told = what() if callable(what) else what
            pytest.fail(f"timed out waiting for {told or predicate}")
        event.wait(0.005)


def http_get(url: str) -> tuple[int, str]:
    """GET ``url``: its status and body, error statuses included."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read().decode()


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def default_metrics_port_taken() -> Iterator[None]:
    """Port 9000, the default --metrics-port, held while the test runs (if something else
    already holds it, so much the better): a test must not depend on it being free."""
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            holder.bind(("0.0.0.0", DEFAULT_METRICS_PORT))
            holder.listen()
        except OSError:
            pass  # taken already
        yield


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A real PostgreSQL server for the session (tests/postgres.py); each test names a
    table of its own (``postgres.url_for(unique(...))``)."""
    server = PostgresServer()
    try:
        yield server.start()
    finally:
        server.close()


@pytest.fixture(scope="session")
def local_sqs() -> Iterator[LocalSQS]:
    with LocalSQS(port=0) as server:
        yield server


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def memory(clock: FakeClock) -> MemorySQS:
    return MemorySQS(clock)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On several worker processes (pytest-xdist's `-n N --dist loadgroup`), the Spark
    tests stay together on one: each worker would otherwise start its own SparkSession
    and standalone cluster for the session."""
    if config.pluginmanager.hasplugin("xdist"):
        for item in items:
            if item.nodeid.startswith("tests/spark/"):
                item.add_marker(pytest.mark.xdist_group("spark"))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call":
        FAULT_REPORTS.extend(str(v) for name, v in report.user_properties if name == FAULT_REPORT)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if FAULT_REPORTS:
        terminalreporter.section("fault injection: what each scenario did")
        for line in FAULT_REPORTS:
            terminalreporter.write_line(line)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak",
        action="store_true",
        help="run the fault-injection scenarios longer, with more messages and more kills",
    )
