"""Idempotency keys on the in-memory SQS, driven by a fake clock."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import structlog

from sqsworker import LeaseLost, Message, Worker, WorkerConfig
from sqsworker.clock import FakeClock
from sqsworker.errors import ConfigError, IdempotencyKeyError, StoreError, TransportError
from sqsworker.events import Tally
from sqsworker.idempotency import CLAIM_MARGIN, HEADROOM
from sqsworker.keys import DefaultKey
from sqsworker.stores import STORE_CALL_LIMIT, Lease, Record, State, open_store
from sqsworker.stores.memory import MemoryStore
from sqsworker.stores.sqlite import SQLiteStore
from sqsworker.transports import BatchResult, Envelope, OutgoingMessage, send_all
from sqsworker.transports.answers import batch_result
from sqsworker.transports.memory import MemorySQS, MemoryTransport

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
    assert rig.dlq is not None and rig.dlq.receive(10, 0, 30) == []  # never dead-lettered
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


class Watched(MemoryTransport):
    """A transport that checks, as SQS applies each renewal, that the key's claim (the
    message's body is its key) lasts at least the margin past what SQS now hides the
    message for: a worker stopped right after the call could otherwise let a copy of
    the key run while SQS still hid the original."""

    def __init__(self, memory: MemorySQS, store: MemoryStore, clock: FakeClock) -> None:
        memory.create_queue_with_dlq("jobs", 3)
        super().__init__(memory, memory.transport("jobs").info)
        self.memory, self.store, self.clock = memory, store, clock
        self.renewed = 0
        self.short: list[str] = []  # renewals SQS applied past the claim

    def change_visibility_batch(self, entries: Sequence[tuple[str, str, int]]) -> BatchResult:
        result = super().change_visibility_batch(entries)
        handles = {handle for _, handle, _ in entries}
        for message in self.memory._queues["jobs"].messages.values():
            record = self.store.get(f"jobs/{message.body}")
            if message.handle not in handles or record is None:
                continue
            self.renewed += 1
            hidden_until = self.clock.time() + message.visible_at - self.clock.monotonic()
            if record.expires_at < hidden_until + CLAIM_MARGIN:
                self.short.append(f"{message.body}: {record.expires_at - hidden_until:.1f} s")
        return result


def test_the_claim_leads_the_lease_and_ends_with_it(memory: MemorySQS, clock: FakeClock) -> None:
    store = MemoryStore()
    watched = Watched(memory, store, clock)
    held: list[Message] = []
    release = threading.Event()

    def slow(message: Message) -> None:
        held.append(message)
        release.wait(30)

    rig = Rig(memory, clock, slow, store=store, transport=watched, visibility_timeout=10)
    send_all(rig.queue, [keyed("k", "k")])
    rig.worker.start()
    wait_until(lambda: bool(held))
    message = held[0]

    def claim() -> Record:
        record = store.get("jobs/k")
        assert record is not None
        return record

    writes = []
    for step in range(1, 25):  # 120 s: the first claim would have lapsed without renewals
        clock.advance(5)
        rig.wait_for("lease_extensions", step)
        writes.append(claim().expires_at)
        # Ahead of the lease by the next renewal, the headroom and the margin at most: a
        # crash frees the key that long after SQS hands the message out again.
        beyond = claim().expires_at - (clock.time() + message.lease.seconds_left)
        assert CLAIM_MARGIN < beyond <= 10 + HEADROOM + CLAIM_MARGIN + 0.5, beyond
        assert claim().state is State.IN_PROGRESS
    assert watched.renewed >= 24 and watched.short == []
    # Moved every few renewals, not at each: 10 s leases gain 5 s a renewal, the claim
    # moves once half its headroom is gone.
    assert 4 <= len(set(writes)) <= 12, writes
    release.set()
    rig.wait_for("deleted", 1)
    assert claim().state is State.COMPLETED
    assert claim().expires_at == pytest.approx(clock.time() + 86_400)
    rig.stop()


def test_a_renewal_waits_for_its_claim_and_a_long_store_outage_costs_the_lease_instead(
    memory: MemorySQS, clock: FakeClock
) -> None:
    # Found by the fault simulator (seed 6562): the claim followed its lease, moved after
    # each renewal's answer, so a worker stopped right after sending a renewal left SQS
    # hiding the message up to a timeout past the claim, and a copy of the key ran. Now
    # no renewal goes past its claim: when the store cannot move it, the lease ends.
    store = RenewOutage(clock, until=clock.monotonic() + 10_000, failing=0)
    watched = Watched(memory, store, clock)
    first = Blocking()
    rig = Rig(
        memory, clock, first, store=store, transport=watched, concurrency=1, visibility_timeout=10
    )
    send_all(rig.queue, [keyed("k", "k")])
    rig.worker.start()
    wait_until(lambda: first.runs == ["k"])
    rig.advance_until(lambda: rig.count("leases_lost") == 1, step=0.5)
    assert watched.short == [], "a renewal went past its claim"
    assert watched.renewed >= 4  # while the claim taken at the start covered them
    assert rig.count("claims_lost") == 0 and rig.count("store_failures") >= 10
    first.release.set()
    rig.wait_for("succeeded", 1)
    rig.stop()


def test_a_longer_lease_asked_for_waits_for_its_claim_to_cover_it(
    memory: MemorySQS, clock: FakeClock
) -> None:
    store = MemoryStore()
    watched = Watched(memory, store, clock)
    extended: list[float] = []

    def long(message: Message) -> None:
        extended.append(message.lease.extend(600))

    rig = Rig(memory, clock, long, store=store, transport=watched, visibility_timeout=10)
    send_all(rig.queue, [keyed("k", "k")])
    rig.worker.start()
    rig.wait_for("succeeded", 1)
    assert extended and extended[0] > 590
    # One renewal of 600 s, after a renewal of what the claim already covered if the
    # lease thread looked before the keeper's write (both orders happen).
    assert 1 <= watched.renewed <= 2 and watched.short == []
    rig.wait_for("deleted", 1)
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


def test_a_deduplication_id_keys_a_message_on_a_fifo_queue_only() -> None:
    def on(queue: str) -> Message:
        envelope = Envelope("m-1", "h", "x", {"MessageDeduplicationId": "same"})
        return Message(envelope, queue)

    assert DefaultKey()(on("jobs.fifo")) == "same"
    assert DefaultKey()(on("jobs")) == "m-1"  # moto keeps one on a standard queue; SQS refuses it


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
    # The receive thread may be in the pause after an empty receive: move time on.
    for _ in range(100):
        if tally.counts["duplicates_suppressed"]:
            break
        clock.advance(1)
        threading.Event().wait(0.005)
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


def test_a_handler_that_runs_on_after_its_transaction_keeps_its_lease(
    memory: MemorySQS, clock: FakeClock, database: Path
) -> None:
    # Once committed, the claim is completed and moves no more: its lease must not wait
    # for it any longer, or a handler running on after the block would lose its lease.
    after = threading.Event()
    release = threading.Event()

    def pay(message: Message) -> None:
        with message.transaction() as db:
            db.execute("INSERT INTO payments VALUES (?)", (message.body,))
        after.set()
        release.wait(30)

    rig = Rig(memory, clock, pay, store=open_store(f"sqlite:///{database}"), visibility_timeout=10)
    rig.send("pay 10")
    rig.worker.start()
    wait_until(after.is_set)
    rig.advance_until(lambda: rig.count("lease_extensions") >= 30)  # 150 s
    assert rig.count("leases_lost") == 0
    release.set()
    rig.wait_for("deleted", 1)
    assert payments(database) == ["pay 10"]
    rig.stop()


def test_a_long_transaction_block_on_sqlite_keeps_its_lease_and_may_extend_it(
    memory: MemorySQS, clock: FakeClock, database: Path
) -> None:
    # The block holds SQLite's write lock, so the claim cannot move while it runs; no
    # other worker can take the key either, so the lease goes on without the claim.
    inside = threading.Event()
    release = threading.Event()
    extended: list[float] = []

    def pay(message: Message) -> None:
        with message.transaction() as db:
            db.execute("INSERT INTO payments VALUES (?)", (message.body,))
            extended.append(message.lease.extend(120))
            inside.set()
            release.wait(30)

    store = open_store(f"sqlite:///{database}")
    rig = Rig(memory, clock, pay, store=store, visibility_timeout=10)
    rig.send("pay 10")
    rig.worker.start()
    rig.advance_until(inside.is_set, step=0.5)
    assert extended[0] > 115
    rig.advance_until(lambda: clock.monotonic() > 1_000_300, step=2)  # 5 min in the block
    assert rig.count("leases_lost") == rig.count("store_failures") == 0
    release.set()
    rig.wait_for("deleted", 1)
    assert payments(database) == ["pay 10"]
    rig.stop()


def test_a_failed_long_transaction_block_on_sqlite_moves_the_claim_before_the_lock_goes(
    memory: MemorySQS, clock: FakeClock, database: Path
) -> None:
    # The lease ran on without the claim while the block held the write lock; when the
    # block fails and the handler runs on, the claim must cover the lease before another
    # worker can reach the key (found by review: it had lapsed 100 s before).
    store = open_store(f"sqlite:///{database}")
    failed = threading.Event()
    release = threading.Event()
    seen: list[tuple[float, float]] = []

    def pay(message: Message) -> None:
        try:
            with message.transaction() as db:
                db.execute("INSERT INTO payments VALUES (?)", (message.body,))
                release.wait(30)
                raise ValueError("the payment provider said no")
        except ValueError:
            record = store.get("jobs/pay 10")
            assert record is not None
            seen.append((record.expires_at - clock.time(), message.lease.seconds_left))
        failed.set()

    rig = Rig(memory, clock, pay, store=store, visibility_timeout=30)
    send_all(rig.queue, [keyed("pay 10", "pay 10")])
    rig.worker.start()
    rig.advance_until(lambda: clock.monotonic() > 1_000_250, step=2)  # 250 s in the block
    release.set()
    wait_until(failed.is_set)
    [(claim_left, lease_left)] = seen
    assert lease_left > 0 and claim_left >= lease_left + CLAIM_MARGIN
    assert payments(database) == []
    rig.wait_for("deleted", 1)
    rig.stop()


def test_a_failed_sqlite_block_commits_none_of_its_writes_and_raises_its_own_error(
    database: Path,
) -> None:
    store = open_store(f"sqlite:///{database}")
    assert isinstance(store, SQLiteStore)
    store.claim("k", "me", "d", 1030.0, 1000.0)
    # Savepoints of the block's own, one named as the store might name its: none of the
    # block's writes is committed with the moved claim (found by review).
    with (
        pytest.raises(ValueError, match="no"),
        store.transaction("k", "me", 5000.0, keep_until=lambda: 1400.0) as db,
    ):
        db.execute("INSERT INTO payments VALUES ('a')")
        db.execute("SAVEPOINT sqsworker_block")
        db.execute("SAVEPOINT inner")
        raise ValueError("no")
    assert payments(database) == []
    record = store.get("k")
    assert record is not None and (record.state, record.expires_at) == (State.IN_PROGRESS, 1400)

    def broken() -> float:
        raise AttributeError("the lease is gone")

    # A claim that cannot be moved leaves the block's own error as it was.
    with (
        pytest.raises(ValueError, match="the handler's"),
        store.transaction("k", "me", 5000.0, keep_until=broken),
    ):
        raise ValueError("the handler's")
    assert payments(database) == []
    store.close()


def test_extend_keeps_the_lease_while_a_slow_store_moves_the_claim(
    memory: MemorySQS, clock: FakeClock
) -> None:
    # Each claim renewal takes 17 s: the renewals of the old length, which the claim
    # already covers, go on meanwhile, then the longer one.
    store = SlowRenewals(clock, seconds=17.0)
    held: list[Message] = []
    extended: list[float] = []
    asked = threading.Event()

    def long(message: Message) -> None:
        held.append(message)
        asked.wait(30)
        extended.append(message.lease.extend(300))

    rig = Rig(memory, clock, long, store=store, visibility_timeout=30)
    send_all(rig.queue, [keyed("k", "k")])
    rig.worker.start()
    wait_until(lambda: bool(held))
    rig.advance_until(lambda: held[0].lease.seconds_left <= 16, step=0.5)
    asked.set()
    try:
        rig.advance_until(lambda: bool(extended), step=0.5)
    finally:
        store.hurry()
    assert extended[0] > 250 and rig.count("leases_lost") == 0
    rig.wait_for("deleted", 1)
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

    message = Message.build('{"order": {"id": [1]}}', message_id="test-message")
    with pytest.raises(IdempotencyKeyError, match="it must be a string or a whole number"):
        parse("json:order.id")(message)
    with pytest.raises(IdempotencyKeyError, match="has no message attribute 'key'"):
        parse("attribute:key")(message)
    assert parse("auto")(message) == "test-message"
    assert parse("json:order.id[0]")(message) == "1"


# -- issue 13: claims outlive their lease, renewals keep up, no lock across user code -----


class RenewOutage(MemoryStore):
    """A store whose renewals fail until the fake clock reaches ``until`` (monotonic),
    and at least ``failing`` of them have failed."""

    def __init__(self, clock: FakeClock, until: float, failing: int = 2) -> None:
        super().__init__()
        self.clock, self.until, self.failing = clock, until, failing
        self.failed = 0

    def renew(self, leases: Sequence[Lease]) -> list[str]:
        if self.clock.monotonic() < self.until or self.failed < self.failing:
            self.failed += 1
            raise StoreError("the store is unreachable")
        return super().renew(leases)


def test_a_duplicate_never_runs_beside_its_original_while_renewals_fail_briefly(
    memory: MemorySQS, clock: FakeClock
) -> None:
    # issue 13, defect 3a: the claim ended with the lease, so one renewal that fell
    # behind (here: the store failing for 25 s) let a second worker run the same key
    # while the first still held its SQS lease and ran.
    store = RenewOutage(clock, until=clock.monotonic() + 25)
    first = Blocking()
    second: list[str] = []
    one = Rig(memory, clock, first, store=store, concurrency=1, visibility_timeout=10)
    # Another worker on a queue of the same name (same key namespace), same store.
    two = Rig(MemorySQS(clock), clock, lambda m: second.append(m.body), store=store)
    send_all(one.queue, [keyed("a", "k")])
    one.worker.start()
    wait_until(lambda: first.runs == ["a"])
    send_all(two.queue, [keyed("a", "k")])
    two.worker.start()
    two.wait_for("duplicates_deferred", 1)
    # 30 s: six renewals of the first lease; the copy is looked at again every 10 s.
    one.advance_until(
        lambda: (
            one.count("lease_extensions") >= 6
            and store.failed >= 2  # the outage did meet the claim's renewals
            and (two.count("duplicates_deferred") >= 3 or bool(second))
        ),
        step=0.5,
    )
    assert second == [], "the copy ran while the first handler held its lease and ran"
    one.wait_for("store_failures", 2)  # reported, and the claim kept all the same
    assert one.count("leases_lost") == one.count("claims_lost") == 0
    first.release.set()
    one.wait_for("deleted", 1)
    one.advance_until(lambda: two.count("duplicates_suppressed") == 1)
    two.wait_for("deleted", 1)
    assert first.runs == ["a"] and second == []
    one.stop()
    two.stop()


class LostAnswers(MemoryTransport):
    """Renewals that SQS applies, whose answers never arrive (a reset after the write)."""

    def change_visibility_batch(self, entries: Sequence[tuple[str, str, int]]) -> BatchResult:
        super().change_visibility_batch(entries)
        raise TransportError("connection reset", code="ConnectionError", retryable=True)


class AppliedUnnamed(MemoryTransport):
    """Renewals that SQS applies, answered by a 200 that names no entry (a proxy's page
    that botocore reads as ``{}``), read by the SQS transport's own ``batch_result``."""

    def change_visibility_batch(self, entries: Sequence[tuple[str, str, int]]) -> BatchResult:
        super().change_visibility_batch(entries)
        return batch_result(
            "ChangeMessageVisibilityBatch", {}, [entry_id for entry_id, _, _ in entries]
        )


