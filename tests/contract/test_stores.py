"""One contract, four idempotency stores: memory, SQLite, DynamoDB on moto's server, and
PostgreSQL on a real server.

What a store promises (``sqsworker/stores/__init__.py``): one claim per live key,
leases that only their owner can move, completion that never overwrites another
owner's live record, release by the owner only, expiry that frees a key.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sqsworker.local import LocalSQS
from sqsworker.stores import Lease, State, Store, open_store

from ..conftest import unique
from ..postgres import PostgresServer

NOW = 1_700_000_000.0


@pytest.fixture(params=["memory", "sqlite", "dynamodb", "postgresql"])
def store(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    local_sqs: LocalSQS,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Store]:
    if request.param == "postgresql":
        server: PostgresServer = request.getfixturevalue("postgres")
        opened = open_store(server.url_for(unique("records").replace("-", "_")), create=True)
        yield opened
        opened.close()
        return
    for key, value in local_sqs.env().items():  # credentials; the URL names the endpoint
        if not key.startswith("AWS_ENDPOINT_URL"):
            monkeypatch.setenv(key, value)
    if request.param == "memory":
        url = "memory://"
    elif request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/records.db"
    else:
        url = f"dynamodb://{unique('records')}?endpoint={local_sqs.endpoint_url}"
    opened = open_store(url, region="us-east-1", create=True)
    yield opened
    opened.close()


def test_a_key_is_claimed_once_while_its_claim_lives(store: Store) -> None:
    assert store.claim("k", "a", "d1", NOW + 30, NOW) is None
    record = store.claim("k", "b", "d1", NOW + 30, NOW + 1)
    assert record is not None
    assert (record.state, record.owner, record.digest) == (State.IN_PROGRESS, "a", "d1")
    assert record.expires_at == pytest.approx(NOW + 30)
    assert store.claim("k", "b", "d1", NOW + 60, NOW + 30) is None  # a's lease ended


def test_only_the_owner_renews_a_claim(store: Store) -> None:
    store.claim("k", "a", "d", NOW + 30, NOW)
    store.claim("j", "a", "d", NOW + 30, NOW)
    assert store.renew([Lease("k", "a", NOW + 90), Lease("j", "b", NOW + 90)]) == ["j"]
    assert store.claim("k", "b", "d", NOW + 60, NOW + 60) is not None  # moved to NOW + 90
    assert store.claim("j", "b", "d", NOW + 60, NOW + 60) is None  # not moved: expired
    assert store.renew([Lease("gone", "a", NOW + 90)]) == ["gone"]


def test_a_completed_key_stays_completed_until_its_ttl(store: Store) -> None:
    store.claim("k", "a", "d", NOW + 30, NOW)
    assert store.complete("k", "a", "d", NOW + 3600, NOW + 5)
    record = store.claim("k", "b", "d", NOW + 30, NOW + 100)
    assert record is not None and record.state is State.COMPLETED
    # A renewal that lands after its owner completed the key is no loss (defect 11), and
    # leaves the completion's time to live as it was.
    assert store.renew([Lease("k", "a", NOW + 200)]) == []
    assert store.renew([Lease("k", "b", NOW + 200)]) == ["k"]  # not b's
    record = store.claim("k", "b", "d", NOW + 300, NOW + 200)
    assert record is not None and record.state is State.COMPLETED
    assert record.expires_at == pytest.approx(NOW + 3600)
    assert store.claim("k", "b", "d", NOW + 3630, NOW + 3600) is None


def test_completion_never_overwrites_another_owners_live_claim(store: Store) -> None:
    store.claim("k", "a", "d", NOW + 30, NOW)
    assert store.claim("k", "b", "d", NOW + 60, NOW + 31) is None  # a lapsed, b took it
    assert not store.complete("k", "a", "d", NOW + 3600, NOW + 32)
    record = store.claim("k", "c", "d", NOW + 60, NOW + 33)
    assert record is not None and (record.state, record.owner) == (State.IN_PROGRESS, "b")
    assert store.complete("unclaimed", "a", "d", NOW + 3600, NOW)  # nothing in the way


def test_release_frees_the_key_for_its_owner_only(store: Store) -> None:
    store.claim("k", "a", "d", NOW + 30, NOW)
    store.release("k", "b")
    assert store.claim("k", "b", "d", NOW + 30, NOW) is not None
    store.release("k", "a")
    assert store.claim("k", "b", "d", NOW + 30, NOW) is None
    store.complete("k", "b", "d", NOW + 3600, NOW)
    store.release("k", "b")  # a completed record is not released
    record = store.claim("k", "c", "d", NOW + 30, NOW)
    assert record is not None and record.state is State.COMPLETED


def test_concurrent_claims_of_one_key_have_one_winner(store: Store) -> None:
    winners: list[str] = []
    start = threading.Barrier(8)

    def claim(owner: str) -> None:
        start.wait()
        if store.claim("hot", owner, "d", NOW + 30, NOW) is None:
            winners.append(owner)

    threads = [threading.Thread(target=claim, args=(f"w{i}",)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(winners) == 1
