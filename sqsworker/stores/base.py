"""What every idempotency store is: a key's ``Record`` (IN_PROGRESS or COMPLETED,
until ``expires_at``), the ``Lease`` an owner renews, the ``Store`` protocol the
backends implement, and the ``Transaction`` a SQL store lends a handler.

A record past its ``expires_at`` counts as absent. Times are wall-clock seconds since
the epoch, because the records are shared between processes and hosts. Every method
of a store may raise ``StoreError``.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

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