@pytest.mark.parametrize("lossy_kind", [LostAnswers, AppliedUnnamed])
def test_a_duplicate_never_runs_while_sqs_may_still_hold_the_original_for_a_lost_answer(
    memory: MemorySQS, clock: FakeClock, lossy_kind: type[MemoryTransport]
) -> None:
    """Renewals SQS applied but whose answers were lost, or named no entry: the worker
    counts its lease as lost when it ends unrenewed, but SQS still hides the message
    under its handle, as long as the last renewal it may have applied. The key's claim
    lasts as long, so a copy waits instead of running beside the original (found by the
    fault simulator; the unnamed answers by review)."""
    store = MemoryStore()
    first = Blocking()
    second: list[str] = []
    memory.create_queue_with_dlq("jobs", 3)
    lossy = lossy_kind(memory, memory.transport("jobs").info)
    one = Rig(
        memory, clock, first, store=store, transport=lossy, concurrency=1, visibility_timeout=120
    )
    two = Rig(MemorySQS(clock), clock, lambda m: second.append(m.body), store=store)
    send_all(one.queue, [keyed("a", "k")])
    one.worker.start()
    wait_until(lambda: first.runs == ["a"])
    one.advance_until(lambda: one.count("leases_lost") == 1, step=1)
    lost_at = clock.monotonic()
    [held] = memory._queues["jobs"].messages.values()
    assert held.visible_at > lost_at + CLAIM_MARGIN + 30  # renewals SQS applied
    send_all(two.queue, [keyed("a", "k")])
    two.worker.start()
    two.wait_for("duplicates_deferred", 1)
    # Past the claim margin after the lease the worker counts, and short of SQS's end.
    one.advance_until(lambda: clock.monotonic() > lost_at + CLAIM_MARGIN + 20, step=2)
    two.advance_until(lambda: two.count("duplicates_deferred") >= 5, step=2)
    assert clock.monotonic() < held.visible_at
    assert second == [], "the copy ran while SQS still held the original under its lease"
    first.release.set()
    one.wait_for("succeeded", 1)
    two.advance_until(lambda: two.count("duplicates_suppressed") == 1, step=5)
    assert second == []
    one.stop()
    two.stop()


