"""`sqsworker run` sets the cyclic garbage collector for a worker's process: what startup
left alive is frozen, and young collections come every 10,000 allocations."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from sqsworker.process import YOUNG_COLLECTION_AFTER

from ..conftest import wait_until
from .scenario import ROOT, Scenario

pytestmark = pytest.mark.integration


def test_a_handler_runs_with_the_startup_heap_frozen_and_young_collections_spaced(
    scenario: Scenario,
) -> None:
    scenario.send("gc", 1)
    worker = scenario.worker("--burst", handler="collector")
    wait_until(lambda: worker.poll() is not None, timeout=60, what="the worker to drain")
    assert worker.returncode == 0, scenario.logs()
    ((_, young, frozen, _, _),) = [line for line in scenario.ledger.lines() if line[0] == "gc"]
    assert int(young) == YOUNG_COLLECTION_AFTER
    assert int(frozen) > 10_000  # the modules, classes and functions imported at startup


def test_what_startup_left_unreachable_is_collected_not_frozen() -> None:
    """In a process of its own (freezing is the whole process's): a cycle dropped before
    ``settle_heap`` is freed, and a young threshold set higher is kept."""
    program = textwrap.dedent(
        """
        import gc, weakref
        from sqsworker.process import settle_heap
        gc.disable()  # nothing collects the cycle below but settle_heap
        gc.set_threshold(50_000, 5, 5)
        class Node: pass
        node = Node(); node.me = node
        left = weakref.ref(node)
        del node
        settle_heap()
        assert left() is None, "frozen with the live heap"
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (50_000, 5, 5), gc.get_threshold()
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.stdout.strip() == "ok", done.stderr
