"""``memory://``: records in a dict, for tests. Shared by the threads of one process only."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from .base import Lease, Record, State


class MemoryStore:
    def __init__(self, url: str = "memory://") -> None:
        self.url = url
        self._lock = threading.Lock()  # guards _records
        self._records: dict[str, Record] = {}

    def claim(
        self, key: str, owner: str, digest: str, expires_at: float, now: float
    ) -> Record | None:
        with self._lock:
            record = self._records.get(key)
            if record is not None and record.expires_at > now:
                return record
            self._records[key] = Record(State.IN_PROGRESS, owner, digest, expires_at)
            return None

    def renew(self, leases: Sequence[Lease]) -> list[str]:
        lost = []
        with self._lock:
            for lease in leases:
                record = self._records.get(lease.key)
                if record is None or record.owner != lease.owner:
                    lost.append(lease.key)
                    continue
                if record.state is State.COMPLETED:
                    continue  # completed by this owner while the renewal went: not lost
                self._records[lease.key] = Record(
                    State.IN_PROGRESS, lease.owner, record.digest, lease.expires_at
                )
        return lost

    def complete(self, key: str, owner: str, digest: str, expires_at: float, now: float) -> bool:
        with self._lock:
            record = self._records.get(key)
            if record is not None and record.owner != owner and record.expires_at > now:
                return False
            self._records[key] = Record(State.COMPLETED, owner, digest, expires_at)
            return True

    def release(self, key: str, owner: str) -> None:
        with self._lock:
            record = self._records.get(key)
            if record is not None and _held_by(record, owner):
                del self._records[key]

    def get(self, key: str) -> Record | None:
        with self._lock:
            return self._records.get(key)

    def close(self) -> None:
        pass


def _held_by(record: Record, owner: str) -> bool:
    return record.state is State.IN_PROGRESS and record.owner == owner