class SlowRenewals(MemoryStore):
    """A store whose every renewal call takes ``seconds`` of the fake clock."""

    def __init__(self, clock: FakeClock, seconds: float) -> None:
        super().__init__()
        self.clock, self.seconds = clock, seconds
        self.batches: list[int] = []  # claims per renew call
        self._call = threading.Condition()  # guards batches, _ends and _fast
        self._ends: list[float] = []  # monotonic ends of the calls under way
        self._fast = False

    def renew(self, leases: Sequence[Lease]) -> list[str]:
        with self._call:
            self.batches.append(len(leases))
            end = self.clock.monotonic() + self.seconds
            self._ends.append(end)
            while not self._fast and self.clock.monotonic() < end:
                self.clock.wait(self._call, end)
            self._ends.remove(end)
        return super().renew(leases)

    def caught_up(self) -> bool:
        """No call is still waiting for a time that has already come."""
        with self._call:
            return all(end > self.clock.monotonic() for end in self._ends)

    def hurry(self) -> None:
        with self._call:
            self._fast = True
            self._call.notify_all()


def test_renewals_keep_up_with_a_slow_store_by_renewing_claims_in_batches(
    memory: MemorySQS, clock: FakeClock
) -> None:
    # issue 13, defect 3b: each lease batch of 10 queued its own store call; with a
    # store taking 2 s per call, 40 claims needed 8 s of calls every 5 s, the queue
    # grew, and claims lapsed while their handlers ran.
    claims = 40
    store = SlowRenewals(clock, seconds=2.0)
    handler = Blocking()
    rig = Rig(memory, clock, handler, store=store, concurrency=claims, visibility_timeout=10)
    send_all(rig.queue, [keyed(f"job {n}", f"k-{n}") for n in range(claims)])
    rig.worker.start()
    wait_until(lambda: len(handler.runs) == claims)

    def lapsed() -> list[str]:
        now = clock.time()
        records = {n: store.get(f"jobs/k-{n}") for n in range(claims)}
        return [f"k-{n}" for n, r in records.items() if r is None or r.expires_at <= now]

    start = clock.monotonic()
    try:
        for _ in range(300):  # 150 s: 30 leases of every message, about 5 claim moves
            wait_until(store.caught_up)
            clock.advance(0.5)
            threading.Event().wait(0.002)
            at = clock.monotonic() - start
            assert lapsed() == [], f"claims lapsed while their handlers ran, {at} s in"
        assert rig.count("leases_lost") == rig.count("claims_lost") == 0
        assert rig.count("store_failures") == 0
        # Renewed together: a few calls carrying many claims each, not one per lease batch.
        assert sum(store.batches) >= 3 * claims
        assert max(store.batches) > 10
        assert len(store.batches) <= sum(store.batches) / 20
    finally:
        store.hurry()  # no renewal waits on a clock nobody moves any more
        handler.release.set()
    rig.wait_for("deleted", claims)
    rig.stop()


