"""``Latency``: a transport that answers as slowly as a real SQS endpoint.

The in-memory SQS answers in microseconds; real SQS takes about 20 ms a request. Wrapped
around a transport, ``Latency`` adds that time to each SQS call, half on the way there and
half on the way back, so the worker's timing is measured against a realistic service.
It also counts the CPU the wrapped transport's calls take (``service_cpu``, seconds):
with the in-memory SQS that is the service's own work, which a real SQS does elsewhere,
so a benchmark can tell the worker's CPU from the service's.

On a coroutine worker's event loop it answers as the lean client does there
(``receives_on_loop``): its receives, deletes and returns are awaited, the latency a
loop timer, the in-memory SQS's work done on the loop (it takes microseconds), and a
long poll of an empty queue waits on a thread of the service's own, not the loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from sqsworker.transports import (
        BatchResult,
        Envelope,
        OutgoingMessage,
        QueueCounts,
        Transport,
    )

T = TypeVar("T")


class Latency:
    def __init__(self, transport: Transport, seconds: float = 0.02) -> None:
        self.inner = transport
        self.seconds = seconds
        self.service_cpu = 0.0  # seconds of CPU in the wrapped transport's calls
        self._lock = threading.Lock()
        self._polls: concurrent.futures.ThreadPoolExecutor | None = None  # long polls

    def __getattr__(self, name: str) -> Any:  # info, requests, request_errors
        return getattr(self.inner, name)

    def _call(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if self.seconds:
            time.sleep(self.seconds / 2)
        cpu = time.thread_time()  # this thread's CPU only: waits on locks do not count
        try:
            return call(*args, **kwargs)
        finally:
            spent = time.thread_time() - cpu
            with self._lock:
                self.service_cpu += spent
            if self.seconds:
                time.sleep(self.seconds / 2)

    def receive(self, *args: Any, **kwargs: Any) -> list[Envelope]:
        return self._call(self.inner.receive, *args, **kwargs)

    def delete_batch(self, entries: Sequence[tuple[str, str]]) -> BatchResult:
        return self._call(self.inner.delete_batch, entries)

    def change_visibility_batch(self, entries: Sequence[tuple[str, str, int]]) -> BatchResult:
        return self._call(self.inner.change_visibility_batch, entries)

    def send_batch(self, messages: Sequence[OutgoingMessage]) -> BatchResult:
        return self._call(self.inner.send_batch, messages)

    def counts(self) -> QueueCounts:
        return self._call(self.inner.counts)

    def open(self, queue: str) -> Latency:
        return Latency(self.inner.open(queue), self.seconds)

    # -- on an event loop, as the lean client's calls --------------------------------

    def receives_on_loop(self) -> bool:
        return True

    async def _call_async(self, call: Callable[..., T], *args: Any) -> T:
        if self.seconds:
            await asyncio.sleep(self.seconds / 2)
        cpu = time.thread_time()
        try:
            return call(*args)
        finally:
            spent = time.thread_time() - cpu
            with self._lock:
                self.service_cpu += spent
            if self.seconds:
                await asyncio.sleep(self.seconds / 2)

    async def receive_async(
        self, max_messages: int, wait: int, visibility: int, attempt_id: str | None = None
    ) -> list[Envelope]:
        got = await self._call_async(self.inner.receive, max_messages, 0, visibility, attempt_id)
        if got or not wait:
            return got
        # An empty queue: SQS holds the request open; the service waits, not the loop.
        if self._polls is None:
            self._polls = concurrent.futures.ThreadPoolExecutor(32, "latency-long-poll")
        loop = asyncio.get_running_loop()
        poll = self.inner.receive
        return await loop.run_in_executor(
            self._polls, poll, max_messages, wait, visibility, attempt_id
        )

    async def delete_batch_async(self, entries: Sequence[tuple[str, str]]) -> BatchResult:
        return await self._call_async(self.inner.delete_batch, entries)

    async def change_visibility_batch_async(
        self, entries: Sequence[tuple[str, str, int]]
    ) -> BatchResult:
        return await self._call_async(self.inner.change_visibility_batch, entries)

    def close(self) -> None:
        if self._polls is not None:
            self._polls.shutdown(wait=False, cancel_futures=True)
        self.inner.close()
