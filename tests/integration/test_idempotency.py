"""Idempotency keys in real `sqsworker run` processes on moto's server.

The acceptance run: two workers share one store (SQLite, or PostgreSQL on a real
server), and their handler commits its effect and the key's completion in one
transaction. Duplicates are made three ways; each key's effect must be in the
ledger exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from sqsworker.transports import OutgoingMessage, send_all

from ..conftest import unique, wait_until
from ..postgres import PASSWORD, PostgresServer
from .scenario import Scenario, run_to_exit

pytestmark = pytest.mark.integration


def keyed(key: str, **body: object) -> OutgoingMessage:
    return OutgoingMessage(
        json.dumps({"key": key, **body}),
        message_attributes={"idempotency-key": {"DataType": "String", "StringValue": key}},
    )


class Effects:
    """The `effects` table the `pay` handler writes, in the store's own database."""

    store: str  # the --idempotency-store URL

    def rows(self) -> list[tuple[str, int, int]]:
        raise NotImplementedError

    def per_key(self) -> Counter[str]:
        return Counter(key for key, _, _ in self.rows())

    def pid_of(self, key: str) -> int:
        return next(pid for k, pid, _ in self.rows() if k == key)


class SQLiteEffects(Effects):
    def __init__(self, path: Path) -> None:
        self.path = path
        self.store = f"sqlite:///{path}"
        with sqlite3.connect(path) as db:
            db.execute("CREATE TABLE effects (key TEXT, pid INTEGER, receive_count INTEGER)")
        db.close()

    def rows(self) -> list[tuple[str, int, int]]:
        db = sqlite3.connect(self.path, timeout=30)
        try:
            return list(db.execute("SELECT key, pid, receive_count FROM effects"))
        finally:
            db.close()