def test_a_transaction_block_does_not_keep_other_threads_from_the_store(
    memory: MemorySQS, clock: FakeClock, database: Path
) -> None:
    # issue 13, defect 3c: the store held its process-wide write lock across the
    # handler's transaction block, so any other thread's claim or completion waited for
    # the user's code to finish, past SQLite's own busy timeout.
    store = open_store(f"sqlite:///{database}?timeout=0.2")
    inside, leave = threading.Event(), threading.Event()

    def pay(message: Message) -> None:
        with message.transaction() as db:
            db.execute("INSERT INTO payments VALUES (?)", (message.body,))
            inside.set()
            leave.wait(10)

    rig = Rig(memory, clock, pay, store=store, concurrency=1)
    rig.send("pay 10")
    rig.worker.start()
    assert inside.wait(5)
    answers: list[str] = []

    def others() -> None:
        now = clock.time()
        for write in (
            lambda: store.claim("jobs/other", "o", "d", now + 30, now),
            lambda: store.complete("jobs/done", "o", "d", now + 30, now),
        ):
            try:
                write()
                answers.append("written")
            except StoreError as exc:
                answers.append(str(exc))

    thread = threading.Thread(target=others, daemon=True)
    thread.start()
    thread.join(2)
    waited_for_the_handler = thread.is_alive()
    leave.set()
    thread.join(5)
    assert not waited_for_the_handler, "another key's writes waited for the user's block"
    # SQLite's busy timeout (0.2 s) answered them: its write lock is the block's.
    assert len(answers) == 2 and all("database is locked" in a for a in answers), answers
    rig.wait_for("deleted", 1)
    assert payments(database) == ["pay 10"]
    now = clock.time()
    assert store.claim("jobs/other", "o", "d", now + 30, now) is None  # free once it ended
    rig.stop()


