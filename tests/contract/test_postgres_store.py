"""What the PostgreSQL store adds to the store contract, against a real server:
``message.transaction()``, ``create-store``, passwords never shown, expiry through the
index, and a server that goes away and comes back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sqsworker import LeaseLost, Message
from sqsworker.clock import FakeClock
from sqsworker.errors import ConfigError, StartupError, StoreError
from sqsworker.stores import STORE_CALL_LIMIT, Lease, State, open_store, parse_url
from sqsworker.stores.postgres import PURGE_BATCH, PostgresStore
from sqsworker.transports.memory import MemorySQS

from ..conftest import unique, wait_until
from ..postgres import PASSWORD, PostgresServer
from ..unit.helpers import Rig

SQSWORKER = str(Path(sys.executable).parent / "sqsworker")


@pytest.fixture
def url(postgres: PostgresServer) -> Iterator[str]:
    """A store of its own, its table created as `sqsworker create-store` does (in this
    process: the command itself is tested once, below); and a `payments` table for the
    handler."""
    table = unique("keys").replace("-", "_")
    open_store(postgres.url_for(table), create=True).close()
    postgres.sql("DROP TABLE IF EXISTS payments")
    postgres.sql("CREATE TABLE payments (body text)")
    yield postgres.url_for(table)


def test_create_store_makes_a_table_the_store_opens_and_never_shows_the_password(
    postgres: PostgresServer,
) -> None:
    url = postgres.url_for(unique("keys").replace("-", "_"))
    with pytest.raises(StartupError, match="create it once"):
        open_store(url)
    created = subprocess.run([SQSWORKER, "create-store", url], capture_output=True, text=True)
    assert created.returncode == 0, created.stderr
    assert "is ready" in created.stdout and PASSWORD not in created.stdout
    open_store(url).close()  # the table is there, with the key and the index it checks


def payments(postgres: PostgresServer) -> list[str]:
    return [str(body) for (body,) in postgres.sql("SELECT body FROM payments ORDER BY body")]


def test_a_transaction_whose_claim_passed_to_another_worker_rolls_back(
    url: str, postgres: PostgresServer
) -> None:
    store = open_store(url)
    assert isinstance(store, PostgresStore)
    store.claim("k", "paused", "d", 1030.0, 1000.0)
    store.claim("k", "other", "d", 1090.0, 1031.0)  # the first claim lapsed; another took it
    with (
        pytest.raises(LeaseLost, match="no longer this worker's claim"),
        store.transaction("k", "paused", 5000.0) as db,
    ):
        db.execute("INSERT INTO payments VALUES ('twice?')")
    assert payments(postgres) == []
    with store.transaction("k", "other", 5000.0) as db:
        db.execute("INSERT INTO payments VALUES (%s)", ("once",))
        with pytest.raises(RuntimeError, match="commits when its with-block ends"):
            db.commit()
    assert payments(postgres) == ["once"]
    record = store.get("k")
    assert record is not None and record.state is State.COMPLETED
    assert store.renew([Lease("k", "other", 6000.0)]) == []  # its own completion: kept
    assert store.renew([Lease("k", "paused", 6000.0)]) == ["k"]
    store.close()


@pytest.mark.parametrize("fails", ["after the block", "inside the block"])
def test_a_transactional_effect_happens_once_whenever_the_handler_fails(
    memory: MemorySQS, clock: FakeClock, url: str, postgres: PostgresServer, fails: str
) -> None:
    def pay(message: Message) -> None:
        first = message.receive_count == 1
        with message.transaction() as db:
            db.execute("INSERT INTO payments VALUES (%s)", (message.body,))
            if first and fails == "inside the block":
                raise RuntimeError(fails)  # both roll back; the claim is released
        if first:
            raise RuntimeError(fails)  # after the commit: the retry finds the key completed

    rig = Rig(memory, clock, pay, store=open_store(url))
    rig.send("pay 10")
    rig.worker.start()
    rig.wait_for("returned", 1)
    assert payments(postgres) == ([] if fails == "inside the block" else ["pay 10"])
    rig.advance_until(lambda: rig.count("deleted") == 1)
    assert payments(postgres) == ["pay 10"]
    assert rig.count("duplicates_suppressed") == (fails == "after the block")
    rig.stop()


def test_the_server_going_away_sends_the_message_down_the_failure_path_and_nothing_is_lost(
    memory: MemorySQS, clock: FakeClock, url: str, postgres: PostgresServer
) -> None:
    def pay(message: Message) -> None:
        with message.transaction() as db:
            db.execute("INSERT INTO payments VALUES (%s)", (message.body,))

    rig = Rig(memory, clock, pay, store=open_store(url), concurrency=1)
    rig.send("before")
    rig.worker.start()
    rig.wait_for("deleted", 1)
    postgres.stop()  # every pooled connection is cut
    try:
        rig.send("during")
        rig.advance_until(lambda: rig.count("received") == 2)
        # The claim fails once the pool gives up on reconnecting (its wait, 8 s): the
        # message takes the failure path, its backoff, and is kept.
        rig.wait_for("store_failures", 1)
        assert rig.count("deleted") == 1
    finally:
        postgres.start()
    for _ in range(120):  # the backoff runs on the fake clock, the pool's reconnection on
        if rig.count("deleted") == 2:  # the real one: move the first, wait on the second
            break
        clock.advance(5)
        threading.Event().wait(0.25)
    assert rig.count("deleted") == 2, dict(rig.tally.counts)
    rig.send("after")
    rig.advance_until(lambda: rig.count("deleted") == 3, limit=400)
    assert payments(postgres) == ["after", "before", "during"]
    assert rig.queue.counts().total == 0
    rig.stop()


def test_expired_records_are_purged_through_the_index(url: str, postgres: PostgresServer) -> None:
    store = open_store(url)
    assert isinstance(store, PostgresStore)
    table = url.rsplit("table=", 1)[1]
    postgres.sql(
        f"INSERT INTO {table} SELECT 'old-' || i, 'completed', 'o', 'd', 10.0"
        " FROM generate_series(1, 1500) AS i"
    )
    postgres.sql(  # a live table is mostly live records
        f"INSERT INTO {table} SELECT 'live-' || i, 'completed', 'o', 'd', 1e12"
        " FROM generate_series(1, 30000) AS i"
    )
    store.claim("fresh", "o", "d", 5000.0, 1000.0)  # the first claim purges one batch
    left = postgres.sql(f"SELECT count(*) FROM {table} WHERE key LIKE 'old-%%'")
    assert left == [(1500 - PURGE_BATCH,)]
    postgres.sql(f"ANALYZE {table}")
    plan = "\n".join(
        str(row[0])
        for row in postgres.sql(
            f"EXPLAIN SELECT key FROM {table} WHERE expires_at <= 100"
            " ORDER BY expires_at LIMIT 1000"
        )
    )
    assert f"{table}_expires_at" in plan  # found through the index on expires_at
    store.close()


def test_a_store_that_cannot_be_used_is_refused_at_start_without_its_password(
    postgres: PostgresServer,
) -> None:
    missing = postgres.url_for("no_such_table")
    with pytest.raises(StartupError, match="create it once with `sqsworker create-store") as e:
        open_store(missing)
    assert PASSWORD not in str(e.value) and ":***@" in str(e.value)
    wrong = postgres.url.replace(PASSWORD, "wrong-password")
    with pytest.raises(StartupError, match="password authentication failed") as e:
        open_store(wrong)
    assert "wrong-password" not in str(e.value)
    closed = f"postgresql://postgres:{PASSWORD}@127.0.0.1:1/postgres"
    with pytest.raises(StartupError, match="cannot be used") as e:
        open_store(closed)
    assert PASSWORD not in str(e.value)
    with pytest.raises(ConfigError, match="is not a table name"):
        open_store(postgres.url_for("bad;name"))


def test_a_server_that_stops_answering_fails_the_call_instead_of_holding_it(
    url: str, postgres: PostgresServer
) -> None:
    store = open_store(url)
    assert isinstance(store, PostgresStore)
    store._watchdog.limit = 2.0  # 20 s in production: past the server's statement timeout
    store.claim("k", "o", "d", 2000.0, 1000.0)
    backends = [
        int(pid)  # type: ignore[call-overload]
        for (pid,) in postgres.sql(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend'"
            " AND pid <> pg_backend_pid()"
        )
    ]
    for pid in backends:  # the server's processes for this store stop, as a frozen host's
        os.kill(pid, signal.SIGSTOP)
    try:
        began = time.monotonic()
        with pytest.raises(StoreError):
            store.renew([Lease("k", "o", 3000.0)])
        assert time.monotonic() - began < STORE_CALL_LIMIT
    finally:
        for pid in backends:
            os.kill(pid, signal.SIGCONT)
    assert store.renew([Lease("k", "o", 3000.0)]) == []  # a fresh connection: working again
    store.close()


@pytest.mark.parametrize(
    "secret_url",
    [
        "postgresql://postgres@127.0.0.1:{port}/postgres?password={pw}&table=t",
        "postgresql://postgres:ab/cd-{pw}@127.0.0.1:{port}/postgres",
        "postgresql://postgres:ab#cd-{pw}@127.0.0.1:{port}/postgres",
        "postgresql://postgres:ab?cd-{pw}@127.0.0.1:{port}/postgres",
        "postgresql://postgres:{pw}%zz@127.0.0.1:{port}/postgres",
    ],
)
def test_a_password_is_never_shown_however_the_url_is_written(
    postgres: PostgresServer, secret_url: str
) -> None:
    url = secret_url.format(port=postgres.port, pw=PASSWORD)
    try:
        store = open_store(url)
    except (StartupError, ConfigError) as exc:
        assert PASSWORD not in str(exc)
    else:  # the one that works: ?password= in the query
        assert PASSWORD not in store.url and "password=***" in store.url
        store.close()


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("table=Keys", "is not a table name"),
        ("table=a.b.c", "is not a table name"),
        ("pool=0", "pool must be a number of connections, 2 or more"),
        ("pool=many", "pool must be a number of connections, 2 or more"),
    ],
)
def test_the_stores_own_options_are_checked_with_the_configuration(query: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        parse_url(f"postgresql://app:{PASSWORD}@db/shop?{query}")
    with pytest.raises(ConfigError) as raised:
        parse_url(f"postgresql://app:{PASSWORD}@db/shop?{query}")
    assert PASSWORD not in str(raised.value)


def test_libpq_parameters_pass_through_as_written(postgres: PostgresServer) -> None:
    table = unique("keys").replace("-", "_")
    url = f"{postgres.url_for(table)}&application_name=payments%20worker"
    store = open_store(url, create=True)
    assert isinstance(store, PostgresStore)
    store.claim("k", "o", "d", 2000.0, 1000.0)
    names = postgres.sql("SELECT DISTINCT application_name FROM pg_stat_activity")
    assert ("payments worker",) in names
    store.close()


def test_a_claim_that_lost_a_race_reports_the_live_record_in_its_way(
    url: str, postgres: PostgresServer
) -> None:
    """Its statement's snapshot can predate the winner: it must not report the expired
    record the winner replaced (a valid duplicate would read as a key conflict)."""
    store = open_store(url)
    table = url.rsplit("table=", 1)[1]
    now = 1031.0
    postgres.sql(f"INSERT INTO {table} VALUES ('k', 'completed', 'A', 'dA', 1000.0)")
    winner = psycopg.connect(postgres.url)  # B's claim: the row taken, not yet committed
    winner.execute(
        f"INSERT INTO {table} AS r (key, state, owner, digest, expires_at)"
        " VALUES ('k', 'in_progress', 'B', 'dB', 1090.0) ON CONFLICT (key) DO UPDATE"
        " SET state = 'in_progress', owner = excluded.owner, digest = excluded.digest,"
        " expires_at = excluded.expires_at WHERE r.expires_at <= %s",
        (now,),
    )
    got: list[Any] = []
    loser = threading.Thread(target=lambda: got.append(store.claim("k", "C", "dB", 1090.0, now)))
    loser.start()
    wait_until(
        lambda: bool(
            postgres.sql(
                "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND query LIKE 'WITH claimed%%'"
            )
        ),
        what="C's claim waiting for B's row lock",
    )
    winner.commit()
    loser.join(10)
    winner.close()
    [record] = got
    assert record is not None
    assert (record.state, record.owner, record.digest) == (State.IN_PROGRESS, "B", "dB")
    store.close()


def test_a_handlers_session_settings_do_not_reach_the_store(
    url: str, postgres: PostgresServer
) -> None:
    postgres.sql("CREATE SCHEMA IF NOT EXISTS tenant_a")
    store = open_store(url, connections=2)
    assert isinstance(store, PostgresStore)
    for key in ("k1", "k2"):
        store.claim(key, "o", "d", 2000.0, 1000.0)
    with store.transaction("k1", "o", 5000.0) as db:
        db.execute("SET LOCAL search_path TO tenant_a")  # its tenant's schema
        db.execute("CREATE TABLE IF NOT EXISTS ledger (v text)")
        db.execute("SET statement_timeout = 0")  # a long report, for the session
    with store.transaction("k2", "o", 5000.0) as db:
        db.execute("SET search_path TO tenant_a")
    timeouts = {store._execute("SHOW statement_timeout", None)[0][0] for _ in range(4)}
    assert timeouts == {"15s"}
    assert store.claim("k3", "o", "d", 2000.0, 1000.0) is None  # the table is found
    store.close()


def test_ending_the_transaction_through_execute_raises(url: str, postgres: PostgresServer) -> None:
    store = open_store(url)
    assert isinstance(store, PostgresStore)
    store.claim("k", "o", "d", 2000.0, 1000.0)
    with (
        pytest.raises(RuntimeError, match="ended its transaction itself"),
        store.transaction("k", "o", 5000.0) as db,
    ):
        db.execute("INSERT INTO payments VALUES ('lost?')")
        db.execute("ROLLBACK")
    record = store.get("k")
    assert record is not None and record.state is State.IN_PROGRESS  # not completed
    store.close()


def test_a_table_without_a_unique_key_is_refused_at_start(postgres: PostgresServer) -> None:
    table = unique("keys").replace("-", "_")
    postgres.sql(
        f"CREATE TABLE {table} (key text, state text, owner text, digest text,"
        " expires_at double precision)"
    )
    postgres.sql(f"CREATE INDEX ON {table} (expires_at)")
    with pytest.raises(StartupError, match="no primary key or unique index on key"):
        open_store(postgres.url_for(table))
