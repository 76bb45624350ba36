"""Regression tests for the defects listed in issue 13, one or more per defect.

Each test drives the public paths (Worker, WorkerConfig, the in-memory SQS, the
fake clock, the Rig, LeaseKeeper) and asserts the behaviour the defect broke.
Where a defect is a race, the test forces the bad schedule with a transport or a
hook that holds one thread at the point where the race opens.
"""

from __future__ import annotations

import sys
import textwrap
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from sqsworker import Message, Retry, Worker, WorkerConfig, cli
from sqsworker.clock import FakeClock
from sqsworker.errors import ConfigError, LeaseLost, TransportError
from sqsworker.events import HANDED_BACK_BEHIND, Observer, Tally
from sqsworker.lease import LeaseKeeper
from sqsworker.stores.memory import MemoryStore
from sqsworker.transports import (
    MAX_BATCH,
    BatchResult,
    EntryFailure,
    Envelope,
    OutgoingMessage,
    send_all,
)
from sqsworker.transports.memory import MemorySQS, MemoryTransport
from sqsworker.transports.sqs import SQSTransport

from ..conftest import wait_until
from .helpers import Gate, Rig

START = 1_000_000.0  # FakeClock's first reading
GONE = "Message does not exist or is not available for visibility timeout change"


class Switchboard(MemoryTransport):
    """The in-memory SQS behind a switchboard: every call recorded in order, and the
    calls a test names failed, answered with an entry failure, or held."""

    def __init__(self, memory: MemorySQS, max_receive_count: int = 3) -> None:
        # The Rig creates the same queue again (empty, with the same QueueInfo).
        super().__init__(memory, memory.create_queue_with_dlq("jobs", max_receive_count))
        self.lock = threading.Lock()
        self.calls: list[tuple[str, list[str]]] = []  # (action, receipt handles)
        self.delete_error: Exception | None = None
        self.visibility_error: Exception | None = None
        self.visibility_answer: tuple[str, str] | None = None  # (code, text) for every entry
        self.hold_receive = False  # the next receive waits for receive_released
        self.receive_entered = threading.Event()
        self.receive_released = threading.Event()
        self.hold_visibility = False  # visibility changes wait for visibility_released
        self.visibility_entered = threading.Event()
        self.visibility_released = threading.Event()

    def count(self, action: str) -> int:
        with self.lock:
            return sum(name == action for name, _ in self.calls)

    def receive(
        self, max_messages: int, wait_seconds: int, visibility_timeout: int, attempt_id: Any = None
    ) -> list[Envelope]:
        if self.hold_receive:
            self.hold_receive = False
            self.receive_entered.set()
            self.receive_released.wait(60)
        return super().receive(max_messages, wait_seconds, visibility_timeout, attempt_id)

    def delete_batch(self, entries: Sequence[tuple[str, str]]) -> BatchResult:
        with self.lock:
            self.calls.append(("delete", [handle for _, handle in entries]))
        if self.delete_error is not None:
            raise self.delete_error
        return super().delete_batch(entries)

    def change_visibility_batch(self, entries: Sequence[tuple[str, str, int]]) -> BatchResult:
        with self.lock:
            self.calls.append(("visibility", [handle for _, handle, _ in entries]))
        if self.hold_visibility:
            self.visibility_entered.set()
            self.visibility_released.wait(60)
        if self.visibility_error is not None:
            raise self.visibility_error
        if self.visibility_answer is not None:
            code, text = self.visibility_answer
            return BatchResult(failed=[EntryFailure(i, code, text) for i, _, _ in entries])
        return super().change_visibility_batch(entries)