def test_writers_queued_behind_a_transaction_block_wait_one_busy_timeout_each_at_most(
    database: Path,
) -> None:
    # issue 13, defect 3c: a writer waiting out SQLite's busy timeout (a claim renewal
    # during a handler's transaction block) held the process-wide write lock meanwhile,
    # so the writers queued behind it waited for the user's block too: one busy timeout
    # after another, not each its own.
    busy = 0.25
    store = open_store(f"sqlite:///{database}?timeout={busy}")
    assert isinstance(store, SQLiteStore)
    now = 1000.0
    store.claim("jobs/paid", "a", "d", now + 60, now)
    store.claim("jobs/running", "r", "d", now + 60, now)
    inside, leave = threading.Event(), threading.Event()

    def pay() -> None:
        with store.transaction("jobs/paid", "a", now + 999) as db:
            db.execute("INSERT INTO payments VALUES ('once')")
            inside.set()
            leave.wait(10)

    block = threading.Thread(target=pay, daemon=True)
    block.start()
    assert inside.wait(5)
    answered: dict[str, float] = {}  # seconds each writer waited for its answer

    def write(name: str, call: Any) -> None:
        began = time.monotonic()
        with contextlib.suppress(StoreError):
            call()
        answered[name] = time.monotonic() - began

    writers: list[tuple[str, Any]] = [
        ("renew", lambda: store.renew([Lease("jobs/running", "r", now + 90)])),
        ("complete", lambda: store.complete("jobs/done", "c", "d", now + 99, now)),
    ]
    writers += [
        (f"claim {n}", lambda n=n: store.claim(f"jobs/{n}", "c", "d", now + 60, now))
        for n in range(4)
    ]
    threads = [threading.Thread(target=write, args=w, daemon=True) for w in writers]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 3
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    leave.set()
    block.join(5)
    assert len(answered) == len(writers), f"writers waited for the user's block: {answered}"
    # Each waits at most the busy timeout for its turn and the busy timeout for SQLite.
    assert max(answered.values()) < 4 * busy, answered
    assert payments(database) == ["once"]
    store.close()


