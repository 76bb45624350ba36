"""``postgresql://user@host:port/db?table=NAME``: records in a PostgreSQL table.

Shared by every worker that reaches the database, on psycopg 3 with a connection
pool (``pip install 'sqsworker[postgres]'``): a connection is lent for one call
(or one ``transaction()`` block); one the server dropped fails that call (the
message takes the failure path) and the pool replaces it. Every call is bounded:
the pool's wait, the server's statement timeout, the socket's (TCP user timeout,
keepalives), and a watchdog for a server that stops answering altogether.

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

import itertools
import os
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus
from psycopg_pool import ConnectionPool, PoolTimeout

from ..errors import LeaseLost, StartupError, StoreError
from .base import STORE_CALL_LIMIT, Lease, Record, State, Transaction
from .urls import POSTGRES_OPTIONS, POSTGRES_TABLE, StoreURL, scrubbed, shown

PURGE_EVERY = 1000  # claims between purges of expired records
PURGE_BATCH = 1000
# Every store call ends within STORE_CALL_LIMIT: waiting for a pooled connection,
# connecting, then the statement.
POOL_WAIT = 8.0
CONNECT_TIMEOUT = 10
STATEMENT_TIMEOUT_MS = 15_000
# A statement the server's timeout did not end (the server stopped, its host froze
# while TCP still answers): the watchdog cuts the connection this much later.
WATCHDOG_MARGIN = 5.0
assert POOL_WAIT + CONNECT_TIMEOUT + STATEMENT_TIMEOUT_MS / 1000 + WATCHDOG_MARGIN < (
    STORE_CALL_LIMIT
)


def parse(url: StoreURL) -> tuple[str, tuple[str, ...], int | None]:
    """libpq's connection URL (the store's own parameters taken out, libpq's left as
    written), the table's name, and the pool's size; parse_url checked both."""
    head, _, query = url.url.strip().partition("?")
    kept = [p for p in query.split("&") if p and p.split("=", 1)[0] not in POSTGRES_OPTIONS]
    conninfo = head + ("?" + "&".join(kept) if kept else "")
    table = tuple(url.options.get("table", POSTGRES_TABLE).split("."))
    size = int(url.options["pool"]) if "pool" in url.options else None
    return conninfo, table, size


def _settings(conninfo: str) -> dict[str, Any]:
    """Connection settings: autocommit; every call bounded (connect, each statement on
    the server, unacknowledged data and a silent peer on the client's socket)."""
    given = conninfo_to_dict(conninfo)
    options = f"{given.get('options', '')} -c statement_timeout={STATEMENT_TIMEOUT_MS}"
    settings: dict[str, Any] = {
        "autocommit": True,
        "options": options.strip(),
        "connect_timeout": given.get("connect_timeout", CONNECT_TIMEOUT),
        "keepalives": 1,
        "keepalives_idle": given.get("keepalives_idle", 5),
        "keepalives_interval": given.get("keepalives_interval", 2),
        "keepalives_count": given.get("keepalives_count", 3),
        "tcp_user_timeout": given.get("tcp_user_timeout", STATEMENT_TIMEOUT_MS),
    }
    return settings


class PostgresStore:
    def __init__(self, url: str, pool: ConnectionPool, table: tuple[str, ...]) -> None:
        self.url = shown(url)
        self._raw = url  # for scrubbing its password out of libpq's messages
        self._pool = pool
        t = sql.Identifier(*table)

        def statement(text: str) -> str:
            """``text`` with the table named, rendered once: psycopg parses a text query
            once and caches it, where a composed one is rendered again at every call."""
            return sql.SQL(text).format(t=t, n=sql.Literal(PURGE_BATCH)).as_string(None)

        self._claim = statement(
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
        self._renew = statement(
            "UPDATE {t} AS r SET expires_at = CASE r.state"
            " WHEN 'in_progress' THEN v.expires_at ELSE r.expires_at END"
            " FROM unnest(%s::text[], %s::text[], %s::float8[]) AS v(key, owner, expires_at)"
            " WHERE r.key = v.key AND r.owner = v.owner RETURNING r.key"
        )
        self._complete = statement(
            "INSERT INTO {t} AS r (key, state, owner, digest, expires_at)"
            " VALUES (%(key)s, 'completed', %(owner)s, %(digest)s, %(expires_at)s)"
            " ON CONFLICT (key) DO UPDATE SET state = 'completed', owner = excluded.owner,"
            " digest = excluded.digest, expires_at = excluded.expires_at"
            " WHERE r.owner = excluded.owner OR r.expires_at <= %(now)s"
        )
        self._complete_own = statement(
            "UPDATE {t} SET state = 'completed', expires_at = %s"
            " WHERE key = %s AND owner = %s AND state = 'in_progress'"
        )
        self._release = statement(
            "DELETE FROM {t} WHERE key = %s AND owner = %s AND state = 'in_progress'"
        )
        self._get = statement("SELECT state, owner, digest, expires_at FROM {t} WHERE key = %s")
        self._purge = statement(
            "DELETE FROM {t} WHERE key IN (SELECT key FROM {t} WHERE expires_at <= %s"
            " ORDER BY expires_at LIMIT {n} FOR UPDATE SKIP LOCKED)"
        )
        self._lock = threading.Lock()  # guards _claims
        self._claims = 0
        self._watchdog = Watchdog(STATEMENT_TIMEOUT_MS / 1000 + WATCHDOG_MARGIN)

    @classmethod
    def open(cls, url: StoreURL, *, create: bool = False, pool_size: int = 10) -> PostgresStore:
        conninfo, table, size = parse(url)
        where = shown(url.url)
        try:
            settings = _settings(conninfo)
        except psycopg.Error as exc:
            raise StartupError(
                f"the idempotency store {where} has a URL libpq cannot read "
                f"({scrubbed(_first_line(exc), url.url)}): check its spelling and quoting "
                "(percent-encode '/', '?', '#', '@' and '%' in a password)"
            ) from None
        try:  # once by hand: the pool's own failure says only that it timed out
            with psycopg.connect(conninfo, **settings) as db:
                if len(table) == 1:  # the schema is fixed now: a handler's search_path
                    [(schema,)] = db.execute("SELECT current_schema()").fetchall()
                    table = (str(schema), table[0])  # cannot move the store's table
                if create:
                    _create(db, table)
                _check(db, table, where)
        except psycopg.Error as exc:
            raise StartupError(
                f"the idempotency store {where} cannot be used "
                f"({scrubbed(_first_line(exc), url.url)}): check the host, port, database "
                "and credentials (in the URL, PGPASSWORD or ~/.pgpass)"
            ) from None
        pool = ConnectionPool(
            conninfo,
            min_size=1,
            max_size=size or pool_size,
            kwargs=settings,
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

    def _error(self, exc: BaseException) -> StoreError:
        return StoreError(f"PostgreSQL store {self.url}: {scrubbed(_first_line(exc), self._raw)}")

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection for one call. A connection the server dropped is not put
        back in use: the pool replaces it."""
        try:
            with self._pool.connection() as db:
                yield db
        except (psycopg.Error, PoolTimeout) as exc:
            raise self._error(exc) from exc

    def _execute(self, query: str, params: Any) -> list[tuple[Any, ...]]:
        """The rows ``query`` returned; for one that returns none, [(rows it changed,)]."""
        with self._connection() as db:
            cursor = self._run(db, query, params)
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
            if state is not None and until > now:
                return Record(State(state), holder, held_digest, until)
            # The statement's snapshot predates the record in the way (another worker
            # claimed the key meanwhile): claim again, with a snapshot that shows it.
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
        try:
            db = self._pool.getconn()
        except (psycopg.Error, PoolTimeout) as exc:
            raise self._error(exc) from exc
        try:  # the handler's own errors leave the block as they are
            with db.transaction():
                self._run(db, "SET LOCAL statement_timeout = 0")
                yield Transaction(db)
                if db.info.transaction_status != TransactionStatus.INTRANS:
                    raise RuntimeError(
                        "message.transaction(): the block ended its transaction itself "
                        "(COMMIT or ROLLBACK through execute()); its writes and the key's "
                        "completion can no longer commit together"
                    )
                self._run(db, f"SET LOCAL statement_timeout = {STATEMENT_TIMEOUT_MS}")
                completed = self._run(db, self._complete_own, (expires_at, key, owner))
                if completed.rowcount != 1:
                    raise LeaseLost(
                        f"the idempotency record of {key!r} is no longer this worker's "
                        "claim (its lease lapsed, and another worker claimed or completed "
                        "it); this transaction was rolled back, so the effect happens once"
                    )
            if not db.broken:  # a session setting the handler changed stays with it
                self._run(db, "RESET ALL")
        finally:
            self._pool.putconn(db)  # a broken connection is dropped, not reused

    def _run(self, db: psycopg.Connection[Any], query: str, params: Any = None) -> Any:
        """One statement of the store's, watched, its errors a StoreError."""
        try:
            with self._watchdog.watching(db):
                return db.execute(query, params)
        except psycopg.Error as exc:
            raise self._error(exc) from exc

    def get(self, key: str) -> Record | None:
        rows = self._execute(self._get, (key,))
        if not rows:
            return None
        state, owner, digest, expires_at = rows[0]
        return Record(State(state), owner, digest, expires_at)

    def close(self) -> None:
        self._watchdog.close()
        self._pool.close()

    def _maybe_purge(self, now: float) -> None:
        with self._lock:
            self._claims += 1
            if self._claims % PURGE_EVERY != 1:
                return
        self._execute(self._purge, (now,))


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
        ).format(t=t)
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
    indexes = db.execute(  # (unique, first column) of each one-column index
        "SELECT i.indisunique, a.attname FROM pg_index i JOIN pg_attribute a"
        " ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]"
        " WHERE i.indrelid = to_regclass(%s) AND i.indnatts = 1",
        (t.as_string(db),),
    ).fetchall()
    if (True, "key") not in indexes:
        raise StartupError(
            f"the table {'.'.join(table)} of {where} has no primary key or unique index on "
            "key, which claims rely on: name another with ?table= or recreate it with "
            "`sqsworker create-store`"
        )
    if not any(column == "expires_at" for _, column in indexes):
        raise StartupError(
            f"the table {'.'.join(table)} of {where} has no index on expires_at, so purging "
            f"expired records would scan it: run `sqsworker create-store {where}`"
        )


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


class Watchdog:
    """Cuts the socket of a store statement that outlives ``limit`` seconds, so the
    thread waiting on it gets an error instead of waiting for ever. The server's
    statement timeout ends a slow statement; this ends a wait on a server that no
    longer answers at all (a stopped process, a frozen host whose TCP stack still
    acknowledges): one thread, started at the first call."""

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self._calls: dict[int, tuple[float, psycopg.Connection[Any]]] = {}
        self._numbers = itertools.count()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    @contextmanager
    def watching(self, db: psycopg.Connection[Any]) -> Iterator[None]:
        number = next(self._numbers)
        with self._wake:
            self._calls[number] = (time.monotonic() + self.limit, db)
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(
                    target=self._run, name="sqsworker-store-watchdog", daemon=True
                )
                self._thread.start()
        try:
            yield
        finally:
            with self._wake:
                self._calls.pop(number, None)

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify_all()

    def _run(self) -> None:
        while True:
            with self._wake:
                if self._closed:
                    return
                now = time.monotonic()
                overdue = [n for n, (deadline, _) in self._calls.items() if deadline <= now]
                cut = [self._calls.pop(n)[1] for n in overdue]
                if not cut:
                    soonest = min((d for d, _ in self._calls.values()), default=now + 1.0)
                    self._wake.wait(max(0.05, min(1.0, soonest - now)))
                    continue
            for db in cut:
                _cut(db)


def _cut(db: psycopg.Connection[Any]) -> None:
    """Shut the connection's socket down under the thread blocked on it: its read
    fails, psycopg marks the connection broken, the pool drops it."""
    try:
        fd = os.dup(db.pgconn.socket)
    except (OSError, psycopg.Error):
        return  # closed meanwhile
    with socket.socket(fileno=fd) as sock, suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
