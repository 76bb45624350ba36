"""Pieces the benchmarks share."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from sqsworker import Message
from sqsworker.events import Observer


class Finish(Observer):
    """Notes when the last of ``messages`` was deleted: the end of a drain, without burst
    mode's closing empty poll."""

    def __init__(self, messages: int) -> None:
        self.left = messages
        self.at: float | None = None
        self._lock = threading.Lock()

    def add(self, deleted: int = 1) -> None:
        with self._lock:
            self.left -= deleted
            if self.left <= 0 and self.at is None:
                self.at = time.perf_counter()

    def deleted(self, messages: Sequence[Message]) -> None:
        self.add(len(messages))
