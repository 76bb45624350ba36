"""The README's "Try it by hand" runs as written: `sqsworker local` in one shell, the
second block in another with the exports the first printed; and the send examples of
docs/operating.md."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sqsworker.local import LocalSQS
from sqsworker.transports.sqs import SQSTransport

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the README's .venv/bin, wherever this suite's venv is


def walkthrough() -> list[str]:
    """The shell blocks of the README's "Try it by hand" section, in order."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Try it by hand", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    return [block.replace(".venv/bin/", f"{BIN}/") for block in blocks]


def test_the_readme_walkthrough_runs_as_written() -> None:
    local_block, shell_block = walkthrough()
    command = local_block.split("#", 1)[0].split()
    # The one change: a free port, as 4566 may be taken (by LocalStack, or another run).
    server = subprocess.Popen(
        [*command, "--port", "0"], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        assert server.stdout is not None
        exports: dict[str, str] = {}
        for line in server.stdout:
            if line.startswith("export "):
                key, _, value = line.removeprefix("export ").strip().partition("=")
                exports[key] = value
            if line.startswith("# queue orders"):
                break
        done = subprocess.run(
            ["bash", "-e", "-c", shell_block],
            env={**os.environ, **exports},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=180,
        )
    finally:
        server.terminate()
        server.wait(30)
        if server.stdout is not None:
            server.stdout.close()
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "sent 3 messages to orders" in out
    assert re.search(r"^orders +3 +0 +0 +orders-dlq +0 +3 ", out, re.M), out
    assert '{"id": 3, "kind": "poison"}' in out.split("of orders-dlq, each visible again")[1]
    assert "moved 1 message from orders-dlq to orders" in out


def test_the_send_examples_of_operating_queues_run_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = (ROOT / "docs" / "operating.md").read_text()
    (block,) = [b for b in re.findall(r"```sh\n(.*?)```", text, re.S) if "sqsworker send" in b]
    with LocalSQS(port=0) as server:
        server.create_queue("orders")
        server.create_queue("payments.fifo")
        done = subprocess.run(
            ["bash", "-e", "-c", block],
            env={**os.environ, **server.env(), "PATH": f"{BIN}:{os.environ['PATH']}"},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        for key, value in server.env().items():
            monkeypatch.setenv(key, value)
        orders, payments = SQSTransport.connect("orders"), SQSTransport.connect("payments.fifo")
        assert (orders.counts().visible, orders.counts().delayed) == (7, 1)
        assert payments.counts().visible == 1
