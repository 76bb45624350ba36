"""The README's "Try it by hand" runs as written: `sqsworker local` in one shell, the
second block in another with the exports the first printed; the send examples of
docs/operating.md; and the README's idempotency example."""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import sqlite3
import subprocess
from pathlib import Path

import pytest

from ..conftest import wait_until
from ..snippets import ROOT, snippet
from .conftest import BIN, fresh_sqs, local

pytestmark = pytest.mark.integration


def walkthrough() -> list[str]:
    """The shell blocks of the README's "Try it by hand" section, in order."""
    blocks = [
        snippet("README.md", ".venv/bin/sqsworker local --queue orders"),
        snippet("README.md", "sqsworker redrive orders-dlq"),
    ]
    return [block.text.replace(".venv/bin/", f"{BIN}/") for block in blocks]


def test_the_readme_walkthrough_runs_as_written() -> None:
    local_block, shell_block = walkthrough()
    command = local_block.split("#", 1)[0].split()
    assert command[:2] == [f"{BIN}/sqsworker", "local"]
    # The one change: a free port, as 4566 may be taken (by LocalStack, or another run).
    with local(*command[2:]) as exports:
        done = subprocess.run(
            ["bash", "-e", "-c", shell_block],
            env={**os.environ, **exports},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=180,
        )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "sent 3 messages to orders" in out
    assert re.search(r"^orders +3 +0 +0 +orders-dlq +0 +3 ", out, re.M), out
    peeked = out.split("of orders-dlq, each visible again")[1]
    assert '{"id": 3, "kind": "poison"}' in peeked
    assert "why here       SQS moved it from orders, whose maxReceiveCount is 3" in peeked
    assert "moved 1 message from orders-dlq to orders" in out


def test_the_send_examples_of_operating_queues_run_as_written(tmp_path: Path) -> None:
    block = snippet("docs/operating.md", "sqsworker send orders").text
    with fresh_sqs("orders", "payments.fifo") as exports:
        env = {**os.environ, **exports, "PATH": f"{BIN}:{os.environ['PATH']}"}
        run = functools.partial(
            subprocess.run, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
        done = run(["bash", "-e", "-c", block])
        assert done.returncode == 0, done.stderr
        listed = run(["sqsworker", "queues", "--json"])
    rows = {row["name"]: row for row in map(json.loads, listed.stdout.splitlines())}
    assert (rows["orders"]["visible"], rows["orders"]["delayed"]) == (7, 1)
    assert rows["payments.fifo"]["visible"] == 1


def test_the_readme_idempotency_example_runs_each_payment_once(tmp_path: Path) -> None:
    """ "Run each effect once": the handler as written, run with the command as
    written, gets one payment twice; the ledger holds it once, the queue ends empty."""
    handler = snippet("README.md", "def charge(").text
    command = snippet("README.md", "sqsworker run app:charge").text.split("#")[0]
    (tmp_path / "app.py").write_text(handler)
    with fresh_sqs("payments") as exports:
        env = {**os.environ, **exports, "PATH": f"{BIN}:{os.environ['PATH']}"}
        env["PYTHONPATH"] = str(tmp_path)
        send = [str(BIN / "sqsworker"), "send", "payments", '{"payment": {"id": "p-1"}}']
        for _ in range(2):
            subprocess.run(send, env=env, check=True, capture_output=True, timeout=60)
        status = [str(BIN / "sqsworker"), "queues", "payments", "--json"]

        def queues() -> dict[str, dict[str, int]]:
            listed = subprocess.run(status, env=env, capture_output=True, text=True, timeout=60)
            return {r["name"]: r for r in map(json.loads, listed.stdout.splitlines())}

        def drained() -> bool:
            queue = queues()["payments"]
            return queue["visible"] + queue["in_flight"] + queue["delayed"] == 0

        with subprocess.Popen(
            # As written, plus: no metrics port, and short polls so SIGTERM ends it soon.
            [*command.split(), "--metrics-port", "off", "--wait-time", "1"],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ) as worker:
            wait_until(drained, timeout=60, what="the payments queue drained")
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(60) == 0
        assert queues()["payments-dlq"]["visible"] == 0
    with sqlite3.connect(tmp_path / "app.db") as db:
        assert db.execute("SELECT payment, cents FROM ledger").fetchall() == [("p-1", 10)]
