"""A coroutine worker's deletes and returns, made on its event loop.

Where a coroutine worker receives on its event loop (the lean client, no proxy), the
lease keeper hands its delete and return calls to the same loop rather than to its
sender threads: each is a coroutine awaiting the transport's ``delete_batch_async`` or
``change_visibility_batch_async``. A handler's coroutine whose delete fills a batch hands
the call out itself (``LeaseKeeper._queue``), so a message settled on the loop wakes no
thread. Renewals stay on the keeper's renewal thread: a handler that blocks the loop
must not cost a lease.

Nor may a blocked loop hold up a delete for long: a call the loop has not begun within
``START_GRACE`` goes to a sender thread, and one it began and has not ended within
``CALL_MOST`` (past the SQS client's own bounds, by which a loop that runs has ended it)
is given up, its messages' deletes or returns made again on a thread. As the loop ends
(``detach``), the calls it has not begun go to the threads and those it began are waited
out within the same bound, then given up.

Every field here is guarded by the keeper's lock; the coroutines run on the loop's thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
from collections import deque
from typing import Any, Protocol

import structlog

from .clock import Clock
from .lease_machine import LeaseMachine
from .lease_state import Call
from .transports import BatchResult

# Seconds a call waits for a loop that does not begin it (a handler blocks the loop)
# before a sender thread makes it. The loop begins one within a pass of its own.
START_GRACE = 1.0
# Seconds a call the loop began may take: the SQS client connects within 5 s and reads an
# answer within 30 s; 10 s more, and only a loop a handler blocks has not ended it.
CALL_MOST = 5 + 30 + 10
log = structlog.get_logger("sqsworker")


class LoopSettles(Protocol):
    """A transport whose delete and return calls run on an event loop without a thread
    (``SQSTransport`` with the lean client)."""

    async def delete_batch_async(self, entries: list[tuple[str, str]]) -> BatchResult: ...

    async def change_visibility_batch_async(
        self, entries: list[tuple[str, str, int]]
    ) -> BatchResult: ...


class Keeper(Protocol):
    """What the loop's calls ask of the lease keeper (``lease.LeaseKeeper``)."""

    lock: threading.Lock  # guards the machine, and every field of ``LoopCalls``
    clock: Clock
    machine: LeaseMachine
    transport: Any

    def off_loop(self, calls: LoopCalls) -> None: ...

    def loop_call_ended(
        self, call: Call, entries: list[tuple[Any, int]], outcome: BatchResult | BaseException
    ) -> None: ...


class LoopCalls:
    """The keeper's delete and return calls on one event loop: those handed to it and not
    begun (``waiting``, with when), those under way (``started``, with when)."""

    def __init__(self, keeper: Keeper, loop: asyncio.AbstractEventLoop) -> None:
        self.keeper = keeper
        self.loop = loop
        self.transport: LoopSettles = keeper.transport
        self.waiting: deque[tuple[float, Call]] = deque()
        self.started: dict[int, tuple[float, Call]] = {}
        self._tasks: dict[asyncio.Task[None], Call] = {}
        self._starting = False  # a start is scheduled on the loop
        self._thread: int | None = None  # the loop's, once it began a call

    # -- for the keeper, under its lock -----------------------------------------------

    def on_its_thread(self) -> bool:
        return threading.get_ident() == self._thread

    def queue(self, calls: list[Call], now: float) -> None:
        """Calls for the loop to make: begun in its next pass."""
        self.waiting.extend((now, call) for call in calls)
        if self._starting:
            return
        self._starting = True
        if self.on_its_thread():
            self.loop.call_soon(self._start)
        else:
            self.loop.call_soon_threadsafe(self._start)

    def late(self, now: float) -> tuple[list[Call], list[Call]]:
        """The calls a blocked loop holds up: those not begun within ``START_GRACE``
        (taken back, for the threads), and those begun and not ended within ``CALL_MOST``
        (to be given up)."""
        not_begun = []
        while self.waiting and now >= self.waiting[0][0] + START_GRACE:
            not_begun.append(self.waiting.popleft()[1])
        stuck = [call for began, call in self.started.values() if now >= began + CALL_MOST]
        for call in stuck:
            del self.started[id(call)]
        if stuck:
            log.error(
                "deletes or returns on the event loop did not end within the SQS client's "
                "timeouts: a handler blocks the loop; they are made again on a thread",
                calls=len(stuck),
            )
        return not_begun, stuck

    def next_look(self) -> float:
        """When ``late`` may find a call next (inf: never, as things stand)."""
        first = self.waiting[0][0] + START_GRACE if self.waiting else math.inf
        return min([first, *(began + CALL_MOST for began, _ in self.started.values())])

    def take_waiting(self) -> list[Call]:
        calls = [call for _, call in self.waiting]
        self.waiting.clear()
        return calls

    # -- on the loop's thread -----------------------------------------------------------

    def _start(self) -> None:
        keeper = self.keeper
        self._thread = threading.get_ident()
        with keeper.lock:
            self._starting = False
            now = keeper.clock.monotonic()
            calls = self.take_waiting()
            for call in calls:
                self.started[id(call)] = (now, call)
            sending = [keeper.machine.sending(call, now) for call in calls]
        for call, entries in zip(calls, sending, strict=True):
            task = self.loop.create_task(self._make(call, entries))
            self._tasks[task] = call
            task.add_done_callback(self._tasks.pop)

    async def _make(self, call: Call, entries: list[tuple[Any, int]]) -> None:
        """One delete or return call, as a sender thread makes it (``LeaseKeeper._make``)."""
        outcome: BatchResult | BaseException
        try:
            if call.ops[0].action == "delete":
                outcome = await self.transport.delete_batch_async(
                    [(str(i), e.handle) for i, (e, _) in enumerate(entries)]
                )
            else:
                outcome = await self.transport.change_visibility_batch_async(
                    [(str(i), e.handle, seconds) for i, (e, seconds) in enumerate(entries)]
                )
        except BaseException as exc:  # a TransportError; or made again, as a sender's
            outcome = exc
        with self.keeper.lock:  # still this coroutine's, unless the lease thread gave it up
            ours = self.started.pop(id(call), None) is not None
        if ours:
            self.keeper.loop_call_ended(call, entries, outcome)
        if isinstance(outcome, BaseException) and not isinstance(outcome, Exception):
            raise outcome  # cancelled (the loop ends), or the process exits

    def detach(self, loop: asyncio.AbstractEventLoop) -> None:
        """As the loop ends (on its thread, not running): the calls it has not begun go to
        the threads, those under way are waited out within ``CALL_MOST``, then given up."""
        self.keeper.off_loop(self)
        with self.keeper.lock:  # not those the lease thread gave up already
            ours = [task for task, call in self._tasks.items() if id(call) in self.started]
        tasks = list(self._tasks)
        if not tasks:
            return
        with contextlib.suppress(RuntimeError):
            if ours:
                loop.run_until_complete(asyncio.wait(ours, timeout=CALL_MOST))
            for task in tasks:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
