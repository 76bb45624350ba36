"""Typed handlers in real `sqsworker run` processes on moto's server: a valid body is
given as the model, an invalid one goes to the dead-letter queue at its first receive,
unrun, with the fields that failed and why (never the body's values)."""

from __future__ import annotations

import json

import pytest

from sqsworker.transports import send_all

from ..conftest import wait_until
from .scenario import Scenario

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("handler", ["typed", "typed_async"])
def test_valid_bodies_run_and_invalid_ones_are_dead_lettered_unrun(
    scenario: Scenario, handler: str
) -> None:
    valid = [{"kind": "order", "id": i, "total": 10 * i} for i in range(8)]
    invalid = [
        {"kind": "order", "id": 100, "total": "secret-1234"},  # not a whole number
        {"kind": "order", "total": 5},  # no id
        "not json at all",
    ]
    send_all(scenario.queue, [json.dumps(b) for b in valid] + [json.dumps(invalid[0])])
    send_all(scenario.queue, [json.dumps(invalid[1]), invalid[2]])
    worker = scenario.worker("--burst", handler=handler)
    wait_until(lambda: worker.poll() is not None, timeout=60, what="the burst to end")
    assert worker.returncode == 0, scenario.logs()

    assert sorted(scenario.ledger.count("done")) == sorted(f"order {i}" for i in range(8))
    dead = scenario.dlq.receive(10, 0, 30)
    assert len(dead) == 3
    reasons = sorted(m.message_attributes["sqsworker-error"]["StringValue"] for m in dead)
    assert all(r.startswith("MessageValidationError: ") for r in reasons)
    assert any("total:" in r for r in reasons) and any("id:" in r for r in reasons)
    assert any("not JSON" in r or "Invalid JSON" in r for r in reasons)
    assert not any("secret-1234" in r for r in reasons)  # the body's values stay out
    assert "secret-1234" not in scenario.logs()
    (summary,) = [json.loads(line) for line in scenario.logs().splitlines() if '"summary"' in line]
    assert (summary["rejected"], summary["failed"], summary["succeeded"]) == (3, 0, 8)
