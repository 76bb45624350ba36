"""Real `sqsworker run` processes on a queue of moto's server, and their ledger."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from sqsworker.local import LocalSQS
from sqsworker.transports import Transport, send_all
from sqsworker.transports.sqs import SQSTransport

from ..conftest import unique, written_lines

ROOT = Path(__file__).resolve().parents[2]


def command(queue: str, *args: str, handler: str = "work") -> list[str]:
    """`sqsworker run` of a test handler in ``apps.py`` on ``queue``."""
    return [
        sys.executable,
        "-m",
        "sqsworker.cli",
        "run",
        f"tests.integration.apps:{handler}",
        "--queue",
        queue,
        *args,
    ]


def run_to_exit(queue: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run a worker that is expected to stop by itself (a start-up failure). Its metrics
    server takes a free port (``args`` may say otherwise): the default, 9000, may be taken."""
    return subprocess.run(
        command(queue, "--metrics-port", "0", *args),
        env=env,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )


class Ledger:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.touch()

    def lines(self) -> list[list[str]]:
        return [line.split() for line in written_lines(self.path)]

    def count(self, event: str, kind: str | None = None) -> Counter[str]:
        return Counter(
            f"{k} {i}" for e, k, i, _, _ in self.lines() if e == event and kind in (None, k)
        )


class Scenario:
    def __init__(
        self,
        server: LocalSQS,
        tmp_path: Path,
        *,
        max_receive_count: int = 3,
        visibility: int = 2,
        fifo: bool = False,
    ):
        self.server = server
        self.name = unique("orders") + (".fifo" if fifo else "")
        server.create_queue(
            self.name, max_receive_count=max_receive_count, visibility_timeout=visibility
        )
        self.queue: Transport = SQSTransport.connect(
            self.name, endpoint_url=server.endpoint_url, region="us-east-1"
        )
        dlq = self.name.removesuffix(".fifo") + "-dlq" + (".fifo" if fifo else "")
        self.dlq: Transport = self.queue.open(dlq)
        self.ledger = Ledger(tmp_path / "ledger.txt")
        self.tmp_path = tmp_path
        self.procs: list[subprocess.Popen[bytes]] = []

    def send(self, kind: str, count: int, **extra: Any) -> None:
        start = sum(1 for _ in self.ledger.lines())  # ids only need to be unique per kind
        send_all(
            self.queue, [json.dumps({"kind": kind, "id": start + i, **extra}) for i in range(count)]
        )

    def worker(self, *args: str, handler: str = "work") -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            **self.server.env(),
            "LEDGER": str(self.ledger.path),
            "HOLD_DIR": str(self.tmp_path),
            "PYTHONPATH": str(ROOT),
        }
        with open(self.tmp_path / f"worker-{len(self.procs)}.log", "wb") as log:
            proc = subprocess.Popen(
                command(
                    self.name, "--wait-time", "1", "--metrics-port", "0", *args, handler=handler
                ),
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
            )
        self.procs.append(proc)
        return proc

    def drained(self) -> bool:
        """The queue holds nothing, read twice half a second apart: moto counts visible
        and in-flight messages one after the other, so a lease that runs out between the
        two reads is counted in neither."""
        if self.queue.counts().total:
            return False
        threading.Event().wait(0.5)
        return self.queue.counts().total == 0

    def logs(self) -> str:
        return "\n".join(p.read_text() for p in sorted(self.tmp_path.glob("worker-*.log")))

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
