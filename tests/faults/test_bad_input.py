"""Messages a JSON handler cannot use, and messages at SQS's limits, in one worker's run."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sqsworker.local import LocalSQS
from sqsworker.transports import OutgoingMessage, send_all

from ..integration.scenario import Scenario

pytestmark = pytest.mark.integration


def test_bad_and_extreme_messages_follow_the_failure_path_and_the_worker_goes_on(
    local_env: LocalSQS, tmp_path: Path, report: Callable[[str], None]
) -> None:
    scenario = Scenario(local_env, tmp_path, max_receive_count=2, visibility=5)
    try:
        limit = scenario.queue.info.maximum_message_size
        padding = limit - len(json.dumps({"kind": "limit", "id": 0, "pad": ""}))
        at_limit = json.dumps({"kind": "limit", "id": 0, "pad": "x" * padding})
        assert len(at_limit.encode()) == limit
        binary = {"blob": {"DataType": "Binary", "BinaryValue": b"\xff\xfe\x00\x81"}}
        unknown = {
            "price": {"DataType": "Number.euros", "StringValue": "12.50"},
            "x.y-z": {"DataType": "String.custom", "StringValue": "ünïcödé ✓"},
        }
        cases: dict[str, tuple[OutgoingMessage, str]] = {
            "invalid JSON": (OutgoingMessage("{not json"), "dead-letter queue"),
            "blank body": (OutgoingMessage(" "), "dead-letter queue"),
            "empty JSON object": (OutgoingMessage("{}"), "dead-letter queue"),
            "non-UTF-8 bytes in a Binary attribute": (
                OutgoingMessage(json.dumps({"kind": "binary", "id": 0}), binary),
                "processed",
            ),
            f"body of exactly {limit} bytes": (OutgoingMessage(at_limit), "processed"),
            "unknown attribute types and names": (
                OutgoingMessage(json.dumps({"kind": "unknown", "id": 0}), unknown),
                "processed",
            ),
        }
        ids = {}
        for name, (message, _) in cases.items():
            if message.body is at_limit:  # moto counts a batch's framing against its 1 MiB
                client = scenario.queue.client  # type: ignore[attr-defined]
                sent = client.send_message(QueueUrl=scenario.queue.info.url, MessageBody=at_limit)
                ids[name] = sent["MessageId"]
            else:
                ids[name] = send_all(scenario.queue, [message])[0]
        worker = scenario.worker(
            "--burst", "--log-format", "json", "--backoff-base", "0.2", "--backoff-max", "1"
        )
        assert worker.wait(90) == 0, scenario.logs()  # it never crashed, and drained the queue

        lines = [json.loads(line) for line in scenario.logs().splitlines() if line.startswith("{")]
        by_message: dict[str, list[dict[str, Any]]] = {}
        for line in lines:
            by_message.setdefault(line.get("message_id", ""), []).append(line)
        dead = set()
        while batch := scenario.dlq.receive(10, 1, 30):
            for m in batch:  # moved by the worker (a copy that names its source) or by SQS
                source = m.message_attributes.get("sqsworker-source-message-id")
                dead.add(source["StringValue"] if source else m.message_id)
        outcomes = []
        for name, (_, expected) in cases.items():
            events = [e["event"] for e in by_message.get(ids[name], [])]
            if expected == "processed":
                assert "message processed" in events, (name, events)
                assert ids[name] not in dead
            else:
                assert ids[name] in dead, (name, events)
                failure = next(e for e in by_message[ids[name]] if e["level"] == "error")
                assert failure["error"], failure  # one line saying what was wrong
            outcomes.append(f"{name}: {expected}")
        assert scenario.queue.counts().total == 0
        report("bad input: " + "; ".join(outcomes) + "; the worker kept running and exited 0")
    finally:
        scenario.close()
        for proc in scenario.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
