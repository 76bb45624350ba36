"""``sqlite:///path.db``: records in a SQLite database on this host.

Safe across threads (one connection per thread) and processes (WAL journal, a
busy timeout instead of "database is locked"). Each operation is one statement,
so each is atomic without holding a lock across calls.

``synchronous=NORMAL`` by default: a committed transaction survives the process
being killed (``kill -9``); a power loss may undo the last few.
``?synchronous=full`` makes each commit wait for the disk. ``?timeout=S`` is the
busy timeout (10 s, at most 20): a write waits at most that for its turn among this process's
writers, and at most that again for SQLite's lock.

``transaction()`` gives a handler the database inside ``BEGIN IMMEDIATE`` and
writes the completion record in the same transaction, but only while the claim
is still the handler's own: a worker whose claim passed to another worker gets
its writes rolled back. ``stores/postgres.py`` follows the same shape.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from ..errors import ConfigError, LeaseLost, StartupError, StoreError
from .base import STORE_CALL_LIMIT, Lease, Record, State, Transaction
from .urls import StoreURL

TABLE = "sqsworker_idempotency"
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    key TEXT PRIMARY KEY,
    state TEXT NOT NULL,          -- 'in_progress' or 'completed'
    owner TEXT NOT NULL,          -- one claim of one message
    digest TEXT NOT NULL,         -- hash of the body
    expires_at REAL NOT NULL      -- epoch seconds: the lease's end, or the record's TTL
);
CREATE INDEX IF NOT EXISTS {TABLE}_expires_at ON {TABLE} (expires_at);
"""
PURGE_EVERY = 1000  # claims between purges of expired records
PURGE_BATCH = 1000
SYNCHRONOUS = ("off", "normal", "full", "extra")
MAX_TIMEOUT = STORE_CALL_LIMIT / 2  # a write waits its turn, then SQLite's lock: each at most this


