"""A coroutine worker's deletes and returns, made on its event loop.

Where a coroutine worker receives on its event loop (the lean client, no proxy), the
lease keeper hands its delete and return calls to the same loop rather than to its
sender threads: each is a coroutine awaiting the transport's ``delete_batch_async`` or
``change_visibility_batch_async``. A handler's coroutine whose delete fills a batch hands
the call out itself (``LeaseKeeper._queue``), so a message settled on the loop wakes no
thread. Renewals stay on the keeper's renewal thread: a handler that blocks the loop
must not cost a lease.

Nor may a blocked loop hold up a delete for long. The loop's heartbeat tells (``blocked``:
seconds it is late, 0 while it runs freely, ``coroutines.BLOCKED`` at least): while it is
blocked, the keeper hands its calls to the sender threads, and the lease thread (which
looks every ``LOOK`` seconds while the loop has calls) takes back what the loop has not
begun (a call is begun at its coroutine's first step, when it goes out); a call begun and
held up by a loop blocked ``GIVE_UP`` seconds is given up, its messages' deletes or
returns made again on a thread (a delete made twice deletes once; the late answer is
dropped). A slow SQS on a loop that runs is never given up: the client's own timeouts
bound the call. As the loop ends (``detach``), what it has not begun goes to the threads
and what it began is waited out within ``CALL_MOST``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import structlog

from .clock import Clock
from .lease_machine import LeaseMachine
from .lease_state import Call
from .transports import BatchResult

# Seconds between the lease thread's looks at the loop while the keeper uses it.
LOOK = 0.5
# Seconds a loop must be blocked before a call it began is given up.
GIVE_UP = 5.0
# Seconds a call the loop began may take, at most: the SQS client's 4 tries, each within
# 5 s to connect and 30 s to read, and 3 backoffs of at most 2.1 s; 10 s more.
CALL_MOST = 4 * (5 + 30) + 3 * 2.1 + 10
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

    def off_loop(self) -> None: ...

    def loop_call_ended(
        self, call: Call, entries: list[tuple[Any, int]], outcome: BatchResult | BaseException
    ) -> None: ...


class LoopCalls:
    """The keeper's delete and return calls on one event loop: handed to it and not yet
    given a coroutine (``waiting``), given one that has not stepped yet (``assigned``),
    and begun (``started``), each by ``id``."""

    def __init__(
        self, keeper: Keeper, loop: asyncio.AbstractEventLoop, blocked: Callable[[], float]
    ) -> None:
        self.keeper = keeper
        self.loop = loop
        self.blocked = blocked  # seconds the loop is late for its heartbeat; 0: it runs
        self.transport: LoopSettles = keeper.transport
        self.waiting: deque[Call] = deque()
        self.assigned: dict[int, Call] = {}
        self.started: dict[int, tuple[float, Call]] = {}  # with when each was begun
        self.detached = False  # the loop ends: it takes no more calls
        self._tasks: dict[asyncio.Task[None], Call] = {}
        self._starting = False  # a start is scheduled on the loop
        self._thread: int | None = None  # the loop's, once it began a call

    # -- for the keeper, under its lock -----------------------------------------------

    def takes_calls(self, here: bool = False) -> bool:
        """It takes calls now (``here``: and this is its thread): not ending, not blocked."""
        if self.detached or (here and threading.get_ident() != self._thread):
            return False
        return self.blocked() <= 0

    def queue(self, calls: list[Call]) -> None:
        """Calls for the loop to make: begun in its next pass."""
        self.waiting.extend(calls)
        if self._starting:
            return
        self._starting = True
        if threading.get_ident() == self._thread:
            self.loop.call_soon(self._start)
        else:
            self.loop.call_soon_threadsafe(self._start)

    def pending(self) -> bool:
        return bool(self.waiting or self.assigned or self.started)

    def late(self, now: float) -> tuple[list[Call], bool]:
        """While the loop is blocked: the calls it has not begun (taken back, for the
        threads); and once it has been blocked ``GIVE_UP`` seconds, those it began are
        given up (True if any was), their messages' calls made again. Once it ends (its
        heartbeat stops), those it began have the client's bounds, ``CALL_MOST``."""
        if not self.pending():
            return [], False
        blocked = 0.0 if self.detached else self.blocked()
        if blocked <= 0 and not self.detached:
            return [], False
        not_begun = self.take_waiting()
        if self.detached:  # given up past the client's bounds
            stuck = [call for began, call in self.started.values() if began <= now - CALL_MOST]
        else:  # given up once blocked GIVE_UP seconds
            stuck = [call for _, call in self.started.values()] if blocked >= GIVE_UP else []
        for call in stuck:
            del self.started[id(call)]
            self.keeper.machine.broke(call, now)
            self.keeper.machine.ended(call)
        if stuck:
            log.error(
                "deletes or returns on the event loop were held up by a handler blocking "
                "the loop; they are made again on a thread",
                calls=len(stuck),
            )
        return not_begun, bool(stuck)

    def take_waiting(self) -> list[Call]:
        """The calls not begun, taken back (their coroutines, if any, will find none)."""
        calls = [*self.waiting, *self.assigned.values()]
        self.waiting.clear()
        self.assigned.clear()
        return calls

    # -- on the loop's thread -----------------------------------------------------------

    def _start(self) -> None:
        self._thread = threading.get_ident()
        with self.keeper.lock:
            self._starting = False
            calls = list(self.waiting)
            self.waiting.clear()
            self.assigned.update((id(call), call) for call in calls)
        for call in calls:
            task = self.loop.create_task(self._make(call))
            self._tasks[task] = call
            task.add_done_callback(self._tasks.pop)

    async def _make(self, call: Call) -> None:
        """One delete or return call, as a sender thread makes it (``LeaseKeeper._make``),
        begun at this first step unless the lease thread took it back meanwhile."""
        keeper = self.keeper
        entries: list[tuple[Any, int]] = []
        outcome: BatchResult | BaseException
        try:
            with keeper.lock:
                if self.assigned.pop(id(call), None) is None:
                    return  # made on a thread instead
                self.started[id(call)] = (keeper.clock.monotonic(), call)
                entries = keeper.machine.sending(call, keeper.clock.monotonic())
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
        with keeper.lock:  # still this coroutine's, unless the lease thread gave it up
            ours = self.started.pop(id(call), None) is not None
        if ours:
            keeper.loop_call_ended(call, entries, outcome)
        if isinstance(outcome, BaseException) and not isinstance(outcome, Exception):
            raise outcome  # cancelled (the loop ends), or the process exits

    def detach(self, loop: asyncio.AbstractEventLoop) -> None:
        """As the loop ends (on its thread, not running): the calls it has not begun go to
        the threads, those under way are waited out within ``CALL_MOST``, then given up."""
        self.keeper.off_loop()
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
