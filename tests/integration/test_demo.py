"""`make demo` runs examples/demo.py: it must finish and account for every order."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from .scenario import ROOT

pytestmark = pytest.mark.integration


def test_the_demo_accounts_for_every_order() -> None:
    result = subprocess.run(
        [sys.executable, "examples/demo.py"], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {
        m[1]: tuple(int(n) for n in m.groups()[1:])
        for m in re.finditer(r"^\s+(\w+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s", result.stdout, re.M)
    }
    # kind: (sent, runs, done, in the dead-letter queue)
    assert rows["normal"] == (20, 20, 20, 0)
    assert rows["slow"] == (3, 3, 3, 0)
    assert rows["poison"] == (2, 6, 0, 2)
    assert rows["duplicate"] == (6, 3, 3, 0)  # each copy deleted unrun
    assert "0 lost." in result.stdout
    assert "sqsworker_duplicates_suppressed_total 3.0" in result.stdout
    # The metrics block is a scrape taken after the last message settled: it agrees with
    # the table.
    done = int(re.search(r"(\d+) done,", result.stdout)[1])  # type: ignore[index]
    assert f"sqsworker_messages_succeeded_total {done}.0" in result.stdout
    assert "after the last message settled" in result.stdout
    assert result.stdout.rstrip().endswith("sqsworker run examples.orders:process")
    # The worker's console lines: a failure in one line, but for the poison orders' last
    # attempts, each with the handler's frame alone; a key shown only when it is not the id.
    logs = result.stderr
    last = logs.count("failed on its last attempt")
    assert last >= 1 and logs.count("Traceback (most recent call last):") == last, logs
    assert logs.count('examples/orders.py", line') == last and "worker.py" not in logs
    keys = re.findall(r"idempotency_key=(\S+) message_id=(\S+)", logs)
    assert keys and all(key.startswith("order-") and key != id_ for key, id_ in keys)
