from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from sqsworker.local import LocalSQS

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
    """`sqsworker local ARGV --port 0` in its own process (moto's backend is one per
    process: queues named as in the docs must not meet other tests' queues); yields the
    environment it printed."""
    command = [str(BIN / "sqsworker"), "local", *argv, "--port", "0"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=ROOT) as server:
        try:
            assert server.stdout is not None
            exports: dict[str, str] = {}
            for line in server.stdout:
                if line.startswith("export "):
                    key, _, value = line.removeprefix("export ").strip().partition("=")
                    exports[key] = value
                if line.startswith("# queue") and line.split()[2] == argv[-1]:
                    break
            yield exports
        finally:
            server.terminate()