class HeldRenewal(MemoryStore):
    """A store whose first renewal of ``key`` waits, once called, until ``resume`` is set."""

    def __init__(self, key: str) -> None:
        super().__init__()
        self.key = key
        self.renewing, self.resume = threading.Event(), threading.Event()
        self.calls = 0

    def renew(self, leases: Sequence[Lease]) -> list[str]:
        self.calls += 1
        if not self.renewing.is_set() and any(lease.key == self.key for lease in leases):
            self.renewing.set()
            self.resume.wait(10)
        return super().renew(leases)


def test_a_renewal_answered_after_its_key_completed_is_no_claim_lost(
    memory: MemorySQS, clock: FakeClock
) -> None:
    # issue 13, defect 11: a renewal that reached the store after the handler had
    # completed the key found the record COMPLETED, and the worker reported
    # "idempotency claim lost" for a message that ran exactly once.
    store = HeldRenewal("jobs/a")
    done = {"a": threading.Event(), "b": threading.Event()}

    def handler(message: Message) -> None:
        done[message.body].wait(30)

    rig = Rig(memory, clock, handler, store=store, concurrency=2, visibility_timeout=10)
    send_all(rig.queue, [keyed("a", "a"), keyed("b", "b")])
    rig.worker.start()
    wait_until(lambda: store.get("jobs/a") is not None and store.get("jobs/b") is not None)
    rig.advance_until(store.renewing.is_set, step=0.5)
    done["a"].set()  # "a" completes while its renewal is on its way
    rig.wait_for("succeeded", 1)
    record = store.get("jobs/a")
    assert record is not None and record.state is State.COMPLETED
    store.resume.set()
    # The same thread renews "b" later: by then the late renewal's answer was handled.
    calls = store.calls
    rig.advance_until(lambda: store.calls > calls, step=0.5)
    assert rig.count("claims_lost") == 0
    record = store.get("jobs/a")
    assert record is not None and record.state is State.COMPLETED
    assert record.expires_at > clock.time() + 86_000  # its time to live, untouched
    done["b"].set()
    rig.wait_for("deleted", 2)
    rig.stop()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_claim_keeper_makes_the_worker_not_live(
    memory: MemorySQS, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claims nobody renews would lapse under running handlers: /healthz must say so."""
    rig = Rig(memory, clock, lambda message: None, store=MemoryStore())
    rig.worker.start()
    assert rig.worker.health().live and rig.worker.health().as_dict()["claims"] == "ok"
    keeper = rig.worker.idempotency.keeper if rig.worker.idempotency else None
    assert keeper is not None

    def broken(tracked: object) -> None:
        raise RuntimeError("a bug in the claim keeper")

    monkeypatch.setattr(keeper, "_look", broken)
    keeper.wake()
    wait_until(lambda: not keeper.alive(), what="the claim keeper to die")
    # Its thread reports the exception as it ends, after alive() turned false: in this
    # test, not the next one (which would fail on it).
    task = keeper._task
    assert task is not None
    wait_until(lambda: not task.is_alive(), what="its thread to end")
    health = rig.worker.health()
    assert not health.live and health.as_dict()["claims"] == "exited"
    rig.stop()


def test_the_slowest_store_call_costs_no_lease_of_the_default_timeout(tmp_path: Path) -> None:
    # A claim moves with half its headroom left, and the last renewal it covered keeps
    # the lease a timeout longer: the slowest store call, retries included, must end
    # inside both, or a slow store would cost a lease of the default 30 s.
    assert HEADROOM / 2 + WorkerConfig(queue="q").visibility_timeout > STORE_CALL_LIMIT
    assert open_store(f"sqlite:///{tmp_path}/a.db").timeout * 2 <= STORE_CALL_LIMIT
    with pytest.raises(ConfigError, match="timeout must be from 0 to 20 seconds"):
        open_store(f"sqlite:///{tmp_path}/a.db?timeout=30")