class Record(Observer):
    """What happened to which delivery: (message id, receive count) per event."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.deleted_: list[tuple[str, int]] = []
        self.lost: list[tuple[str, int]] = []
        self.delete_failures: list[tuple[str, int, bool]] = []

    def deleted(self, messages: Sequence[Message]) -> None:
        with self.lock:
            self.deleted_ += [(m.message_id, m.receive_count) for m in messages]

    def lease_lost(self, message: Message, reason: str) -> None:
        with self.lock:
            self.lost.append((message.message_id, message.receive_count))

    def delete_failed(self, message: Message, reason: str, will_retry: bool) -> None:
        with self.lock:
            self.delete_failures.append((message.message_id, message.receive_count, will_retry))


def outage() -> TransportError:
    return TransportError("ServiceUnavailable", code="ServiceUnavailable", retryable=True)


def run_bounded(target: Callable[[], object], timeout: float = 5.0) -> list[object]:
    """Run ``target`` on a thread; what it returned (or raised), or [] if still blocked."""
    outcome: list[object] = []

    def call() -> None:
        try:
            outcome.append(target())
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(timeout)
    return list(outcome)  # as it stood at the timeout


# -- defect 1: a lease dated from before the receive began -------------------------------


def test_a_visibility_timeout_shorter_than_the_long_poll_plus_margin_is_refused() -> None:
    """Issue 13, defect 1: the lease counts from the start of the long poll, so a
    visibility timeout under wait_time + 2 could run out before the message arrives."""
    with pytest.raises(ConfigError) as raised:
        WorkerConfig(queue="q", visibility_timeout=8, wait_time=20)
    text = str(raised.value)
    assert "--visibility-timeout (8) must be at least --wait-time (20) + 2" in text
    assert "use a visibility timeout of 22 or more, or a wait time of 6 or less" in text
    WorkerConfig(queue="q", visibility_timeout=22, wait_time=20)  # the margin exactly: fine


def test_sqsworker_run_refuses_a_visibility_timeout_inside_the_long_poll(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 13, defect 1: the CLI says so in one sentence and exits 2, before any worker."""
    (tmp_path / "shortlease.py").write_text(
        textwrap.dedent("""
        import sqsworker

        @sqsworker.handler(queue="orders")
        def process(message):
            pass
        """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "shortlease", raising=False)

    def no_worker(*args: object, **kwargs: object) -> None:
        raise AssertionError("a worker was built from a configuration that must be refused")

    monkeypatch.setattr(cli, "Worker", no_worker)
    argv = ["run", "shortlease:process", "--visibility-timeout", "8", "--wait-time", "20"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("sqsworker: error: --visibility-timeout (8) must be at least")
    assert err.count("\n") == 1


class ThrottledOnceClient:
    """A boto3 SQS client stand-in over the in-memory SQS. Its first ReceiveMessage takes
    12 s of fake time and is throttled (retryable); the next ones answer at once."""

    def __init__(self, memory: MemorySQS, clock: FakeClock) -> None:
        self.memory, self.clock = memory, clock
        self.receives: list[float] = []  # when each ReceiveMessage attempt began

    def receive_message(self, **request: Any) -> dict[str, Any]:
        self.receives.append(self.clock.monotonic())
        if len(self.receives) == 1:
            self.clock.advance(12)
            raise ClientError(
                {"Error": {"Code": "RequestThrottled", "Message": "Rate exceeded"}},
                "ReceiveMessage",
            )
        envelopes = self.memory.transport("jobs").receive(
            request["MaxNumberOfMessages"], request["WaitTimeSeconds"], request["VisibilityTimeout"]
        )
        return {
            "Messages": [
                {
                    "MessageId": e.message_id,
                    "ReceiptHandle": e.receipt_handle,
                    "Body": e.body,
                    "Attributes": dict(e.attributes),
                }
                for e in envelopes
            ]
        }

    def delete_message_batch(self, **request: Any) -> dict[str, Any]:
        entries = [(e["Id"], e["ReceiptHandle"]) for e in request["Entries"]]
        return self._answer(self.memory.transport("jobs").delete_batch(entries))

    def change_message_visibility_batch(self, **request: Any) -> dict[str, Any]:
        entries = [
            (e["Id"], e["ReceiptHandle"], e["VisibilityTimeout"]) for e in request["Entries"]
        ]
        return self._answer(self.memory.transport("jobs").change_visibility_batch(entries))

    @staticmethod
    def _answer(result: BatchResult) -> dict[str, Any]:
        return {
            "Successful": [{"Id": i} for i in result.succeeded],
            "Failed": [
                {"Id": f.id, "Code": f.code, "Message": f.message, "SenderFault": True}
                for f in result.failed
            ],
        }

    def close(self) -> None:
        pass


def test_a_lease_is_dated_from_the_receive_attempt_that_returned_the_message(
    memory: MemorySQS, clock: FakeClock
) -> None:
    """Issue 13, defect 1: a receive retried inside the SQS transport dated its messages'
    leases from its first, failed attempt, 12 s earlier, so a 10 s lease was run out on
    arrival. Now the transport makes one attempt and the worker's loop retries."""
    client = ThrottledOnceClient(memory, clock)
    info = memory.create_queue_with_dlq("jobs", 3)
    ran: list[int] = []
    rig = Rig(
        memory,
        clock,
        lambda m: ran.append(m.receive_count),
        transport=SQSTransport(client, info),
        visibility_timeout=10,
    )
    rig.send("x")
    rig.worker.start()
    rig.advance_until(lambda: rig.count("deleted") == 1 or rig.count("leases_lost") > 0)
    assert rig.count("leases_lost") == 0, "the lease was run out on arrival"
    assert ran == [1] and rig.count("receive_failures") == 1
    assert client.receives[1] >= START + 12  # the retry is the worker's, after the failure
    assert rig.stop() == 0


def test_begin_refuses_a_lease_that_ran_out_before_the_lease_thread_noticed(
    memory: MemorySQS, clock: FakeClock
) -> None:
    """Issue 13, defect 1: a handler never starts on a lease already run out."""
    memory.create_queue("jobs")
    transport = memory.transport("jobs")
    send_all(transport, ["x"])
    tally = Tally()
    keeper = LeaseKeeper(transport, clock, tally, delete_interval=0)  # its thread not started
    [held] = keeper.add(transport.receive(1, 0, 10), clock.monotonic(), 10)
    clock.advance(10)  # the lease runs out at exactly this moment
    assert keeper.begin(held) is False
    assert held.lost and held.seconds_left == 0
    assert tally.counts["leases_lost"] == 1


# -- defect 2: a message whose delete is queued never lapsed -----------------------------


def test_a_delete_failing_past_the_lease_is_never_reported_done(
    memory: MemorySQS, clock: FakeClock
) -> None:
    """Issue 13, defect 2: an outage (deletes and visibility changes failing) outlasts
    the lease of a handled message. That delivery is reported lost, never deleted, even
    when a late delete of its stale handle "succeeds"; a redelivery finishes the work."""
    transport = Switchboard(memory)
    record = Record()
    rig = Rig(
        memory,
        clock,
        lambda m: None,
        transport=transport,
        observers=[record],
        visibility_timeout=10,
        concurrency=1,
        prefetch=0,
    )
    transport.delete_error = outage()
    transport.visibility_error = outage()
    rig.send("x")
    rig.worker.start()
    rig.wait_for("succeeded", 1)
    wait_until(lambda: transport.count("delete") >= 1, what="the first delete attempt")
    rig.advance_until(lambda: clock.monotonic() >= START + 15)  # 1.5 leases of outage
    transport.delete_error = transport.visibility_error = None
    rig.advance_until(lambda: rig.queue.counts().total == 0)
    rig.wait_for("deleted", 1)
    with record.lock:
        assert all(receives > 1 for _, receives in record.deleted_), record.deleted_
        assert any(receives == 1 for _, receives in record.lost), record.lost
    assert rig.stop() == 0


# -- defect 4: held messages unbounded while deletes fail --------------------------------


def test_held_messages_stay_bounded_while_deletes_keep_failing(
    memory: MemorySQS, clock: FakeClock
) -> None:
    """Issue 13, defect 4: with DeleteMessageBatch failing (retryable), the worker holds
    at most concurrency + prefetch, plus one delete batch per sender awaiting its answer."""
    transport = Switchboard(memory)
    peak: list[int] = []
    rig: Rig

    class Peak(Observer):
        def received(self, messages: Sequence[Message]) -> None:
            assert rig.worker.keeper is not None
            peak.append(rig.worker.keeper.held_count())

    rig = Rig(
        memory,
        clock,
        lambda m: None,
        transport=transport,
        observers=[Peak()],
        visibility_timeout=30,
        concurrency=2,
        prefetch=1,
    )
    bound = 2 + 1 + MAX_BATCH * rig.worker.senders
    # Duplicates held for a busy key have a bound of their own; none are sent here.
    assert rig.worker.held_bound == bound + rig.worker.max_deferred and rig.worker.senders == 2
    transport.delete_error = outage()
    rig.send(*[f"m{i}" for i in range(60)])
    rig.worker.start()
    rig.wait_for("received", 3)
    for _ in range(5):  # five rounds of failing delete retries
        sent = transport.count("delete")
        clock.advance(1)
        wait_until(lambda: transport.count("delete") > sent, what="a delete retry")  # noqa: B023
    assert rig.count("received") <= bound
    assert max(peak) <= bound
    transport.delete_error = None  # the outage ends: everything goes through
    rig.advance_until(lambda: rig.count("deleted") == 60)
    assert max(peak) <= bound, max(peak)
    assert rig.queue.counts().total == 0
    assert rig.stop() == 0


def test_a_refused_delete_is_reported_and_not_retried_forever(
    memory: MemorySQS, clock: FakeClock
) -> None:
    """Issue 13, defect 4: a non-retryable error (AccessDenied) on delete is reported as
    a delete failure that will not be retried, and no further delete is sent for it."""
    transport = Switchboard(memory)
    record = Record()
    rig = Rig(
        memory,
        clock,
        lambda m: None,
        transport=transport,
        observers=[record],
        visibility_timeout=300,
    )
    transport.delete_error = TransportError(
        "AccessDenied: not authorized to perform sqs:DeleteMessageBatch", code="AccessDenied"
    )
    rig.send("x")
    rig.worker.start()
    wait_until(lambda: bool(record.delete_failures), timeout=5, what="the delete failure")
    assert [retry for _, _, retry in record.delete_failures] == [False]
    rig.advance_until(lambda: clock.monotonic() >= START + 30)
    assert transport.count("delete") == 1
    assert rig.count("deleted") == 0
    assert rig.stop() == 0


# -- defect 5: a handler raising SystemExit killed its thread ----------------------------


def test_a_handler_raising_system_exit_does_not_kill_its_thread(
    memory: MemorySQS, clock: FakeClock
) -> None:
    """Issue 13, defect 5: after a SystemExit the only handler thread still takes the
    next message, and health counts every handler thread alive."""
    ran: list[str] = []

    def handler(message: Message) -> None:
        ran.append(message.body)
        if len(ran) == 1:
            raise SystemExit(3)

    rig = Rig(memory, clock, handler, concurrency=1, prefetch=1)
    rig.send("first", "second")
    rig.worker.start()
    wait_until(lambda: rig.count("succeeded") >= 1, timeout=5, what="the next message to run")
    assert rig.count("failed") == 1  # the SystemExit counts as a failure; it comes back
    rig.advance_until(lambda: rig.count("deleted") == 2)
    health = rig.worker.health()
    assert health.handlers_alive == health.handlers == 1
    assert health.live
    assert rig.queue.counts().total == 0
    assert rig.stop() == 0


# -- defect 6: message.lease.extend() blocked forever ------------------------------------


def test_extend_at_the_twelve_hour_cap_returns_at_once(memory: MemorySQS, clock: FakeClock) -> None:
    """Issue 13, defect 6: at the cap no renewal will ever come; extend() answers with
    the seconds left instead of waiting for one."""
    gate = Gate()
    answers: list[list[object]] = []

    def handler(message: Message) -> None:
        gate(message)
        answers.append(run_bounded(lambda: message.lease.extend(60)))

    rig = Rig(memory, clock, handler, visibility_timeout=43_200)
    rig.send("x")
    rig.worker.start()
    assert gate.started.wait(10)
    clock.advance(43_180)  # 20 s of the cap left: too little for any renewal
    rig.wait_for("near_cap", 1)
    gate.release.set()
    wait_until(lambda: bool(answers), timeout=10)
    assert answers == [[20.0]], "extend() blocked at the 12-hour cap"
    rig.wait_for("deleted", 1)
    assert rig.stop() == 0


def test_extend_on_a_lease_that_ran_out_raises_lease_lost_at_once(
    memory: MemorySQS, clock: FakeClock
) -> None:
    """Issue 13, defect 6: the lease ran out while the lease thread hung in a call; the
    handler's extend() raises LeaseLost instead of waiting on that thread forever."""
    transport = Switchboard(memory)
    gate = Gate()
    answers: list[list[object]] = []

    def handler(message: Message) -> None:
        gate(message)
        answers.append(run_bounded(lambda: message.lease.extend(60)))

    rig = Rig(
        memory,
        clock,
        handler,
        transport=transport,
        visibility_timeout=10,
        concurrency=1,
        prefetch=0,
    )
    transport.hold_visibility = True
    rig.send("x")
    rig.worker.start()
    assert gate.started.wait(10)
    try:
        clock.advance(5)  # the renewal is due: the lease thread hangs in it
        assert transport.visibility_entered.wait(5)
        clock.advance(6)  # past the lease
        gate.release.set()
        wait_until(lambda: bool(answers), timeout=10)
        assert answers[0] and isinstance(answers[0][0], LeaseLost), f"extend() gave {answers}"
    finally:
        transport.hold_visibility = False
        transport.visibility_released.set()
    rig.wait_for("leases_lost", 1)
    assert rig.stop() == 0


# -- defect 8: FIFO shutdown race ---------------------------------------------------------


def test_group_mates_of_a_failed_message_are_handed_back_however_shutdown_interleaves(
    memory: MemorySQS, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 13, defect 8: when a FIFO message fails, its group's later messages go back
    to the queue. The hook below holds their hand-back for as long as the worker would
    let a shutdown finish meanwhile, the worst schedule; after a clean shutdown none of
    them may stay invisible."""
    memory.create_queue("jobs.fifo", {"ContentBasedDeduplication": "true"})
    queue = memory.transport("jobs.fifo")
    go = threading.Event()
    started = threading.Event()

    def handler(message: Message) -> None:
        if message.body == "1":
            started.set()
            go.wait(10)
            raise Retry(0)  # back at once: after the shutdown nothing should be hidden

    tally = Tally()
    worker = Worker(
        handler,
        WorkerConfig(queue="jobs.fifo", wait_time=0, delete_interval=0, concurrency=1),
        transport=queue,
        clock=clock,
        observer=tally,
    )
    send_all(queue, [OutgoingMessage(body, group_id="g") for body in ("1", "2", "3")])
    worker.start()
    assert started.wait(10)
    wait_until(lambda: worker.in_hand == 3, what="the group's later messages waiting")

    keeper = worker.keeper
    assert keeper is not None
    release = keeper.release
    window = threading.Event()  # a hand-back is pending while shutdown may finish
    shut = threading.Event()

    def held_release(held: Any, seconds: float, reason: str, urgent: bool = False) -> None:
        if reason == HANDED_BACK_BEHIND and worker.in_hand == 0:
            window.set()
            shut.wait(5)
        release(held, seconds, reason, urgent)

    monkeypatch.setattr(keeper, "release", held_release)
    go.set()
    wait_until(lambda: window.is_set() or tally.counts["returned"] >= 3, what="the hand-backs")
    worker.request_stop()
    result = run_bounded(worker.shutdown, timeout=10)
    shut.set()
    assert result == [0]
    counts = queue.counts()
    assert (counts.visible, counts.in_flight) == (3, 0), counts


# -- defect 9: a receive outliving shutdown's join --------------------------------------


class WatchedClock(FakeClock):
    """A fake clock that tells which threads wait on it with no deadline."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting_forever: set[str] = set()

    def wait(self, cond: threading.Condition, deadline: float | None) -> None:
        name = threading.current_thread().name
        if deadline is None:
            self.waiting_forever.add(name)
        try:
            super().wait(cond, deadline)
        finally:
            self.waiting_forever.discard(name)


def test_shutdown_waits_for_a_slow_receive_and_hands_its_messages_back() -> None:
    """Issue 13, defect 9: a receive that takes longer than wait_time + 15 s. Shutdown
    waits for the receive thread, which hands what it got straight back: visible at once."""
    clock = WatchedClock()
    memory = MemorySQS(clock)
    transport = Switchboard(memory)
    # The lease, dated from the start of the receive, outlasts the slow receive.
    rig = Rig(memory, clock, lambda m: None, transport=transport, visibility_timeout=30)
    transport.hold_receive = True
    rig.send("a", "b")
    rig.worker.start()
    assert transport.receive_entered.wait(5)
    rig.worker.request_stop()
    result: list[int] = []
    stopper = threading.Thread(target=lambda: result.append(rig.worker.shutdown()), name="stop")
    stopper.start()
    clock.advance(rig.worker.config.wait_time + 16)  # the receive outlives its allowance
    wait_until(
        lambda: not stopper.is_alive() or "stop" in clock.waiting_forever,
        timeout=30,
        what="shutdown to wait for the receive thread",
    )
    transport.receive_released.set()
    stopper.join(10)
    assert result == [0]
    rig.wait_for("received", 2)
    counts = rig.queue.counts()
    assert (counts.visible, counts.in_flight) == (2, 0), counts
    assert rig.count("handed_back") == 2
    assert not rig.worker.health().receiver_alive


# -- defect 10: memory per message -------------------------------------------------------


def test_tally_keeps_counts_only_whatever_the_number_of_messages() -> None:
    """Issue 13, defect 10: a month-long worker's Tally must not grow per message."""
    tally = Tally()
    tally.deleted([Message.build("warm-up", message_id="m-warm")])

    def sizes() -> dict[str, int]:
        return {name: sys.getsizeof(value) for name, value in vars(tally).items()}

    before = sizes()
    for i in range(10_000):
        tally.deleted([Message.build("x", message_id=f"m-{i}")])
    assert sizes() == before
    assert tally.counts["deleted"] == 10_001


# -- defect 12: a visibility change for a handle deleted in the same pass ----------------


def test_no_visibility_change_names_a_handle_already_deleted(
    memory: MemorySQS, clock: FakeClock
) -> None:
    """Issue 13, defect 12: a delete queued as its lease's renewal falls due goes out
    alone; no visibility change follows it for the same receipt handle."""
    transport = Switchboard(memory)
    gate = Gate()
    rig = Rig(memory, clock, gate, transport=transport, visibility_timeout=10, delete_interval=1)
    rig.send("x")
    rig.worker.start()
    assert gate.started.wait(10)
    clock.advance(4)  # the renewal falls due at 5 s
    gate.release.set()
    rig.wait_for("succeeded", 1)  # its delete waits for --delete-interval: until 5 s too
    clock.advance(1)
    rig.wait_for("deleted", 1)
    assert rig.stop() == 0
    deleted: set[str] = set()
    with transport.lock:
        for action, handles in transport.calls:
            if action == "delete":
                deleted.update(handles)
            else:
                assert not deleted & set(handles), f"visibility change after delete: {handles}"
    assert rig.count("request_failures") == 0 and rig.count("leases_lost") == 0


# -- defect 13: a gone handle answered with InvalidParameterValue ------------------------


def test_a_return_answered_with_a_gone_handle_is_lease_lost_not_retried(
    memory: MemorySQS, clock: FakeClock
) -> None:
    """Issue 13, defect 13: SQS answers a gone handle with InvalidParameterValue and
    "Message does not exist or is not available...". The failed message's return is then
    lease lost: not retried, and shutdown finishes at once, not at its timeout."""
    transport = Switchboard(memory)
    transport.visibility_answer = ("InvalidParameterValue", GONE)

    def handler(message: Message) -> None:
        raise RuntimeError("fails, so the worker returns it with a visibility change")

    rig = Rig(memory, clock, handler, transport=transport, shutdown_timeout=30)
    rig.send("x")
    rig.worker.start()
    rig.wait_for("failed", 1)
    wait_until(lambda: transport.count("visibility") >= 1, what="the return")
    rig.worker.request_stop()
    began = clock.monotonic()
    result: list[int] = []
    stopper = threading.Thread(target=lambda: result.append(rig.worker.shutdown()))
    stopper.start()
    for _ in range(60):  # fake time moves only while shutdown has not finished
        stopper.join(0.02)
        if not stopper.is_alive():
            break
        clock.advance(1)
    assert result == [0]
    assert clock.monotonic() - began < 5, "shutdown waited for its timeout"
    assert transport.count("visibility") == 1  # the return was not retried
    assert rig.count("leases_lost") == 1


# -- found by the independent review of the fixes ---------------------------------------


def test_a_duplicate_found_busy_while_shutdown_drains_is_handed_back(
    memory: MemorySQS, clock: FakeClock
) -> None:
    """A claim answered BUSY after shutdown took the deferred messages: the message was
    deferred where nobody looks, and shutdown waited its whole timeout with it hidden."""

    class HeldElsewhere(MemoryStore):
        """Another worker holds every key; a claim waits until ``answer`` is set."""

        def __init__(self) -> None:
            super().__init__()
            self.asked, self.answer = threading.Event(), threading.Event()

        def claim(self, key: str, owner: str, digest: str, expires_at: float, now: float) -> Any:
            super().claim(key, "another-worker", digest, expires_at + 1000, now)
            self.asked.set()
            self.answer.wait(10)
            return super().claim(key, owner, digest, expires_at, now)

    store = HeldElsewhere()
    rig = Rig(memory, clock, lambda message: None, store=store, shutdown_timeout=30)
    rig.send("a copy")
    rig.worker.start()
    assert store.asked.wait(5)
    result: list[int] = []
    stopping = threading.Thread(target=lambda: result.append(rig.worker.shutdown()))
    stopping.start()
    wait_until(lambda: rig.worker.inbox.closing, what="shutdown to take the waiting messages")
    store.answer.set()  # BUSY, now
    stopping.join(5)  # no fake time passes: a shutdown waiting for its timeout never ends
    assert result == [0]
    assert memory.counts("jobs").visible == 1


def test_a_retry_delay_sqs_cannot_take_is_refused_where_it_is_raised() -> None:
    """``Retry(delay=inf)`` escaped the failure path and killed the handler thread."""
    for delay in (float("inf"), float("nan"), -1.0, 43_201.0):
        with pytest.raises(ValueError, match="from 0 to 43200 seconds"):
            Retry(delay=delay)


def test_a_store_raising_what_it_should_not_neither_kills_a_thread_nor_strands_a_message(
    memory: MemorySQS, clock: FakeClock
) -> None:
    class Broken(MemoryStore):
        def complete(self, *args: Any) -> bool:
            raise KeyError("expires_at")  # a store's own bug, not a StoreError

    rig = Rig(memory, clock, lambda message: None, concurrency=1, store=Broken())
    rig.send("a", "b")
    rig.worker.start()
    rig.wait_for("deleted", 2)  # the delete goes on; the claim lapses by itself
    assert rig.count("store_failures") == 2
    assert rig.worker.health().live
    assert rig.stop() == 0
    assert memory.counts("jobs").total == 0


def test_a_handler_handed_back_at_the_shutdown_timeout_is_told_its_lease_is_lost(
    memory: MemorySQS, clock: FakeClock
) -> None:
    """Past --shutdown-timeout the message is visible to others at once: its handler,
    still running, must not go on believing it holds it."""
    gate = Gate()
    seen: dict[str, object] = {}

    def handler(message: Message) -> None:
        gate(message)
        seen["lost"] = message.lease.lost
        try:
            seen["extend"] = message.lease.extend(60)
        except LeaseLost as exc:
            seen["extend"] = exc

    rig = Rig(memory, clock, handler, concurrency=1, visibility_timeout=30, shutdown_timeout=5)
    rig.send("a")
    rig.worker.start()
    assert gate.started.wait(5)
    result: list[int] = []
    stopping = threading.Thread(target=lambda: result.append(rig.worker.shutdown()))
    stopping.start()
    rig.advance_until(lambda: bool(result))
    assert result == [1] and memory.counts("jobs").visible == 1
    gate.release.set()
    wait_until(lambda: "extend" in seen)
    assert seen["lost"] is True and isinstance(seen["extend"], LeaseLost)


def test_a_queued_return_goes_before_its_unrenewed_lease_could_run_out(
    memory: MemorySQS, clock: FakeClock
) -> None:
    """Found by the simulator's soak: a return is not renewed while it waits to fill a
    batch, and waiting the whole --delete-interval let a short lease run out first (a
    lease lost with no fault at all). It now goes by the time its lease would have been
    renewed."""
    memory.create_queue("jobs")
    transport = memory.transport("jobs")
    send_all(transport, ["x"])
    tally = Tally()
    keeper = LeaseKeeper(transport, clock, tally, delete_interval=1.0)
    [held] = keeper.add(transport.receive(1, 0, 2), clock.monotonic(), 2)  # renewal due at 1 s
    keeper.start()
    assert keeper.begin(held)
    clock.advance(0.9)
    keeper.release(held, 5, "retry")  # queued with 1.1 s of its lease left
    clock.advance(0.1)  # the moment it would have been renewed
    wait_until(lambda: tally.counts["returned"] == 1, what="the return to go")
    assert tally.counts["leases_lost"] == 0
    keeper.stop(give_up_after=1)


def test_a_flush_for_room_sends_full_delete_batches_and_lets_the_rest_fill_theirs(
    memory: MemorySQS, clock: FakeClock
) -> None:
    """Found by the grid at 256 threads x 20 ms: a receive thread short of room flushed
    every queued delete, 23 as calls of 10, 10 and 3, and deletes went 8.6 to a call
    (0.220 requests a message). Now the full batches go and the 3 wait to fill theirs,
    or for --delete-interval."""
    memory.create_queue("jobs")
    transport = memory.transport("jobs")
    send_all(transport, [str(i) for i in range(23)])
    sizes: list[int] = []

    class Sizes(MemoryTransport):
        def delete_batch(self, entries: Sequence[tuple[str, str]]) -> Any:
            sizes.append(len(entries))
            return super().delete_batch(entries)

    counted = Sizes(memory, transport.info)
    tally = Tally()
    keeper = LeaseKeeper(counted, clock, tally, delete_interval=1.0)
    held = []
    while len(held) < 23:
        held += keeper.add(transport.receive(10, 0, 30), clock.monotonic(), 30)
    keeper.start()
    for h in held:
        assert keeper.begin(h)
        keeper.succeed(h)
    keeper.flush()
    wait_until(lambda: tally.counts["deleted"] >= 20, what="the two full batches")
    assert sizes == [10, 10]
    clock.advance(1.0)  # the rest's --delete-interval
    wait_until(lambda: tally.counts["deleted"] == 23, what="the rest")
    assert sizes == [10, 10, 3]
    keeper.stop(give_up_after=1)


def test_deletes_that_fail_while_stopping_are_retried_before_the_stop_gives_up(
    memory: MemorySQS, clock: FakeClock
) -> None:
    """Found by review: a delete call under way when the stop began, failing in part,
    queued its failed entries again as ops that may wait to fill a batch, for up to
    --delete-interval, past the stop's give-up: handled messages left to run again."""
    memory.create_queue("jobs")
    transport = memory.transport("jobs")
    send_all(transport, [str(i) for i in range(13)])
    answer = threading.Event()
    calls: list[int] = []

    class FailsInPart(MemoryTransport):
        def delete_batch(self, entries: Sequence[tuple[str, str]]) -> BatchResult:
            calls.append(len(entries))
            if len(calls) > 1:
                return super().delete_batch(entries)
            answer.wait(10)  # the first call is under way when the stop begins
            done = super().delete_batch(entries[:7])
            failed = [EntryFailure(i, "InternalError", "try again", False) for i, _ in entries[7:]]
            return BatchResult(succeeded=done.succeeded, failed=failed)

    tally = Tally()
    keeper = LeaseKeeper(FailsInPart(memory, transport.info), clock, tally, delete_interval=10)
    held: list[Any] = []
    while len(held) < 13:
        held += keeper.add(transport.receive(10, 0, 60), clock.monotonic(), 60)
    keeper.start()
    for h in held:
        assert keeper.begin(h)
        keeper.succeed(h)  # 10 go at once, 3 wait to fill a batch
    wait_until(lambda: calls == [10], what="the first call")
    unsent: list[int] = []
    stopper = threading.Thread(
        target=lambda: unsent.append(keeper.stop(give_up_after=5)), daemon=True
    )
    stopper.start()
    wait_until(lambda: calls == [10, 3], what="the stop to send the 3")
    answer.set()  # 3 of the first call's 10 failed: retried a second later
    wait_until(lambda: tally.counts["deleted"] == 10, what="the first call's answer")
    began = clock.monotonic()
    while stopper.is_alive() and clock.monotonic() < began + 10:
        clock.advance(1.0)  # the retry's second, then on to the stop's give-up (5 s)
        stopper.join(0.1)
    assert (unsent, tally.counts["deleted"], calls) == ([0], 13, [10, 3, 3])
    assert memory.counts("jobs").total == 0


def test_a_delete_at_the_twelve_hour_cap_goes_before_the_lease_ends_not_after(
    memory: MemorySQS, clock: FakeClock
) -> None:
    """Found by review: at SQS's 12-hour cap no renewal comes, so a delete queued then
    waited its --delete-interval to fill a batch, past the lease's end: the message
    could come back and run again though it was done."""
    memory.create_queue("jobs")
    transport = memory.transport("jobs")
    send_all(transport, ["a long job"])
    tally = Tally()
    keeper = LeaseKeeper(transport, clock, tally, delete_interval=10.0)
    [held] = keeper.add(transport.receive(1, 0, 43200), clock.monotonic(), 43200)
    keeper.start()
    assert keeper.begin(held)
    while held.renew_at != float("inf"):  # renewed until SQS's cap allows no more
        clock.advance(max(0.0, held.renew_at - clock.monotonic()) + 0.01)
        wait_until(lambda: not held.busy and held.renew_at > clock.monotonic(), what="renewal")
    left = held.expires_at - clock.monotonic()
    assert 0 < left < 10.0  # less than --delete-interval
    keeper.succeed(held)
    wait_until(lambda: tally.counts["deleted"] == 1, what="the delete, the clock standing")
    assert tally.counts["leases_lost"] == 0
    keeper.stop(give_up_after=1)