class PostgresEffects(Effects):
    def __init__(self, server: PostgresServer) -> None:
        self.server = server
        table = unique("keys").replace("-", "_")
        self.store = server.url_for(table)
        server.sql("DROP TABLE IF EXISTS effects")
        server.sql("CREATE TABLE effects (key text, pid integer, receive_count integer)")
        done = subprocess.run(
            [str(Path(sys.executable).parent / "sqsworker"), "create-store", self.store],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert PASSWORD not in done.stdout + done.stderr  # credentials never shown

    def rows(self) -> list[tuple[str, int, int]]:
        return [
            (str(key), int(pid), int(count))  # type: ignore[call-overload]
            for key, pid, count in self.server.sql("SELECT key, pid, receive_count FROM effects")
        ]


@pytest.fixture(params=["sqlite", "postgresql"])
def effects(request: pytest.FixtureRequest, tmp_path: Path) -> Effects:
    if request.param == "sqlite":
        return SQLiteEffects(tmp_path / "app.db")
    return PostgresEffects(request.getfixturevalue("postgres"))


def suppressed(logs: str) -> Counter[str]:
    lines = [json.loads(line) for line in logs.splitlines() if line.startswith("{")]
    return Counter(
        line["idempotency_key"]
        for line in lines
        if line["event"].startswith("duplicate suppressed")
    )


def test_two_workers_sharing_a_store_make_each_effect_once(
    scenario: Scenario, tmp_path: Path, effects: Effects
) -> None:
    options = [
        "--visibility-timeout",
        "4",
        "--concurrency",
        "4",
        "--idempotency-store",
        effects.store,
        "--log-format",
        "json",
    ]

    def worker() -> subprocess.Popen[bytes]:
        return scenario.worker(*options, handler="pay")

    drained = scenario.drained

    workers = [worker(), worker()]
    expected: list[str] = []

    # 1. The same key sent twice: 40 keys once, 15 keys twice, in separate sends.
    once = [f"order-{i}" for i in range(40)]
    twice = [f"repeat-{i}" for i in range(15)]
    send_all(scenario.queue, [keyed(k) for k in once + twice])
    send_all(scenario.queue, [keyed(k) for k in twice])
    expected += once + twice
    wait_until(drained, timeout=60, what="the first batch to drain")

    # 2. A lease lost after the effect: the holder is paused (SIGSTOP, as a long GC
    #    pause or a frozen VM would) until SQS hands the message to the other worker.
    send_all(scenario.queue, [keyed("paused", hold=True)])
    expected.append("paused")
    wait_until(lambda: effects.per_key()["paused"] == 1, timeout=30, what="the paused effect")
    paused = effects.pid_of("paused")
    os.kill(paused, signal.SIGSTOP)
    try:
        wait_until(drained, timeout=30, what="the other worker to take and suppress it")
    finally:
        os.kill(paused, signal.SIGCONT)
    (tmp_path / "paused.release").touch()

    # 3. SIGKILL right after the effect was committed, before the delete.
    send_all(scenario.queue, [keyed("killed", hold=True)])
    expected.append("killed")
    wait_until(lambda: effects.per_key()["killed"] == 1, timeout=30, what="the killed effect")
    victim = next(w for w in workers if w.pid == effects.pid_of("killed"))
    victim.kill()
    victim.wait()
    wait_until(drained, timeout=30, what="the survivor to take and suppress it")
    workers = [w for w in workers if w is not victim] + [worker()]  # restarted, as k8s would
    wait_until(
        lambda: scenario.logs().count('"worker started"') == 3,
        timeout=30,
        what="the restarted worker to start",
    )

    # Work goes on afterwards, on the survivor and the restarted worker.
    after = [f"after-{i}" for i in range(20)]
    send_all(scenario.queue, [keyed(k) for k in after])
    expected += after
    wait_until(drained, timeout=60, what="the last batch to drain")
    for w in workers:
        w.send_signal(signal.SIGTERM)
    assert [w.wait(30) for w in workers] == [0, 0], scenario.logs()

    ledger = effects.per_key()
    assert sorted(ledger) == sorted(expected)  # nothing lost
    assert set(ledger.values()) == {1}, {k: n for k, n in ledger.items() if n != 1}
    counted = suppressed(scenario.logs())
    assert counted == Counter({**dict.fromkeys(twice, 1), "paused": 1, "killed": 1})
    print(
        f"\nidempotency acceptance: {len(expected)} keys, {len(ledger)} effects, "
        f"{sum(counted.values())} duplicates suppressed "
        f"({len(twice)} sent twice, 1 after a paused lease, 1 after SIGKILL), "
        f"{scenario.logs().count('duplicate deferred')} deferred while in progress"
    )


def test_a_dynamodb_store_suppresses_duplicates_across_workers(scenario: Scenario) -> None:
    table = unique("idempotency")
    created = subprocess.run(
        [sys.executable, "-m", "sqsworker.cli", "create-store", f"dynamodb://{table}"],
        env={**os.environ, **scenario.server.env()},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert created.returncode == 0, created.stderr
    keys = [f"k{i}" for i in range(10)]
    send_all(
        scenario.queue,
        [keyed(k, kind="normal", id=i) for i, k in enumerate(keys)] * 2,
    )
    options = ["--burst", "--visibility-timeout", "4", "--log-format", "json"]
    options += ["--idempotency-store", f"dynamodb://{table}"]
    workers = [scenario.worker(*options), scenario.worker(*options)]
    assert [w.wait(60) for w in workers] == [0, 0], scenario.logs()
    assert sorted(scenario.ledger.count("done").values()) == [1] * 10
    assert sum(suppressed(scenario.logs()).values()) == 10


@pytest.mark.parametrize(
    ("url", "code", "sentence"),
    [
        ("redis://x", 2, "is not an idempotency store URL: use memory://"),
        ("sqlite:///no/such/folder/x.db", 1, "which does not exist: create the folder"),
        ("dynamodb://missing-table", 1, "create it with `sqsworker create-store"),
    ],
)
def test_a_bad_or_unreachable_store_stops_the_worker_with_one_sentence(
    scenario: Scenario, url: str, code: int, sentence: str
) -> None:
    env = {**os.environ, **scenario.server.env()}
    result = run_to_exit(scenario.name, env, "--idempotency-store", url, "--metrics-port", "off")
    assert result.returncode == code, result.stderr
    [line] = [line for line in result.stderr.splitlines() if line.startswith("sqsworker: error:")]
    assert sentence in line


def test_an_unusable_postgresql_store_stops_the_worker_without_showing_its_password(
    scenario: Scenario, postgres: PostgresServer
) -> None:
    env = {**os.environ, **scenario.server.env()}
    for url, sentence in [
        (postgres.url_for("no_such_table"), "create it once with `sqsworker create-store"),
        (postgres.url.replace(PASSWORD, "wrong-pw"), "password authentication failed"),
    ]:
        result = run_to_exit(
            scenario.name, env, "--idempotency-store", url, "--metrics-port", "off"
        )
        assert result.returncode == 1, result.stderr
        [line] = [x for x in result.stderr.splitlines() if x.startswith("sqsworker: error:")]
        assert sentence in line
        assert PASSWORD not in result.stderr and "wrong-pw" not in result.stderr


def test_the_payments_example_charges_each_payment_once_on_postgresql(
    scenario: Scenario, postgres: PostgresServer
) -> None:
    store = postgres.url_for(unique("payment_keys").replace("-", "_"))
    env = {**os.environ, **scenario.server.env()}
    sqsworker = str(Path(sys.executable).parent / "sqsworker")
    created = subprocess.run([sqsworker, "create-store", store], env=env, capture_output=True)
    assert created.returncode == 0, created.stderr
    postgres.sql("DROP TABLE IF EXISTS ledger")
    postgres.sql("CREATE TABLE ledger (payment_id text PRIMARY KEY, cents integer)")
    payments = [json.dumps({"payment": {"id": f"p-{i}", "cents": 100 * i}}) for i in range(8)]
    send_all(scenario.queue, payments + payments[:3])  # three sent twice
    done = subprocess.run(
        [sqsworker, "run", "examples.payments:charge", "--queue", scenario.name, "--burst"],
        env={**env, "SQSWORKER_IDEMPOTENCY_STORE": store, "SQSWORKER_WAIT_TIME": "1"},
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    ledger = postgres.sql("SELECT payment_id, cents FROM ledger ORDER BY cents")
    assert ledger == [(f"p-{i}", 100 * i) for i in range(8)]
    assert done.stderr.count("duplicate suppressed") + done.stderr.count("duplicate deferred") >= 3
    assert scenario.queue.counts().total == 0
