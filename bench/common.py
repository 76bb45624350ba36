"""Pieces the benchmarks share."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from sqsworker import Message
from sqsworker.events import Observer


class Finish(Observer):
    """Notes when the last of ``messages`` was deleted: the end of a drain, without burst
    mode's closing empty poll; and the rate while the drain was under way (``steady()``:
    from the delete that passed a tenth of the messages to the one that passed nine
    tenths), which leaves out the start (the first receives) and the end (the last
    handlers and the last delete batch), fixed costs that weigh on a short drain."""

    def __init__(self, messages: int) -> None:
        self.messages = messages
        self.left = messages
        self.at: float | None = None
        self._marks: list[tuple[float, int]] = []  # (when, deleted so far) past 1/10, 9/10
        self._lock = threading.Lock()

    def add(self, deleted: int = 1) -> None:
        with self._lock:
            self.left -= deleted
            done = self.messages - self.left
            now = time.perf_counter()
            if len(self._marks) < 2 and done * 10 >= self.messages * (1 + 8 * len(self._marks)):
                self._marks.append((now, done))
            if self.left <= 0 and self.at is None:
                self.at = now

    def steady(self) -> float | None:
        """Messages a second between the two marks, or None for too small a drain."""
        if len(self._marks) < 2 or self._marks[1][0] <= self._marks[0][0]:
            return None
        (began, first), (ended, last) = self._marks
        return (last - first) / (ended - began)

    def deleted(self, messages: Sequence[Message]) -> None:
        self.add(len(messages))
