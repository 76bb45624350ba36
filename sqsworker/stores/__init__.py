"""Idempotency stores: where a key's record lives, chosen by URL.

- ``memory://``: in this process only, for tests;
- ``sqlite:///path.db`` (relative) or ``sqlite:////abs/path.db``: one host, any
  number of threads and processes; handlers can commit their own writes and the
  completion record in one transaction (``message.transaction()``);
- ``dynamodb://table``: shared by every worker on AWS (``?region=`` and
  ``?endpoint=`` override boto3's defaults);
- ``postgresql://user@host:port/db?table=NAME``: shared by every worker that
  reaches the database; handlers can commit their writes with the completion
  record, as with SQLite (``stores/postgres.py``).

A record is IN_PROGRESS (an owner holds a lease on it until ``expires_at``) or
COMPLETED (until ``expires_at``, the end of its time to live). A record past its
``expires_at`` counts as absent. Times are wall-clock seconds since the epoch,
because the records are shared between processes and hosts.

Every method may raise ``StoreError``; ``open_store`` raises ``ConfigError`` for a
URL it cannot parse and ``StartupError`` for a store it cannot reach.

What every store is (records, leases, the ``Store`` protocol) lives in ``base.py``, the
URLs in ``urls.py``; the backends import those, and this package opens the backend a
URL names (and re-exports the names, as ``from sqsworker.stores import ...``).
"""

from __future__ import annotations

from ..errors import StartupError
from .base import (
    STORE_CALL_LIMIT,
    Lease,
    Record,
    State,
    Store,
    Transaction,
    TransactionalStore,
)
from .urls import (
    OPTIONS,
    POSTGRES_OPTIONS,
    POSTGRES_TABLE,
    SCHEMES,
    StoreURL,
    parse_url,
    scrubbed,
    shown,
)

__all__ = [
    "OPTIONS",
    "POSTGRES_OPTIONS",
    "POSTGRES_TABLE",
    "SCHEMES",
    "STORE_CALL_LIMIT",
    "Lease",
    "Record",
    "State",
    "Store",
    "StoreURL",
    "Transaction",
    "TransactionalStore",
    "open_store",
    "parse_url",
    "scrubbed",
    "shown",
]


def open_store(
    url: str,
    *,
    region: str | None = None,
    endpoint_url: str | None = None,
    create: bool = False,
    connections: int = 10,
) -> Store:
    """Open (and check) the store ``url`` names; ``create`` makes its table first.
    ``connections``: how many a pooled store may open (a PostgreSQL URL's ?pool= wins)."""
    parsed = parse_url(url)
    if parsed.scheme == "memory":
        from .memory import MemoryStore

        return MemoryStore()
    if parsed.scheme == "sqlite":
        from .sqlite import SQLiteStore

        return SQLiteStore.open(parsed)
    if parsed.scheme == "postgresql":
        try:
            from .postgres import PostgresStore
        except ImportError:
            raise StartupError(
                f"{shown(url)} needs psycopg: pip install 'sqsworker[postgres]'"
            ) from None
        return PostgresStore.open(parsed, create=create, pool_size=connections)
    from .dynamodb import DynamoDBStore

    return DynamoDBStore.open(parsed, region=region, endpoint_url=endpoint_url, create=create)
