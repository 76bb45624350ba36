"""A FIFO queue on moto's server: order within each group, groups side by side."""

from __future__ import annotations

import json
import random
from collections import defaultdict
from pathlib import Path

import pytest

from sqsworker.local import LocalSQS
from sqsworker.transports import OutgoingMessage, send_all

from .scenario import Scenario

pytestmark = pytest.mark.integration

GROUPS = 5
PER_GROUP = 20


def test_each_group_completes_in_send_order_and_groups_overlap(
    local_env: LocalSQS, tmp_path: Path
) -> None:
    scenario = Scenario(local_env, tmp_path, fifo=True, visibility=5, max_receive_count=5)
    rng = random.Random(3)
    try:
        messages = [
            OutgoingMessage(
                json.dumps(
                    {
                        "kind": f"g{g}",
                        "id": i,
                        "sleep": round(rng.uniform(0, 0.05), 3),
                        "fail_once": (g, i) == (2, 7),
                    }
                ),
                group_id=f"g{g}",
                deduplication_id=f"g{g}-{i}",
            )
            for i in range(PER_GROUP)
            for g in range(GROUPS)
        ]
        send_all(scenario.queue, messages)
        worker = scenario.worker(
            "--concurrency",
            "8",
            "--visibility-timeout",
            "5",
            "--burst",
            "--backoff-base",
            "0.2",
            "--backoff-max",
            "1",
        )
        assert worker.wait(120) == 0, scenario.logs()

        done: dict[str, list[int]] = defaultdict(list)
        running: set[str] = set()
        most_at_once = 0
        for event, group, ident, _, _ in scenario.ledger.lines():
            if event == "start":
                running.add(group)
                most_at_once = max(most_at_once, len(running))
            else:
                running.discard(group)
            if event == "done":
                done[group].append(int(ident))
        # A failed start has no "done": g2's message 7 leaves its group open until it reruns.
        assert dict(done) == {f"g{g}": list(range(PER_GROUP)) for g in range(GROUPS)}
        assert most_at_once >= 2
        starts = scenario.ledger.count("start")
        assert starts["g2 7"] == 2 and sum(starts.values()) == GROUPS * PER_GROUP + 1
        assert scenario.queue.counts().total == 0
        print(
            f"\nFIFO on moto: {GROUPS} groups x {PER_GROUP}, in send order in every group; "
            f"at most {most_at_once} groups at once; g2/7 failed once and ran again first"
        )
    finally:
        scenario.close()
