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
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable
from urllib.parse import parse_qs, unquote, urlsplit

from ..errors import ConfigError, StartupError

SCHEMES = ("memory", "sqlite", "dynamodb", "postgresql", "postgres")
# Seconds any store call may take, retries included: each store bounds its calls by
# this (client timeouts), so that a claim's renewal, sent with 3/4 of the claim
# margin left, always ends before the claim could lapse (see idempotency.py).
STORE_CALL_LIMIT = 40.0


class State(enum.Enum):
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"


@dataclass(frozen=True)
class Record:
    state: State
    owner: str
    digest: str
    expires_at: float


@dataclass(frozen=True)
class Lease:
    """One claimed key, as the lease thread renews it."""

    key: str
    owner: str
    expires_at: float


class Store(Protocol):
    url: str

    def claim(
        self, key: str, owner: str, digest: str, expires_at: float, now: float
    ) -> Record | None:
        """Take the key IN_PROGRESS for ``owner``: None if done, else the live record in the way."""
        ...

    def renew(self, leases: Sequence[Lease]) -> list[str]:
        """Move each IN_PROGRESS lease's expiry; returns the keys ``owner`` no longer holds.

        A record ``owner`` itself completed is still its own: not returned, and left
        as it is (its time to live does not change).
        """
        ...

    def complete(self, key: str, owner: str, digest: str, expires_at: float, now: float) -> bool:
        """Mark the key COMPLETED; False if another owner's live record stood in the way."""
        ...

    def release(self, key: str, owner: str) -> None:
        """Forget ``owner``'s IN_PROGRESS record, so a retry can run at once."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class TransactionalStore(Protocol):
    """A store in a SQL database the handler can write to in the same transaction."""

    def transaction(
        self, key: str, owner: str, expires_at: float
    ) -> AbstractContextManager[Any]: ...


@dataclass(frozen=True)
class StoreURL:
    url: str
    scheme: str
    location: str  # the database path or the table name
    options: dict[str, str]


OPTIONS: dict[str, set[str]] = {
    "memory": set(),
    "sqlite": {"timeout", "synchronous"},
    "dynamodb": {"region", "endpoint"},
}
# Besides these, a PostgreSQL URL's parameters are libpq's (sslmode, ...): libpq checks them.
POSTGRES_OPTIONS = {"table", "pool"}
POSTGRES_TABLE = "sqsworker_idempotency"
POSTGRES_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")  # unquoted in SQL as written


def parse_url(url: str) -> StoreURL:
    """Check a store URL's shape without touching the store."""
    parts = urlsplit(url.strip())
    hint = "use memory://, sqlite:///PATH.db, dynamodb://TABLE or postgresql://HOST/DB"
    if parts.scheme not in SCHEMES or "://" not in url:
        raise ConfigError(f"{shown(url)!r} is not an idempotency store URL: {hint}", field="store")
    query = parse_qs(parts.query, keep_blank_values=True)
    options = {k: v[-1] for k, v in query.items()}
    if parts.scheme in ("postgresql", "postgres"):
        ours = {k: v for k, v in options.items() if k in POSTGRES_OPTIONS}
        table = ours.get("table", POSTGRES_TABLE)
        names = table.split(".")
        if len(names) > 2 or not all(POSTGRES_NAME.fullmatch(n) for n in names):
            raise ConfigError(
                f"{shown(url)}: table={table!r} is not a table name; use lowercase letters, "
                "digits and '_' (up to 63, not starting with a digit), as NAME or SCHEMA.NAME",
                field="store",
            )
        if "pool" in ours and not (ours["pool"].isdigit() and int(ours["pool"]) >= 2):
            raise ConfigError(
                f"{shown(url)}: pool must be a number of connections, 2 or more",
                field="store",
            )
        return StoreURL(url.strip(), "postgresql", parts.netloc + parts.path, ours)
    unknown = sorted(set(options) - OPTIONS[parts.scheme])
    if unknown:
        allowed = ", ".join(sorted(OPTIONS[parts.scheme])) or "none"
        raise ConfigError(
            f"{url!r} has unknown option(s) {', '.join(unknown)}; "
            f"{parts.scheme} stores take: {allowed}",
            field="store",
        )
    if parts.scheme == "memory":
        return StoreURL(url, "memory", parts.netloc + parts.path, options)
    if parts.scheme == "sqlite":
        if parts.netloc:
            raise ConfigError(
                f"{url!r} names a host; write sqlite:///relative/path.db or "
                "sqlite:////absolute/path.db (three or four slashes)",
                field="store",
            )
        path = parts.path[1:]
        if not path or path == ":memory:":
            raise ConfigError(
                f"{url!r} names no database file: write sqlite:///PATH.db "
                "(an in-memory database cannot be shared by the worker's threads; "
                "use memory:// for tests)",
                field="store",
            )
        return StoreURL(url, "sqlite", path, options)
    table = parts.netloc
    if parts.path not in ("", "/") or not _valid_table(table):
        raise ConfigError(
            f"{url!r} does not name a DynamoDB table: write dynamodb://TABLE, where TABLE "
            "has 3 to 255 letters, digits, '_', '-' or '.'",
            field="store",
        )
    return StoreURL(url, "dynamodb", table, options)


def shown(url: str) -> str:
    """A URL without its password, for messages. It fails closed: when the part before
    the last '@' does not read as USER or USER:PASSWORD, all of it is masked."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    at = rest.rfind("@")
    if at >= 0:
        userinfo = rest[:at]
        if any(c in userinfo for c in "/?#"):  # not USER[:PASSWORD]: hide all of it
            userinfo = "***"
        elif ":" in userinfo:
            userinfo = userinfo.split(":", 1)[0] + ":***"
        rest = userinfo + rest[at:]
    rest = re.sub(r"(?i)([?&]password=)[^&#]*", r"\1***", rest)
    return f"{scheme}{sep}{rest}"


def scrubbed(text: str, url: str) -> str:
    """``text`` (a driver's message) without the password of ``url``, raw or decoded."""
    secrets = set(re.findall(r"(?i)[?&]password=([^&#]*)", url))
    rest = url.partition("://")[2]
    if "@" in rest:
        userinfo = rest[: rest.rfind("@")]
        if ":" in userinfo:
            secrets.add(userinfo.split(":", 1)[1])
    for secret in sorted(secrets, key=len, reverse=True):
        if secret:
            text = text.replace(secret, "***").replace(unquote(secret), "***")
    return text


def _valid_table(name: str) -> bool:
    return 3 <= len(name) <= 255 and all(c.isalnum() or c in "_-." for c in name)


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


class Transaction:
    """The handler's connection inside ``message.transaction()`` (a ``sqlite3`` or a
    psycopg connection): commits when the block ends. Everything the connection does,
    except ending the transaction early or closing it."""

    def __init__(self, db: Any) -> None:
        self._db = db

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)

    def commit(self) -> None:
        raise RuntimeError(
            "message.transaction() commits when its with-block ends; do not commit inside it"
        )

    def rollback(self) -> None:
        raise RuntimeError(
            "message.transaction() rolls back when an exception leaves its with-block; "
            "raise instead of calling rollback()"
        )

    def close(self) -> None:
        raise RuntimeError("the connection of message.transaction() belongs to the worker")
