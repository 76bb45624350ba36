"""``postgresql://user@host:port/db?table=NAME``: records in a PostgreSQL table.

Shared by every worker that reaches the database, on psycopg 3 with a connection
pool (``pip install 'sqsworker[postgres]'``): the pool opens and bounds the
connections, and each worker thread keeps the one it borrowed (a checkout per
statement cost as much as the statement); a connection the server dropped fails
its call once (the message takes the failure path) and is replaced.

Credentials come from the URL, from libpq's environment (``PGPASSWORD``,
``PGHOST``, ...) or from a ``.pgpass`` file; the store's URL as it is shown (logs,
errors) never carries a password. Other
query parameters (``sslmode``, ``connect_timeout``, ...) go to libpq as they are;
``table`` (default ``sqsworker_idempotency``, optionally ``schema.table``) and
``pool`` (connections, default the worker's concurrency + 2) are the store's.

Each operation is one statement in its own transaction, and contention on one key
is resolved by the database's row locks (``INSERT ... ON CONFLICT DO UPDATE ...
WHERE``), never by a lock of this process.

``transaction()`` gives the handler a pooled connection inside a transaction at
READ COMMITTED, PostgreSQL's default, and ends it with a conditional UPDATE that
completes the record only while the claim is still this worker's. That UPDATE
locks the record and re-checks its condition on the newest committed version, so
of two workers whose claims on one key overlapped (the first one's lapsed), the
first to commit its completion wins and the other's transaction finds the record
no longer its own, rolls back and raises ``LeaseLost``: the handler's writes
happen once. No stronger isolation is needed, because the decision rests on that
one row, locked.

Expired records are deleted every ``PURGE_EVERY`` claims, at most ``PURGE_BATCH``
at a time, found through the index on ``expires_at`` (a range scan, never a scan
of the table), skipping rows other workers have locked.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool, PoolTimeout

from ..errors import ConfigError, LeaseLost, StartupError, StoreError
from . import STORE_CALL_LIMIT, Lease, Record, State, StoreURL, shown

DEFAULT_TABLE = "sqsworker_idempotency"
PURGE_EVERY = 1000  # claims between purges of expired records
PURGE_BATCH = 1000
# Every store call ends within STORE_CALL_LIMIT: waiting for a pooled connection,
# connecting, then the statement.
POOL_WAIT = 10.0
CONNECT_TIMEOUT = 10
STATEMENT_TIMEOUT_MS = 15_000
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
assert POOL_WAIT + CONNECT_TIMEOUT + STATEMENT_TIMEOUT_MS / 1000 < STORE_CALL_LIMIT


def parse(url: StoreURL) -> tuple[str, tuple[str, ...], int | None]:
    """libpq's connection URL, the table's name (schema, table), and the pool's size."""
    parts = urlsplit(url.url.strip())
    ours = {"table", "pool"}
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in ours]
    conninfo = urlunsplit(parts._replace(query=urlencode(query)))
    table = url.options.get("table", DEFAULT_TABLE)
    names = tuple(table.split("."))
    if len(names) > 2 or not all(NAME.fullmatch(n) for n in names):
        raise ConfigError(
            f"{shown(url.url)}: table={table!r} is not a table name; use letters, digits "
            "and '_' (up to 63, not starting with a digit), as NAME or SCHEMA.NAME",
            field="store",
        )
    size = None
    if "pool" in url.options:
        try:
            size = int(url.options["pool"])
        except ValueError:
            size = 0
        if size < 1:
            raise ConfigError(
                f"{shown(url.url)}: pool must be a number of connections, 1 or more",
                field="store",
            )
    return conninfo, names, size


