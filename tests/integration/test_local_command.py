"""`sqsworker local`: the embedded SQS endpoint a developer starts by hand."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest

from sqsworker.local import REGION, LocalSQS
from sqsworker.transports import OutgoingMessage, send_all
from sqsworker.transports.sqs import SQSTransport

from ..conftest import unique, wait_until

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def test_local_serves_queues_with_dead_letter_queues_and_prints_the_env(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sqsworker.cli",
            "local",
            "--port",
            "0",
            "--queue",
            "orders",
            "--queue",
            "payments.fifo",
            "--max-receive-count",
            "4",
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert proc.stdout is not None
        exports: dict[str, str] = {}
        for line in proc.stdout:
            if line.startswith("export "):
                key, _, value = line.removeprefix("export ").strip().partition("=")
                exports[key] = value
            if line.startswith("# queue payments.fifo"):
                break
        for key, value in exports.items():
            monkeypatch.setenv(key, value)
        orders = SQSTransport.connect("orders")
        assert orders.info.max_receive_count == 4
        assert (orders.info.dead_letter_arn or "").endswith(":orders-dlq")
        payments = SQSTransport.connect("payments.fifo")
        assert payments.info.fifo
        assert (payments.info.dead_letter_arn or "").endswith(":payments-dlq.fifo")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_concurrent_receives_never_hand_one_message_to_two_consumers(
    local_sqs: LocalSQS, monkeypatch: pytest.MonkeyPatch
) -> None:
    """moto's backend alone, with threads switching often, returned one message to two
    long polls now and then (and failed some with 500s); SQS never does, nor may the
    embedded endpoint."""
    for key, value in local_sqs.env().items():
        monkeypatch.setenv(key, value)
    name = unique("race")
    local_sqs.create_queue(name, max_receive_count=None, visibility_timeout=300)
    send_all(SQSTransport.connect(name), [f"m{i}" for i in range(300)])
    seen: Counter[str] = Counter()
    errors: list[BaseException] = []
    lock = threading.Lock()

    def consume() -> None:
        transport = SQSTransport.connect(name)
        try:
            while got := transport.receive(10, 0, 300, None):
                with lock:
                    seen.update(e.message_id for e in got)
        except BaseException as exc:
            errors.append(exc)

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)  # the race needs a thread switch between look and mark
    try:
        threads = [threading.Thread(target=consume) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    finally:
        sys.setswitchinterval(switch)
    assert not errors
    assert len(seen) == 300 and set(seen.values()) == {1}


def test_a_fifo_group_in_flight_is_not_handed_to_a_second_long_poll(
    local_sqs: LocalSQS, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two long polls wait on an empty FIFO queue and one group's messages arrive: one
    poll takes the group's first messages and the other gets the next ones only once
    those are deleted, as SQS does. moto's own long poll kept the groups in flight it saw
    when it began and handed out the later messages at once (a worker with parallel
    receives then ran a group out of order)."""
    from moto.sqs.models import sqs_backends

    for key, value in local_sqs.env().items():
        monkeypatch.setenv(key, value)
    name = unique("groups") + ".fifo"
    local_sqs.create_queue(name, max_receive_count=None, visibility_timeout=60)
    backends = sqs_backends[next(iter(sqs_backends))]
    waiters = backends[REGION].queues[name]._messages_lock._waiters
    answers: list[tuple[list[str], bool]] = []
    # Set before the delete is sent: an answer recorded after it may come from the delete;
    # one recorded before cannot (set after, a poll answered in between read it unset).
    deleting = threading.Event()
    lock = threading.Lock()

    def poll() -> None:
        transport = SQSTransport.connect(name)
        got = transport.receive(2, 10, 60, None)
        with lock:
            answers.append(([e.body for e in got], deleting.is_set()))
            first = not deleting.is_set()
            if got and first:
                deleting.set()
        if got and first:
            transport.delete_batch([(e.message_id, e.receipt_handle) for e in got])

    polls = [threading.Thread(target=poll) for _ in range(2)]
    for thread in polls:
        thread.start()
    wait_until(lambda: len(waiters) == 2, what="both long polls waiting")
    send_all(
        SQSTransport.connect(name),
        [OutgoingMessage(f"m{i}", group_id="g", deduplication_id=f"m{i}") for i in range(6)],
    )
    for thread in polls:
        thread.join(30)
    assert answers == [(["m0", "m1"], False), (["m2", "m3"], True)]


def test_a_message_visible_again_reaches_a_long_poll_under_way(
    local_sqs: LocalSQS, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message handed back (as a retry's backoff or a shutdown does) while a long poll
    waits is returned by that poll, as SQS does, not at the end of its wait: the embedded
    endpoint looks again within a second."""
    from moto.sqs.models import sqs_backends

    for key, value in local_sqs.env().items():
        monkeypatch.setenv(key, value)
    name = unique("again")
    local_sqs.create_queue(name, max_receive_count=None, visibility_timeout=60)
    transport = SQSTransport.connect(name)
    send_all(transport, ["m"])
    [held] = transport.receive(1, 0, 60, None)
    waiters = sqs_backends[next(iter(sqs_backends))][REGION].queues[name]._messages_lock._waiters
    got: list[list[str]] = []
    poll = threading.Thread(
        target=lambda: got.append([e.body for e in SQSTransport.connect(name).receive(1, 20, 60)])
    )
    poll.start()
    wait_until(lambda: len(waiters) == 1, what="the long poll waiting")
    transport.change_visibility_batch([(held.message_id, held.receipt_handle, 0)])
    poll.join(5)  # the poll's own wait is 20 s
    assert got == [["m"]]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # moto's
def test_a_port_taken_between_the_probe_and_the_bind_fails_instead_of_hanging(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sqsworker import local

    monkeypatch.setattr(local, "START_LIMIT", 2)
    server = LocalSQS(port=0)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server._server._port = taken.getsockname()[1]  # as if taken after the probe
        with pytest.raises(OSError, match="the server did not start within 2 s"):
            server.start()
