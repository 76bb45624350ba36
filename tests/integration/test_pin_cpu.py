"""``--pin-cpu``: every thread of a running `sqsworker run` on one CPU, against moto's
server."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ..conftest import wait_until
from .scenario import ROOT, Scenario

pytestmark = pytest.mark.integration


def _allowed(pid: int) -> dict[str, str]:
    """Each live thread of ``pid``: the CPUs it may run on (``Cpus_allowed_list``)."""
    allowed = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except FileNotFoundError:  # the thread ended
            continue
        line = next(x for x in status.splitlines() if x.startswith("Cpus_allowed_list:"))
        allowed[task.name] = line.split(":", 1)[1].strip()
    return allowed


def test_every_thread_of_a_pinned_worker_runs_on_one_cpu(scenario: Scenario) -> None:
    scenario.send("slow", 4, sleep=3)
    worker = scenario.worker("--pin-cpu", "--concurrency", "4", "--burst")
    # Running: its handler, receive and lease threads all exist.
    wait_until(lambda: len(scenario.ledger.count("start")) == 4, timeout=60, what="4 started")
    allowed = _allowed(worker.pid)
    assert len(allowed) > 8  # the handler threads and the worker's own
    assert len(set(allowed.values())) == 1, allowed
    (cpu,) = set(allowed.values())
    assert int(cpu) in os.sched_getaffinity(0)
    wait_until(lambda: worker.poll() is not None, timeout=60, what="the worker to drain")
    assert worker.returncode == 0, scenario.logs()
    assert all(n == 1 for n in scenario.ledger.count("done").values())
    assert f'"cpu":{cpu}' in scenario.logs().replace(" ", "")


def test_pinning_holds_for_every_thread_started_before_and_after() -> None:
    """In a process of its own (the pin is the whole process's): a thread started before
    the pin (as a handler's module may on import) is pinned too, and so is one after."""
    program = textwrap.dedent(
        """
        import os, threading
        from sqsworker.cpu import pin_to_one
        before = os.sched_getaffinity(0)
        go, seen = threading.Event(), {}
        def early():
            go.wait()
            seen["early"] = os.sched_getaffinity(0)
        thread = threading.Thread(target=early)
        thread.start()
        cpu = pin_to_one()
        later = threading.Thread(target=lambda: seen.update(later=os.sched_getaffinity(0)))
        later.start()
        later.join()
        go.set()
        thread.join()
        assert cpu in before, (cpu, before)
        assert seen == {"early": {cpu}, "later": {cpu}}, seen
        assert os.sched_getaffinity(0) == {cpu}
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.stdout.strip() == "ok", done.stderr
