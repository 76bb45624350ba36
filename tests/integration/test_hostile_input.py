"""No message can stop a worker, end to end: hostile messages among ordinary ones, sent to
real `sqsworker run` processes on moto's server."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from sqsworker.transports import OutgoingMessage, send_all

from ..conftest import wait_until
from .scenario import Scenario

pytestmark = pytest.mark.integration

DEEP = "[" * 3000 + "]" * 3000  # JSON nested past what Python's parser reads
POINTER_SIZE = {"ExtendedPayloadSize": {"DataType": "Number", "StringValue": "300000"}}


@pytest.mark.parametrize("handler", ["work", "work_async"])
def test_hostile_messages_leave_the_queue_and_every_ordinary_one_runs_once(
    scenario: Scenario, handler: str, tmp_path: Path
) -> None:
    scenario.send("normal", 25)
    hostile = [
        OutgoingMessage(DEEP, POINTER_SIZE),  # marked offloaded, no pointer a parser reads
        OutgoingMessage(DEEP),  # no key can be read from it, and no JSON
        OutgoingMessage('{"kind": "normal", "id": 1000, "s": "' + "\\\\" * 20_000 + '"}'),
        OutgoingMessage("\u2028\u0085\ufeff not json \U0001f600"),
    ]
    send_all(scenario.queue, hostile * 3)
    options = [
        "--concurrency",
        "4",
        "--visibility-timeout",
        "5",
        "--idempotency-key",
        "json:id",
        "--idempotency-store",
        f"sqlite:///{tmp_path / 'keys.db'}",
        "--backoff-base",
        "0.2",
        "--backoff-max",
        "1",
    ]
    workers = [scenario.worker(*options, handler=handler) for _ in range(2)]
    wait_until(scenario.drained, timeout=90, what="the queue to drain")
    # Both started (their SIGTERM handler is set before that line): on a loaded machine
    # one worker may drain the queue before the other is up, and a signal that early
    # would find Python's default handler.
    wait_until(lambda: scenario.logs().count('"worker started"') == 2, timeout=60, what="both up")
    for worker in workers:
        worker.send_signal(signal.SIGTERM)
    wait_until(lambda: all(w.poll() is not None for w in workers), timeout=60, what="exits")
    assert [w.returncode for w in workers] == [0, 0], scenario.logs()

    done = scenario.ledger.count("done")
    assert sorted(done) == sorted([f"normal {i}" for i in range(25)] + ["normal 1000"])
    assert all(n == 1 for n in done.values()), done  # once each: the key saw to the copies
    dead = []
    while batch := scenario.dlq.receive(10, 0, 30):
        dead += batch
        scenario.dlq.delete_batch([(str(i), m.receipt_handle) for i, m in enumerate(batch)])
    bodies = sorted(m.body for m in dead)
    assert bodies == sorted([DEEP] * 6 + [hostile[3].body] * 3), scenario.logs()
    reasons = {m.message_attributes["sqsworker-error"]["StringValue"].split(":")[0] for m in dead}
    assert reasons == {"PayloadMissing", "IdempotencyKeyError"}
    summaries = [
        json.loads(line) for line in scenario.logs().splitlines() if '"event":"summary"' in line
    ]
    assert len(summaries) == 2, summaries
    assert all(line["worker_errors"] == 0 for line in summaries), summaries
