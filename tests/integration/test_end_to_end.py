"""`sqsworker run` processes against a real HTTP SQS endpoint (moto's server)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from sqsworker.local import LocalSQS

from ..conftest import wait_until
from .scenario import ROOT, Scenario, run_to_exit

pytestmark = pytest.mark.integration


# Each with a thread handler and with the same handler as an async def (coroutines).
HANDLERS = pytest.mark.parametrize("handler", ["work", "work_async"])


@HANDLERS
def test_two_workers_process_everything_once_and_poison_reaches_the_dlq(
    scenario: Scenario, handler: str
) -> None:
    scenario.send("normal", 20)
    scenario.send("slow", 4, sleep=7)  # over twice the 3 s visibility timeout
    scenario.send("fail", 2)
    options = [
        "--visibility-timeout",
        "3",
        "--concurrency",
        "4",
        "--burst",
        "--backoff-base",
        "0.2",
        "--backoff-max",
        "1",
    ]
    workers = [scenario.worker(*options, handler=handler) for _ in range(2)]
    wait_until(
        lambda: all(w.poll() is not None for w in workers),
        timeout=90,
        what="both workers to drain the queue",
    )
    assert [w.returncode for w in workers] == [0, 0], scenario.logs()

    done = scenario.ledger.count("done")
    started = scenario.ledger.count("start")
    for kind, n in (("normal", 20), ("slow", 4)):
        ids = [key for key in started if key.startswith(kind)]
        assert len(ids) == n
        assert all(started[key] == 1 and done[key] == 1 for key in ids), (kind, started, done)
    failing = [key for key in started if key.startswith("fail")]
    assert len(failing) == 2, started
    # maxReceiveCount
    assert all(started[key] == 3 for key in failing), (started, scenario.logs()[-6000:])
    assert scenario.queue.counts().total == 0
    dead = []
    while batch := scenario.dlq.receive(10, 1, 30):
        dead += batch
    assert sorted(json.loads(m.body)["kind"] for m in dead) == ["fail", "fail"]
    assert "lease lost" not in scenario.logs()


@HANDLERS
def test_sigterm_hands_back_unstarted_and_lets_running_finish(
    scenario: Scenario, handler: str
) -> None:
    scenario.send("slow", 10, sleep=3)
    worker = scenario.worker(
        "--visibility-timeout", "30", "--concurrency", "2", "--prefetch", "8", handler=handler
    )
    wait_until(
        lambda: len(scenario.ledger.count("start")) == 2, timeout=30, what="two handlers to start"
    )
    wait_until(lambda: scenario.queue.counts().in_flight == 10, what="all ten held")
    signalled = time.monotonic()
    worker.send_signal(signal.SIGTERM)
    wait_until(lambda: scenario.queue.counts().visible == 8, timeout=10, what="eight handed back")
    handed_back_after = time.monotonic() - signalled
    # Handed back while the running handlers still ran: nothing waited for them.
    assert not scenario.ledger.count("done")
    assert worker.wait(30) == 0, scenario.logs()
    assert sum(scenario.ledger.count("done").values()) == 2
    counts = scenario.queue.counts()
    assert (counts.visible, counts.in_flight) == (8, 0)
    print(f"\nSIGTERM -> 8 unstarted messages visible again after {handed_back_after:.2f} s")


def test_past_the_shutdown_timeout_a_coroutine_in_a_thread_does_not_keep_the_process(
    scenario: Scenario,
) -> None:
    """A coroutine waiting on asyncio.to_thread past --shutdown-timeout: its message is
    handed back and the process exits (1) at once, not when the thread's call ends."""
    scenario.send("stuck", 1, sleep=120)
    worker = scenario.worker(
        "--shutdown-timeout", "1", "--visibility-timeout", "30", handler="work_in_thread"
    )
    wait_until(lambda: len(scenario.ledger.count("start")) == 1, timeout=30, what="the start")
    signalled = time.monotonic()
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(30) == 1, scenario.logs()
    assert time.monotonic() - signalled < 15  # the wait time (1 s), the timeout, the flush
    assert scenario.queue.counts().visible == 1  # handed back for another worker
    assert "summary" in scenario.logs()


def test_after_kill_9_another_worker_finishes_the_messages(scenario: Scenario) -> None:
    scenario.send("slow", 4, sleep=2)
    victim = scenario.worker("--visibility-timeout", "3", "--concurrency", "4")
    wait_until(
        lambda: len(scenario.ledger.count("start")) == 4, timeout=30, what="four handlers to start"
    )
    victim.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    victim.wait()
    assert not scenario.ledger.count("done")
    rescuer = scenario.worker("--visibility-timeout", "3", "--concurrency", "4", "--burst")
    wait_until(
        lambda: len(scenario.ledger.count("done")) == 4,
        timeout=60,
        what="the rescuer to finish them",
    )
    recovered_after = time.monotonic() - killed
    assert rescuer.wait(30) == 0, scenario.logs()
    assert scenario.queue.counts().total == 0
    assert all(n == 1 for n in scenario.ledger.count("done").values())
    print(
        f"\nSIGKILL -> all 4 messages finished by another worker after {recovered_after:.2f} s "
        "(visibility timeout 3 s, handlers 2 s)"
    )


@pytest.mark.usefixtures("default_metrics_port_taken")
def test_a_missing_queue_fails_fast_with_one_sentence(local_sqs: LocalSQS, tmp_path: Path) -> None:
    env = {**os.environ, **local_sqs.env(), "PYTHONPATH": str(ROOT)}
    proc = run_to_exit("no-such-queue", env)
    assert proc.returncode == 1
    assert proc.stderr.startswith(
        "sqsworker: error: queue 'no-such-queue' does not exist at http://127.0.0.1:"
    )
    assert proc.stderr.count("\n") == 1


@pytest.mark.usefixtures("default_metrics_port_taken")
def test_missing_credentials_fail_fast_with_one_sentence(
    local_sqs: LocalSQS, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        {
            "PYTHONPATH": str(ROOT),
            "AWS_ENDPOINT_URL_SQS": local_sqs.endpoint_url,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
            "AWS_CONFIG_FILE": str(tmp_path / "none"),
            "AWS_EC2_METADATA_DISABLED": "true",  # never ask an instance metadata service
        }
    )
    proc = run_to_exit("orders", env)
    assert proc.returncode == 1
    assert "no usable AWS credentials were found" in proc.stderr
    assert proc.stderr.count("\n") == 1


def test_a_misspelt_variable_is_named_with_the_option_it_likely_meant(
    local_sqs: LocalSQS,
) -> None:
    env = {**os.environ, **local_sqs.env(), "PYTHONPATH": str(ROOT), "SQSWORKER_CONCURENCY": "4"}
    proc = run_to_exit("no-such-queue", env)
    assert proc.returncode == 1
    assert (
        "SQSWORKER_CONCURENCY is not an sqsworker option and is ignored: "
        "did you mean SQSWORKER_CONCURRENCY?" in proc.stdout + proc.stderr
    )
