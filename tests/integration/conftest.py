from __future__ import annotations

import atexit
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from sqsworker.local import LocalSQS
from sqsworker.operate import default_max_receives

from .scenario import ROOT, Scenario

BIN = Path(sys.executable).parent  # the docs' .venv/bin, wherever this suite's venv is


@pytest.fixture
def local_env(local_sqs: LocalSQS, monkeypatch: pytest.MonkeyPatch) -> LocalSQS:
    """The embedded SQS, with this process's environment pointing at it."""
    for key, value in local_sqs.env().items():
        monkeypatch.setenv(key, value)
    return local_sqs


@pytest.fixture
def scenario(local_env: LocalSQS, tmp_path: Path) -> Iterator[Scenario]:
    made = Scenario(local_env, tmp_path)
    yield made
    made.close()


@contextmanager
def local(*argv: str) -> Iterator[dict[str, str]]:
    """`sqsworker local ARGV --port 0` in its own process, for the tests of that command;
    yields the environment it printed. A test that only needs an endpoint with queues
    of fixed names takes ``fresh_sqs`` instead: the same server, started once."""
    command = [str(BIN / "sqsworker"), "local", *argv, "--port", "0"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=ROOT) as server:
        try:
            yield _exports(server, argv[-1] if argv else None)
        finally:
            server.terminate()


def _exports(server: subprocess.Popen[str], last_queue: str | None) -> dict[str, str]:
    """The environment `sqsworker local` printed, read until it reported ``last_queue``
    (or, creating none, until its last export)."""
    assert server.stdout is not None
    exports: dict[str, str] = {}
    for line in server.stdout:
        if line.startswith("export "):
            key, _, value = line.removeprefix("export ").strip().partition("=")
            exports[key] = value
            if last_queue is None and key == "AWS_SECRET_ACCESS_KEY":  # the last one
                break
        if line.startswith("# queue") and line.split()[2] == last_queue:
            break
    return exports


class Endpoint(LocalSQS):
    """A moto server serving elsewhere, by its URL: LocalSQS's client, environment and
    queue creation, without a server of its own to start."""

    def __init__(self, endpoint_url: str) -> None:  # no super().__init__(): nothing to serve
        self.endpoint_url = endpoint_url


_SHARED: list[tuple[subprocess.Popen[str], Endpoint]] = []


def _shared_server() -> Endpoint:
    """One `sqsworker local --port 0` for this test process, started on first use."""
    if not _SHARED:
        command = [str(BIN / "sqsworker"), "local", "--port", "0"]
        server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        atexit.register(lambda: (server.terminate(), server.wait(30)))
        _SHARED.append((server, Endpoint(_exports(server, None)["AWS_ENDPOINT_URL_SQS"])))
    return _SHARED[0][1]


@contextmanager
def fresh_sqs(*queues: str) -> Iterator[dict[str, str]]:
    """What `sqsworker local --queue Q ...` gives, without starting one each time: an
    endpoint holding ``queues`` alone (each with its dead-letter queue, as `local` makes
    them), nothing of an earlier test (no queue, message, table or bucket); yields its
    environment. moto's backend is one per process, so this is one `sqsworker local`
    process of its own (queues named as in the docs must not meet the queues of the
    in-process server other tests share), wiped before each use."""
    server = _shared_server()
    wipe = urllib.request.Request(f"{server.endpoint_url}/moto-api/reset", method="POST")
    with urllib.request.urlopen(wipe, timeout=30) as answer:
        assert answer.status == 200
    for name in queues:
        server.create_queue(name, max_receive_count=default_max_receives(name.endswith(".fifo")))
    yield server.env()
