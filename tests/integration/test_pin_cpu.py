"""``--pin-cpu``: every thread of a running `sqsworker run` on one CPU, against moto's
server."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from sqsworker.cpu import pin_to_one

from ..conftest import wait_until
from .scenario import Scenario

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


def test_pinning_holds_for_the_thread_and_those_it_starts_not_others() -> None:
    before = os.sched_getaffinity(0)
    seen: dict[str, set[int]] = {}

    def child() -> None:
        seen["child"] = os.sched_getaffinity(0)

    def pinned() -> None:
        seen["cpu"] = {pin_to_one()}
        seen["pinned"] = os.sched_getaffinity(0)
        thread = threading.Thread(target=child)
        thread.start()
        thread.join()

    thread = threading.Thread(target=pinned)
    thread.start()
    thread.join()
    assert seen["pinned"] == seen["child"] == seen["cpu"]
    assert seen["cpu"] <= before
    assert os.sched_getaffinity(0) == before  # this thread, and the process's others, free