class PostgresStore:
    def __init__(self, url: str, pool: ConnectionPool, table: tuple[str, ...]) -> None:
        self.url = shown(url)
        self._pool = pool
        self._table = table
        t = sql.Identifier(*table)
        # Each statement rendered to text once: psycopg parses a text query once and
        # caches it, where a composed one is rendered again at every call.
        self._claim = (
            sql.SQL(
                "WITH claimed AS ("
                " INSERT INTO {t} AS r (key, state, owner, digest, expires_at)"
                " VALUES (%(key)s, 'in_progress', %(owner)s, %(digest)s, %(expires_at)s)"
                " ON CONFLICT (key) DO UPDATE SET state = 'in_progress', owner = excluded.owner,"
                " digest = excluded.digest, expires_at = excluded.expires_at"
                " WHERE r.expires_at <= %(now)s RETURNING 1)"
                # The record as it stood before this statement: the one in the way, if any.
                " SELECT (SELECT count(*) FROM claimed), r.state, r.owner, r.digest, r.expires_at"
                " FROM (SELECT 1) AS one LEFT JOIN {t} AS r ON r.key = %(key)s"
            )
            .format(t=t)
            .as_string(None)
        )
        self._renew = (
            sql.SQL(
                "UPDATE {t} AS r SET expires_at = CASE r.state"
                " WHEN 'in_progress' THEN v.expires_at ELSE r.expires_at END"
                " FROM unnest(%s::text[], %s::text[], %s::float8[]) AS v(key, owner, expires_at)"
                " WHERE r.key = v.key AND r.owner = v.owner RETURNING r.key"
            )
            .format(t=t)
            .as_string(None)
        )
        self._complete = (
            sql.SQL(
                "INSERT INTO {t} AS r (key, state, owner, digest, expires_at)"
                " VALUES (%(key)s, 'completed', %(owner)s, %(digest)s, %(expires_at)s)"
                " ON CONFLICT (key) DO UPDATE SET state = 'completed', owner = excluded.owner,"
                " digest = excluded.digest, expires_at = excluded.expires_at"
                " WHERE r.owner = excluded.owner OR r.expires_at <= %(now)s"
            )
            .format(t=t)
            .as_string(None)
        )
        self._complete_own = (
            sql.SQL(
                "UPDATE {t} SET state = 'completed', expires_at = %s"
                " WHERE key = %s AND owner = %s AND state = 'in_progress'"
            )
            .format(t=t)
            .as_string(None)
        )
        self._release = (
            sql.SQL("DELETE FROM {t} WHERE key = %s AND owner = %s AND state = 'in_progress'")
            .format(t=t)
            .as_string(None)
        )
        self._get = (
            sql.SQL("SELECT state, owner, digest, expires_at FROM {t} WHERE key = %s")
            .format(t=t)
            .as_string(None)
        )
        self._purge = (
            sql.SQL(
                "DELETE FROM {t} WHERE key IN (SELECT key FROM {t} WHERE expires_at <= %s"
                " ORDER BY expires_at LIMIT {n} FOR UPDATE SKIP LOCKED)"
            )
            .format(t=t, n=sql.Literal(PURGE_BATCH))
            .as_string(None)
        )
        self._lock = threading.Lock()  # guards _claims and _lent
        self._claims = 0
        # Each thread keeps the connection it borrowed (a pool's checkout costs more than
        # a statement): the handler threads, the claim keeper. The pool bounds and makes
        # them; a connection the server dropped fails its call once and is replaced.
        self._local = threading.local()
        self._lent: list[psycopg.Connection[Any]] = []

    @classmethod
    def open(cls, url: StoreURL, *, create: bool = False, pool_size: int = 10) -> PostgresStore:
        conninfo, table, size = parse(url)
        where = shown(url.url)
        settings: dict[str, Any] = {"autocommit": True}
        if "connect_timeout" not in conninfo:
            settings["connect_timeout"] = CONNECT_TIMEOUT
        try:  # once by hand: the pool's own failure says only that it timed out
            with psycopg.connect(conninfo, **settings) as db:
                if create:
                    _create(db, table)
                _check(db, table, where)
        except psycopg.Error as exc:
            raise StartupError(
                f"the idempotency store {where} cannot be used "
                f"({_first_line(exc)}): check the host, port, database and credentials "
                "(in the URL, PGPASSWORD or ~/.pgpass)"
            ) from None
        pool = ConnectionPool(
            conninfo,
            min_size=1,
            max_size=size or pool_size,
            kwargs=settings,
            configure=_configure,
            timeout=POOL_WAIT,
            name="sqsworker-idempotency",
            open=False,
        )
        try:
            pool.open(wait=True, timeout=POOL_WAIT + CONNECT_TIMEOUT)
        except PoolTimeout:
            pool.close()
            raise StartupError(
                f"the idempotency store {where} did not accept connections within "
                f"{POOL_WAIT + CONNECT_TIMEOUT:g} s: check that the server is up"
            ) from None
        return cls(url.url, pool, table)

    # -- calls -----------------------------------------------------------------------------

    def _borrowed(self) -> psycopg.Connection[Any]:
        """This thread's connection, borrowed from the pool the first time."""
        db: psycopg.Connection[Any] | None = getattr(self._local, "db", None)
        if db is None:
            try:
                db = self._pool.getconn()
            except (psycopg.Error, PoolTimeout) as exc:
                raise StoreError(f"PostgreSQL store {self.url}: {_first_line(exc)}") from exc
            self._local.db = db
            with self._lock:
                self._lent.append(db)
        return db

    def _give_back_if_broken(self, db: psycopg.Connection[Any]) -> None:
        if db.broken or db.closed:
            self._local.db = None
            with self._lock:
                self._lent.remove(db)
            self._pool.putconn(db)  # discarded: the pool opens another when needed

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        db = self._borrowed()
        try:
            yield db
        except psycopg.Error as exc:
            self._give_back_if_broken(db)
            raise StoreError(f"PostgreSQL store {self.url}: {_first_line(exc)}") from exc

    def _execute(self, query: str, params: Any) -> list[tuple[Any, ...]]:
        with self._connection() as db:
            cursor = db.execute(query, params)
            return cursor.fetchall() if cursor.description else [(cursor.rowcount,)]

    # -- the Store protocol ----------------------------------------------------------------

    def claim(
        self, key: str, owner: str, digest: str, expires_at: float, now: float
    ) -> Record | None:
        self._maybe_purge(now)
        params = {"key": key, "owner": owner, "digest": digest, "expires_at": expires_at}
        for _ in range(3):
            [(taken, state, holder, held_digest, until)] = self._execute(
                self._claim, {**params, "now": now}
            )
            if taken:
                return None
            if state is not None:
                return Record(State(state), holder, held_digest, until)
            # Inserted by another worker after this statement's snapshot: read it anew.
        raise StoreError(f"PostgreSQL store {self.url}: the record of {key!r} kept changing")

    def renew(self, leases: Sequence[Lease]) -> list[str]:
        if not leases:
            return []
        columns = (
            [lease.key for lease in leases],
            [lease.owner for lease in leases],
            [lease.expires_at for lease in leases],
        )
        kept = {key for (key,) in self._execute(self._renew, columns)}
        return [lease.key for lease in leases if lease.key not in kept]

    def complete(self, key: str, owner: str, digest: str, expires_at: float, now: float) -> bool:
        params = {"key": key, "owner": owner, "digest": digest, "expires_at": expires_at}
        [(count,)] = self._execute(self._complete, {**params, "now": now})
        return bool(count == 1)

    def release(self, key: str, owner: str) -> None:
        self._execute(self._release, (key, owner))

    @contextmanager
    def transaction(self, key: str, owner: str, expires_at: float) -> Iterator[Transaction]:
        """The handler's writes and the completion record, committed together or not at all.

        The handler's statements run without this store's statement timeout (they are
        the user's); the completion is bounded by it again.
        """
        db = self._borrowed()
        try:  # the handler's own errors leave the block as they are
            with db.transaction():
                db.execute("SET LOCAL statement_timeout = 0")
                yield Transaction(db)
                try:
                    db.execute(f"SET LOCAL statement_timeout = {STATEMENT_TIMEOUT_MS}")
                    completed = db.execute(self._complete_own, (expires_at, key, owner))
                except psycopg.Error as exc:
                    raise StoreError(f"PostgreSQL store {self.url}: {_first_line(exc)}") from exc
                if completed.rowcount != 1:
                    raise LeaseLost(
                        f"the idempotency record of {key!r} passed to another worker while "
                        "this one ran (its lease lapsed); this transaction was rolled back, "
                        "so the effect happens once, there"
                    )
        finally:
            self._give_back_if_broken(db)

    def get(self, key: str) -> Record | None:
        rows = self._execute(self._get, (key,))
        if not rows:
            return None
        state, owner, digest, expires_at = rows[0]
        return Record(State(state), owner, digest, expires_at)

    def close(self) -> None:
        with self._lock:
            lent, self._lent = self._lent, []
        for db in lent:
            self._pool.putconn(db)
        self._pool.close()

    def _maybe_purge(self, now: float) -> None:
        with self._lock:
            self._claims += 1
            if self._claims % PURGE_EVERY != 1:
                return
        self._execute(self._purge, (now,))