class SQLiteStore:
    # ``transaction`` holds the database's write lock: no other worker can take any key
    # while a block runs (read by ``idempotency.Claim.transaction``).
    locks_every_key = True

    def __init__(self, path: str, url: str, *, timeout: float = 10.0, synchronous: str = "normal"):
        self.url = url
        self.path = path
        self.timeout = timeout
        self.synchronous = synchronous
        self._local = threading.local()
        self._lock = threading.Lock()  # guards _connections and _claims
        # One writer at a time in this process, around single statements and the
        # renewals' short transaction (never around a handler's transaction block):
        # SQLite's own busy wait sleeps whole milliseconds, so threads queueing here
        # instead write sooner. Other processes still meet the busy timeout. Taken
        # through _turn(): the writer holding it may itself be in SQLite's busy wait
        # (for a handler's transaction block), and writers queued behind it must not
        # wait a busy timeout each, one after another.
        self._writing = threading.Lock()
        self._connections: list[sqlite3.Connection] = []
        self._claims = 0

    @classmethod
    def open(cls, url: StoreURL) -> SQLiteStore:
        try:
            timeout = float(url.options.get("timeout", "10"))
        except ValueError:
            raise ConfigError(f"{url.url!r}: timeout must be a number of seconds") from None
        if not 0 <= timeout <= MAX_TIMEOUT:
            raise ConfigError(
                f"{url.url!r}: timeout must be from 0 to {MAX_TIMEOUT:g} seconds, so that a "
                "claim's renewal always ends before the claim could lapse"
            )
        synchronous = url.options.get("synchronous", "normal").lower()
        if synchronous not in SYNCHRONOUS:
            raise ConfigError(f"{url.url!r}: synchronous must be one of {', '.join(SYNCHRONOUS)}")
        folder = os.path.dirname(os.path.abspath(url.location))
        if not os.path.isdir(folder):
            raise StartupError(
                f"the idempotency store {url.url} is in {folder}, which does not exist: "
                "create the folder or choose another path"
            )
        store = cls(url.location, url.url, timeout=timeout, synchronous=synchronous)
        try:
            store._connection().executescript(SCHEMA)
        except sqlite3.Error as exc:
            store.close()
            raise StartupError(
                f"the idempotency store {url.url} cannot be opened ({exc}): "
                "check that the file is a SQLite database this user can write"
            ) from None
        return store

    # -- connections -------------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            # isolation_level=None: each statement commits by itself unless we BEGIN.
            db = sqlite3.connect(
                self.path, timeout=self.timeout, isolation_level=None, check_same_thread=False
            )
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(f"PRAGMA synchronous={self.synchronous}")
            self._local.db = db
            with self._lock:
                self._connections.append(db)
        return db

    def _execute(self, sql: str, *params: Any) -> sqlite3.Cursor:
        try:
            return self._connection().execute(sql, params)
        except sqlite3.Error as exc:
            raise StoreError(f"SQLite store {self.path}: {exc}") from exc

    @contextmanager
    def _turn(self) -> Iterator[None]:
        """This process's write turn: waited for at most the busy timeout, so a writer
        waits at most twice that in all, however many queue behind a locked database."""
        if not self._writing.acquire(timeout=max(0.0, self.timeout)):
            raise StoreError(
                f"SQLite store {self.path}: database is locked (this process's writers "
                f"waited {self.timeout:g} s for it)"
            )
        try:
            yield
        finally:
            self._writing.release()

    def _write(self, sql: str, *params: Any) -> sqlite3.Cursor:
        with self._turn():
            return self._execute(sql, *params)

    # -- the Store protocol ----------------------------------------------------------------

    def claim(
        self, key: str, owner: str, digest: str, expires_at: float, now: float
    ) -> Record | None:
        self._maybe_purge(now)
        taken = self._write(
            f"INSERT INTO {TABLE} (key, state, owner, digest, expires_at) "
            "VALUES (?, 'in_progress', ?, ?, ?) "
            "ON CONFLICT (key) DO UPDATE SET state = 'in_progress', owner = excluded.owner, "
            f"digest = excluded.digest, expires_at = excluded.expires_at "
            f"WHERE {TABLE}.expires_at <= ?",
            key,
            owner,
            digest,
            expires_at,
            now,
        )
        if taken.rowcount == 1:
            return None
        row = self._execute(
            f"SELECT state, owner, digest, expires_at FROM {TABLE} WHERE key = ?", key
        ).fetchone()
        if row is None:  # released between the two statements: try once more
            return self.claim(key, owner, digest, expires_at, now)
        return Record(State(row[0]), row[1], row[2], row[3])

    def renew(self, leases: Sequence[Lease]) -> list[str]:
        lost = []
        db = self._connection()
        with self._turn():
            try:
                db.execute("BEGIN IMMEDIATE")
                try:
                    for lease in leases:
                        # A record this owner completed meanwhile is still its own: kept as is.
                        moved = db.execute(
                            f"UPDATE {TABLE} SET expires_at = CASE state "
                            "WHEN 'in_progress' THEN ? ELSE expires_at END "
                            "WHERE key = ? AND owner = ?",
                            (lease.expires_at, lease.key, lease.owner),
                        )
                        if moved.rowcount != 1:
                            lost.append(lease.key)
                    db.execute("COMMIT")
                except BaseException:
                    if db.in_transaction:
                        db.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise StoreError(f"SQLite store {self.path}: {exc}") from exc
        return lost

    def complete(self, key: str, owner: str, digest: str, expires_at: float, now: float) -> bool:
        done = self._write(
            f"INSERT INTO {TABLE} (key, state, owner, digest, expires_at) "
            "VALUES (?, 'completed', ?, ?, ?) "
            "ON CONFLICT (key) DO UPDATE SET state = 'completed', owner = excluded.owner, "
            "digest = excluded.digest, expires_at = excluded.expires_at "
            f"WHERE {TABLE}.owner = excluded.owner OR {TABLE}.expires_at <= ?",
            key,
            owner,
            digest,
            expires_at,
            now,
        )
        return done.rowcount == 1

    def release(self, key: str, owner: str) -> None:
        self._write(
            f"DELETE FROM {TABLE} WHERE key = ? AND owner = ? AND state = 'in_progress'",
            key,
            owner,
        )

    @contextmanager
    def transaction(
        self,
        key: str,
        owner: str,
        expires_at: float,
        keep_until: Callable[[], float] | None = None,
    ) -> Iterator[Transaction]:
        """The handler's writes and the completion record, committed together or not at all.

        The block holds SQLite's write lock, which other writers (threads of this process
        too) wait for up to the busy timeout; it holds no lock of this process, so user
        code inside it never keeps another thread from running. When the block fails,
        its writes are undone and the claim is moved to ``keep_until()`` before the lock
        goes: the lease ran on without the claim meanwhile (nobody else could take it).
        """
        db = self._connection()
        try:
            with self._turn():  # queued with this process's writers for the BEGIN only
                db.execute("BEGIN IMMEDIATE")  # the write lock now: no deadlock upgrading later
        except sqlite3.Error as exc:
            raise StoreError(f"SQLite store {self.path}: {exc}") from exc
        # A name no savepoint of the block's own can have: ROLLBACK TO finds the newest.
        savepoint = f"sqsworker_{uuid.uuid4().hex}"
        try:
            db.execute(f"SAVEPOINT {savepoint}")
            try:
                yield Transaction(db)
            except BaseException:
                if keep_until is not None:
                    self._keep(db, savepoint, key, owner, keep_until)
                raise
            if not db.in_transaction:
                raise RuntimeError(
                    "message.transaction(): the block ended its transaction itself (COMMIT "
                    "or ROLLBACK through execute()); its writes and the key's completion can "
                    "no longer commit together"
                )
            # SQLite's write lock is ours until COMMIT: no need to queue for _writing
            # (and a writer queued there waits for this very transaction).
            completed = db.execute(
                f"UPDATE {TABLE} SET state = 'completed', expires_at = ? "
                "WHERE key = ? AND owner = ? AND state = 'in_progress'",
                (expires_at, key, owner),
            )
            if completed.rowcount != 1:
                raise LeaseLost(
                    f"the idempotency record of {key!r} passed to another worker while "
                    "this one ran (its lease lapsed); this transaction was rolled back, "
                    "so the effect happens once, there"
                )
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    def _keep(
        self,
        db: sqlite3.Connection,
        savepoint: str,
        key: str,
        owner: str,
        until: Callable[[], float],
    ) -> None:
        """After a failed block: its writes undone, its claim moved, in the lock it holds.
        Whatever fails here, the block's own error goes on (the lease then waits for the
        claim, which the keeper moves)."""
        try:
            expires_at = until()
            if db.in_transaction:
                db.execute(f"ROLLBACK TO {savepoint}")
                db.execute(
                    f"UPDATE {TABLE} SET expires_at = max(expires_at, ?) "
                    "WHERE key = ? AND owner = ? AND state = 'in_progress'",
                    (expires_at, key, owner),
                )
                db.execute("COMMIT")
        except Exception:  # the block's error is the one to raise
            pass

    def get(self, key: str) -> Record | None:
        row = self._execute(
            f"SELECT state, owner, digest, expires_at FROM {TABLE} WHERE key = ?", key
        ).fetchone()
        return None if row is None else Record(State(row[0]), row[1], row[2], row[3])

    def close(self) -> None:
        with self._lock:
            connections, self._connections = self._connections, []
        for db in connections:
            db.close()

    def _maybe_purge(self, now: float) -> None:
        with self._lock:
            self._claims += 1
            if self._claims % PURGE_EVERY != 1:
                return
        self._write(
            f"DELETE FROM {TABLE} WHERE key IN "
            f"(SELECT key FROM {TABLE} WHERE expires_at <= ? LIMIT {PURGE_BATCH})",
            now,
        )
