"""Idempotency keys on the in-memory SQS, driven by a fake clock."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
import structlog

from sqsworker import LeaseLost, Message, Worker, WorkerConfig
from sqsworker.clock import FakeClock
from sqsworker.errors import IdempotencyKeyError, StoreError
from sqsworker.events import Tally
from sqsworker.stores import Lease, Record, State, open_store
from sqsworker.stores.memory import MemoryStore
from sqsworker.stores.sqlite import SQLiteStore
from sqsworker.transports import OutgoingMessage, send_all
from sqsworker.transports.memory import MemorySQS

from ..conftest import wait_until
from .helpers import Rig


def keyed(body: str, key: str) -> OutgoingMessage:
    return OutgoingMessage(
        body, message_attributes={"idempotency-key": {"DataType": "String", "StringValue": key}}
    )


class Blocking:
    """A handler that records each run and blocks until ``release`` is set."""

    def __init__(self) -> None:
        self.runs: list[str] = []
        self.release = threading.Event()

    def __call__(self, message: Message) -> None:
        self.runs.append(message.body)
        self.release.wait(30)


def test_a_key_sent_twice_runs_once(memory: MemorySQS, clock: FakeClock) -> None:
    runs: list[str] = []
    rig = Rig(memory, clock, lambda m: runs.append(m.body), store=MemoryStore(), concurrency=1)
    send_all(rig.queue, [keyed("order 1", "o-1"), keyed("order 1", "o-1"), keyed("order 2", "o-2")])
    rig.worker.start()
    rig.wait_for("deleted", 3)
    assert sorted(runs) == ["order 1", "order 2"]
    assert rig.count("duplicates_suppressed") == 1
    assert rig.count("succeeded") == 2
    assert rig.queue.counts().total == 0
    rig.stop()


def one_key_twice(memory: MemorySQS, clock: FakeClock, body: str) -> tuple[Rig, Blocking]:
    """Two copies of one key on two handler threads: the first runs until released."""
    handler = Blocking()
    rig = Rig(memory, clock, handler, store=MemoryStore(), concurrency=2, visibility_timeout=10)
    send_all(rig.queue, [keyed(body, "k"), keyed(body, "k")])
    rig.worker.start()
    return rig, handler


def test_a_key_in_progress_elsewhere_is_deferred_then_suppressed(
    memory: MemorySQS, clock: FakeClock
) -> None:
    rig, handler = one_key_twice(memory, clock, "order 1")
    rig.wait_for("duplicates_deferred", 1)
    assert handler.runs == ["order 1"]
    assert rig.queue.counts().in_flight == 2  # one running, one returned until the claim ends
    handler.release.set()
    rig.wait_for("succeeded", 1)
    rig.advance_until(lambda: rig.count("duplicates_suppressed") == 1)
    assert handler.runs == ["order 1"]
    rig.wait_for("deleted", 2)
    assert rig.queue.counts().total == 0
    rig.stop()


def test_a_deferred_duplicate_is_held_not_returned_so_it_never_uses_up_receives(
    memory: MemorySQS, clock: FakeClock
) -> None:
    rig, handler = one_key_twice(memory, clock, "a")
    rig.wait_for("duplicates_deferred", 1)
    for n in range(1, 13):  # the original runs for 6 leases; its copy is looked at again
        rig.advance_until(lambda n=n: rig.count("lease_extensions") >= 2 * n, step=0.5)
    assert rig.count("duplicates_deferred") > 3
    assert rig.count("returned") == 0 and rig.count("leases_lost") == 0
    assert rig.count("received") == 2  # never handed back, so never received again
    handler.release.set()
    rig.advance_until(lambda: rig.count("duplicates_suppressed") == 1)
    rig.wait_for("deleted", 2)
    assert handler.runs == ["a"]
    rig.stop()


def test_a_failure_releases_the_claim_so_the_retry_runs(
    memory: MemorySQS, clock: FakeClock
) -> None:
    attempts: list[int] = []

    def flaky(message: Message) -> None:
        attempts.append(message.receive_count)
        if message.receive_count == 1:
            raise ValueError("first attempt fails")

    rig = Rig(memory, clock, flaky, store=MemoryStore())
    send_all(rig.queue, [keyed("x", "k")])
    rig.worker.start()
    rig.wait_for("returned", 1)
    rig.advance_until(lambda: rig.count("deleted") == 1)
    assert attempts == [1, 2]
    assert rig.count("duplicates_deferred") == rig.count("duplicates_suppressed") == 0


@pytest.mark.parametrize(("outcome", "to_dead_letters"), [("reject", 1), ("suppress", 0)])
def test_the_same_key_with_another_body_is_a_conflict(
    memory: MemorySQS, clock: FakeClock, outcome: str, to_dead_letters: int
) -> None:
    runs: list[str] = []
    rig = Rig(
        memory,
        clock,
        lambda m: runs.append(m.body),
        store=MemoryStore(),
        concurrency=1,
        on_key_conflict=outcome,
    )
    send_all(rig.queue, [keyed("pay 10", "p-1"), keyed("pay 99", "p-1")])
    rig.worker.start()
    rig.wait_for("deleted", 2)
    assert runs == ["pay 10"]
    assert rig.count("key_conflicts") == 1
    assert rig.dlq is not None
    dead = rig.dlq.receive(10, 0, 30)
    assert [m.body for m in dead] == ["pay 99"] * to_dead_letters
    if dead:
        assert "KeyConflict" in dead[0].message_attributes["sqsworker-error"]["StringValue"]
    rig.stop()


def test_a_message_without_a_key_goes_to_the_dead_letter_queue(
    memory: MemorySQS, clock: FakeClock
) -> None:
    runs: list[str] = []
    rig = Rig(
        memory,
        clock,
        lambda m: runs.append(m.body),
        store=MemoryStore(),
        concurrency=1,
        idempotency_key="json:order.id",
    )
    rig.send("not json", '{"order": {}}', '{"order": {"id": 7}}')
    rig.worker.start()
    rig.wait_for("deleted", 3)
    assert runs == ['{"order": {"id": 7}}']  # the worker went on
    assert rig.count("rejected") == 2
    assert rig.dlq is not None
    dead = rig.dlq.receive(10, 0, 30)
    errors = sorted(m.message_attributes["sqsworker-error"]["StringValue"] for m in dead)
    assert "has a body that is not JSON" in errors[0]
    assert "is nothing; it must be a string or a whole number" in errors[1]
    rig.stop()


def test_the_claim_follows_the_lease_and_ends_with_it(memory: MemorySQS, clock: FakeClock) -> None:
    store = MemoryStore()
    held: list[Message] = []
    release = threading.Event()

    def slow(message: Message) -> None:
        held.append(message)
        release.wait(30)

    rig = Rig(memory, clock, slow, store=store, visibility_timeout=10)
    send_all(rig.queue, [keyed("x", "k")])
    rig.worker.start()
    wait_until(lambda: bool(held))
    message = held[0]

    def claim() -> Record:
        record = store.get("jobs/k")
        assert record is not None
        return record

    for step in range(1, 6):  # 25 s: the claim would have lapsed without renewals
        clock.advance(5)
        rig.wait_for("lease_extensions", step)
        wait_until(lambda: claim().expires_at > clock.time() + 4)
        # The claim ends when the visibility lease does: a crash frees both together.
        assert claim().expires_at == pytest.approx(clock.time() + message.lease.seconds_left)
        assert claim().state is State.IN_PROGRESS
    release.set()
    rig.wait_for("deleted", 1)
    assert claim().state is State.COMPLETED
    assert claim().expires_at == pytest.approx(clock.time() + 86_400)
    rig.stop()


def test_log_lines_of_the_handler_carry_the_key(memory: MemorySQS, clock: FakeClock) -> None:
    seen: list[dict[str, Any]] = []
    rig = Rig(
        memory,
        clock,
        lambda m: seen.append(structlog.contextvars.get_contextvars()),
        store=MemoryStore(),
    )
    send_all(rig.queue, [keyed("x", "order-5")])
    rig.worker.start()
    rig.wait_for("deleted", 1)
    assert seen[0]["idempotency_key"] == "order-5"
    rig.stop()


class FlakyStore(MemoryStore):
    """A store whose first ``fail`` claims raise, as an unreachable one would."""

    def __init__(self, fail: int) -> None:
        super().__init__()
        self.fail = fail

    def claim(self, key: str, owner: str, digest: str, expires_at: float, now: float) -> Any:
        if self.fail:
            self.fail -= 1
            raise StoreError("the store is unreachable")
        return super().claim(key, owner, digest, expires_at, now)


def test_a_store_outage_retries_the_message_and_loses_nothing(
    memory: MemorySQS, clock: FakeClock
) -> None:
    runs: list[str] = []
    rig = Rig(memory, clock, lambda m: runs.append(m.body), store=FlakyStore(fail=1))
    rig.send("x")
    rig.worker.start()
    rig.wait_for("store_failures", 1)
    rig.advance_until(lambda: rig.count("deleted") == 1)
    assert runs == ["x"]
    assert rig.count("failed") == 1  # the failure path: backoff, then the retry ran
    rig.stop()


def test_fifo_messages_are_keyed_by_their_deduplication_id(
    memory: MemorySQS, clock: FakeClock
) -> None:
    memory.create_queue("jobs.fifo", {"FifoQueue": "true"})
    queue = memory.transport("jobs.fifo")
    runs: list[str] = []
    tally = Tally()
    worker = Worker(
        lambda m: runs.append(m.body),
        WorkerConfig(queue="jobs.fifo", wait_time=0, delete_interval=0),
        transport=memory.transport("jobs.fifo"),
        clock=clock,
        observer=tally,
        idempotency_store=MemoryStore(),
    )
    resend = OutgoingMessage("order 1", group_id="g", deduplication_id="order-1")
    send_all(queue, [resend])
    worker.start()
    wait_until(lambda: tally.counts["deleted"] == 1)
    clock.advance(6 * 60)  # past SQS's 5-minute deduplication window: SQS takes it again
    send_all(queue, [resend])
    wait_until(lambda: tally.counts["duplicates_suppressed"] == 1)
    assert runs == ["order 1"]
    worker.request_stop()
    worker.shutdown()


# -- message.transaction() ---------------------------------------------------------------


@pytest.fixture
def database(tmp_path: Path) -> Path:
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE payments (body TEXT)")
    db.close()
    return path


def payments(path: Path) -> list[str]:
    db = sqlite3.connect(path)
    try:
        return [row[0] for row in db.execute("SELECT body FROM payments")]
    finally:
        db.close()


@pytest.mark.parametrize(
    ("fails", "after_the_failure", "suppressed"),
    [
        # dies after the commit, before the delete: the retry finds the key completed
        ("after the block", ["pay 10"], 1),
        # fails inside the block: both roll back, the claim is released, the retry runs
        ("inside the block", [], 0),
    ],
)
def test_a_transactional_effect_happens_once_whenever_the_handler_fails(
    memory: MemorySQS,
    clock: FakeClock,
    database: Path,
    fails: str,
    after_the_failure: list[str],
    suppressed: int,
) -> None:
    def pay(message: Message) -> None:
        first = message.receive_count == 1
        with message.transaction() as db:
            db.execute("INSERT INTO payments VALUES (?)", (message.body,))
            if first and fails == "inside the block":
                raise RuntimeError(fails)
        if first:
            raise RuntimeError(fails)

    rig = Rig(memory, clock, pay, store=open_store(f"sqlite:///{database}"))
    rig.send("pay 10")
    rig.worker.start()
    rig.wait_for("returned", 1)
    assert payments(database) == after_the_failure
    rig.advance_until(lambda: rig.count("deleted") == 1)
    assert payments(database) == ["pay 10"]
    assert rig.count("duplicates_suppressed") == suppressed
    rig.stop()


def test_a_transaction_whose_claim_passed_to_another_worker_rolls_back(database: Path) -> None:
    store = open_store(f"sqlite:///{database}")
    assert isinstance(store, SQLiteStore)
    store.claim("k", "paused", "d", 1030.0, 1000.0)
    store.claim("k", "other", "d", 1090.0, 1031.0)  # the first claim lapsed; another took it
    with (
        pytest.raises(LeaseLost, match="passed to another worker"),
        store.transaction("k", "paused", 5000.0) as db,
    ):
        db.execute("INSERT INTO payments VALUES ('twice?')")
    assert payments(database) == []
    with store.transaction("k", "other", 5000.0) as db:
        db.execute("INSERT INTO payments VALUES ('once')")
        with pytest.raises(RuntimeError, match="commits when its with-block ends"):
            db.commit()
    assert payments(database) == ["once"]
    record = store.get("k")
    assert record is not None and record.state is State.COMPLETED
    assert store.renew([Lease("k", "other", 6000.0)]) == []  # its own completion: kept as is
    assert store.renew([Lease("k", "paused", 6000.0)]) == ["k"]
    record = store.get("k")
    assert record is not None and record.expires_at == 5000.0
    store.close()


@pytest.mark.parametrize(
    ("store", "error"),
    [(None, "needs an idempotency store"), (MemoryStore(), "needs a SQL idempotency store")],
)
def test_transaction_without_a_sql_store_says_what_to_do(
    memory: MemorySQS, clock: FakeClock, store: MemoryStore | None, error: str
) -> None:
    raised: list[BaseException] = []

    def pay(message: Message) -> None:
        try:
            with message.transaction():
                pass
        except RuntimeError as exc:
            raised.append(exc)

    rig = Rig(memory, clock, pay, store=store)
    rig.send("x")
    rig.worker.start()
    rig.wait_for("deleted", 1)
    assert error in str(raised[0])
    rig.stop()


def test_key_policies_name_what_is_missing() -> None:
    from sqsworker.keys import parse

    message = Message.build('{"order": {"id": [1]}}')
    with pytest.raises(IdempotencyKeyError, match="it must be a string or a whole number"):
        parse("json:order.id")(message)
    with pytest.raises(IdempotencyKeyError, match="has no message attribute 'key'"):
        parse("attribute:key")(message)
    assert parse("auto")(message) == "test-message"
    assert parse("json:order.id[0]")(message) == "1"