def _configure(db: psycopg.Connection[Any]) -> None:
    db.execute(f"SET statement_timeout = {STATEMENT_TIMEOUT_MS}")


def _create(db: psycopg.Connection[Any], table: tuple[str, ...]) -> None:
    index = sql.Identifier(f"{table[-1]}_expires_at")
    t = sql.Identifier(*table)
    db.execute(
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {t} ("
            " key text PRIMARY KEY,"
            " state text NOT NULL CHECK (state IN ('in_progress', 'completed')),"
            " owner text NOT NULL,"  # one claim of one message
            " digest text NOT NULL,"  # hash of the body
            " expires_at double precision NOT NULL)"  # epoch seconds: lease end, or TTL
        )
        .format(t=t)
        .as_string(None)
    )
    db.execute(sql.SQL("CREATE INDEX IF NOT EXISTS {i} ON {t} (expires_at)").format(i=index, t=t))


def _check(db: psycopg.Connection[Any], table: tuple[str, ...], where: str) -> None:
    """The table exists, with the columns and the index the statements rely on."""
    t = sql.Identifier(*table)
    try:
        columns = sql.SQL("SELECT key, state, owner, digest, expires_at FROM {t} LIMIT 0")
        db.execute(columns.format(t=t))
    except psycopg.errors.UndefinedTable:
        raise StartupError(
            f"the idempotency store {where} has no table {'.'.join(table)}: create it once "
            f"with `sqsworker create-store {where}`"
        ) from None
    except psycopg.errors.UndefinedColumn as exc:
        raise StartupError(
            f"the table {'.'.join(table)} of {where} is not an idempotency table "
            f"({_first_line(exc)}): name another with ?table="
        ) from None
    indexed = db.execute(
        "SELECT 1 FROM pg_index i JOIN pg_attribute a"
        " ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]"
        " WHERE i.indrelid = %s::regclass AND a.attname = 'expires_at'",
        (".".join(table),),
    ).fetchone()
    if indexed is None:
        raise StartupError(
            f"the table {'.'.join(table)} of {where} has no index on expires_at, so purging "
            f"expired records would scan it: run `sqsworker create-store {where}`"
        )


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


class Transaction:
    """The handler's connection inside ``message.transaction()``: commits when the block
    ends. Everything a ``psycopg.Connection`` does (``execute`` with ``%s`` parameters,
    ``cursor()``), except ending the transaction early."""

    def __init__(self, db: psycopg.Connection[Any]) -> None:
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
