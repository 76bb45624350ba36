"""Coroutine handlers: an ``async def`` handler runs on one event loop thread.

``concurrency`` counts coroutines, not threads: whenever fewer than ``concurrency``
coroutines run, a dispatcher thread takes the next messages the worker would give handler
threads (FIFO lanes and deferred duplicates included), as many as may start, and starts
a coroutine for each on the loop, in one hop per batch. The steps around a handler that
block (an offloaded body fetched from S3, the idempotency store, a dead-letter copy) run
on a few helper threads, so the loop never waits on them.

A handler that blocks the loop (``time.sleep``, a synchronous client) stalls every
coroutine at once. A heartbeat on the loop and a watchdog thread beside it catch that:
one log line naming where the loop is stuck, and ``/healthz`` shows for how long (not
live past ``--stall-timeout``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import math
import sys
import threading
import traceback
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import structlog

from .clock import Clock
from .events import Observer

BEAT = 0.25  # seconds between the loop's heartbeats
BLOCKED = 0.5  # a heartbeat this late means a handler blocked the loop: logged
MAX_HELPERS = 16  # threads for the blocking steps around coroutine handlers

T = TypeVar("T")

log = structlog.get_logger("sqsworker")


class Helpers(concurrent.futures.Executor):
    """Up to ``size`` threads, started by the clock as work comes, that run the blocking
    steps around coroutine handlers (``loop.run_in_executor``). Unlike the standard
    thread pool, they wait through the worker's clock (the simulator runs them too), and
    are daemon threads: one stuck in a call to a store does not hold the process's exit."""

    def __init__(self, clock: Clock, size: int, name: str) -> None:
        self._clock = clock
        self._size = size
        self._name = name
        self._lock = threading.Condition()
        self._work: deque[tuple[concurrent.futures.Future[Any], Callable[[], Any]]] = deque()
        self._threads = 0
        self._idle = 0  # threads waiting for work
        self._shut = False

    def submit(
        self, fn: Callable[..., T], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._lock:
            if self._shut:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._work.append((future, functools.partial(fn, *args, **kwargs)))
            # An idle thread for each call waiting (one woken may not have taken its own
            # yet), else one more thread.
            if self._idle >= len(self._work):
                self._lock.notify()
            elif self._threads < self._size:
                self._threads += 1
                self._clock.spawn(f"{self._name}-{self._threads - 1}", self._serve)
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No more work; with ``cancel_futures``, what has not begun is cancelled. The
        threads end once idle (``wait`` is not honoured: no caller waits for them)."""
        with self._lock:
            self._shut = True
            while cancel_futures and self._work:
                self._work.popleft()[0].cancel()
            self._lock.notify_all()

    def _serve(self) -> None:
        while True:
            with self._lock:
                while not self._work and not self._shut:
                    self._idle += 1
                    try:
                        self._clock.wait(self._lock, None)
                    finally:
                        self._idle -= 1
                if not self._work:
                    return
                future, call = self._work.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = call()
            except BaseException as exc:  # handed to the awaiting coroutine, as the pool's
                future.set_exception(exc)
            else:
                future.set_result(result)
            del future, call  # not kept while idle


class EventLoopRunner:
    """The event loop thread, its dispatcher and watchdog threads, and the helper threads.

    ``next_messages(limit)`` blocks until there is a message to run and returns up to
    ``limit`` of them, or none once the worker closes; ``run_one(message)`` is the
    coroutine that handles one and settles it.
    """

    def __init__(
        self,
        concurrency: int,
        clock: Clock,
        next_messages: Callable[[int], list[Any]],
        run_one: Callable[[Any], Awaitable[None]],
        observer: Observer,
        give_back: Callable[[list[Any]], None],
    ) -> None:
        self.concurrency = concurrency
        self.helpers = min(concurrency, MAX_HELPERS)
        self._clock = clock
        self._next_messages = next_messages
        self._run_one = run_one
        self._observer = observer
        self._give_back = give_back  # messages taken that no coroutine will run
        self._room = threading.Condition()  # guards _running; the dispatcher waits on it
        self._running = 0  # coroutines started and not yet ended
        self.beat = BEAT  # seconds between the loop's heartbeats (the simulator's are longer)
        # The loop, and the clock it keeps time by (its heartbeat, the watchdog's waits).
        self._loop, self._ticks = clock.event_loop()
        self._pool = Helpers(clock, self.helpers, "sqsworker-async-helper")
        self._tasks: set[asyncio.Task[None]] = set()
        # Its first beat is its first step: until then (start() does not wait for the loop
        # thread to run) it is starting, not stalled.
        self._last_beat = math.inf
        self._stall = 0.0  # seconds the loop's last stall lasted, measured by its heartbeat
        self._loop_thread: int | None = None  # its ident, to show where it is stuck
        self._dispatching = False
        self._looping = False
        self._faults = 0  # coroutines that ended in a fault of the worker's own
        self._closed = threading.Event()
        self.at_end: list[Callable[[asyncio.AbstractEventLoop], None]] = []  # on its thread
        self._closing = threading.Condition()  # the watchdog waits on it between beats

    # -- for the worker -------------------------------------------------------------

    def start(self) -> None:
        # What the dispatcher hands the loop before it runs waits in the loop's queue.
        self._looping = self._dispatching = True
        self._clock.spawn("sqsworker-event-loop", self._run_loop)
        self._clock.spawn("sqsworker-dispatcher", self._dispatch)
        self._clock.spawn("sqsworker-loop-watchdog", self._watch)

    def alive(self) -> bool:
        """The loop and the dispatcher run, and no coroutine ended in a worker fault."""
        return self._looping and (self._dispatching or self._closed.is_set()) and not self._faults

    def blocked_for(self, allowance: float = BLOCKED) -> float:
        """Seconds the loop has been late for its heartbeat: 0 while it runs freely (a
        beat late by less than ``BLOCKED``, or than a smaller ``allowance``, is
        scheduling, not a stall), infinity once it ended without being closed."""
        if not self._looping:
            return 0.0 if self._closed.is_set() else math.inf
        late = self._ticks.monotonic() - self._last_beat - self.beat
        return late if late >= min(BLOCKED, allowance) else 0.0

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def keeps(self, clock: Clock) -> bool:
        """The loop keeps ``clock``'s time: a wait on it is a wait of the worker's."""
        return self._ticks is clock

    def start_tasks(self, coroutines: list[Coroutine[Any, Any, None]]) -> None:
        """Run ``coroutines`` on the loop, beside the handlers' (the receives)."""

        def begin() -> None:
            for coroutine in coroutines:
                task = self._loop.create_task(coroutine)
                self._tasks.add(task)
                task.add_done_callback(self._ended)

        self._loop.call_soon_threadsafe(begin)

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error(
                "a task of the worker's on the event loop failed", error=repr(task.exception())
            )

    async def offload(self, func: Callable[..., T], *args: Any) -> T:
        """``func(*args)`` on a helper thread, in this coroutine's context (its span and
        log fields), so a call that blocks does not stall the loop."""
        context = contextvars.copy_context()
        return await self._loop.run_in_executor(
            self._pool, functools.partial(context.run, func, *args)
        )

    def close(self, timeout: float = 1.0) -> None:
        """Cancel the coroutines still running (their messages were handed back already),
        stop the loop, and let the helper threads end. Waits at most ``timeout``."""
        if self._closed.is_set():
            return
        self._closed.set()
        with self._room:
            self._room.notify_all()  # a dispatcher waiting for room sees the end
        with self._closing:
            self._closing.notify_all()  # and the watchdog
        if self._looping:
            # A loop a handler blocks does not answer: it goes with the process.
            with contextlib.suppress(RuntimeError):
                done = asyncio.run_coroutine_threadsafe(self._cancel_all(), self._loop)
                self._wait_for(done, self._ticks.monotonic() + timeout)
                self._loop.call_soon_threadsafe(self._loop.stop)
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- the threads ----------------------------------------------------------------

    def _wait_for(self, done: concurrent.futures.Future[Any], deadline: float) -> None:
        """Wait until ``done`` is done, or ``deadline`` (on the loop's clock)."""
        answered = threading.Condition()

        def notify(_: object) -> None:
            with answered:
                answered.notify_all()

        done.add_done_callback(notify)
        with answered:
            while not done.done() and self._ticks.monotonic() < deadline:
                self._ticks.wait(answered, deadline)

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop_thread = threading.get_ident()
        beat = self._loop.create_task(self._heartbeat())
        try:
            while True:
                try:
                    self._loop.run_forever()
                    break  # stopped by close()
                except (SystemExit, KeyboardInterrupt) as exc:
                    # asyncio lets these out of run_forever from any task (one a handler
                    # started, say): the loop goes on for every other coroutine, unless
                    # close() began (run_forever forgets a stop() of the same pass).
                    if self._closed.is_set():
                        break
                    log.error("a task on the event loop raised; the loop runs on", error=repr(exc))
        finally:
            self._looping = False
            beat.cancel()
            # What is still pending ends here (a loop blocked past close() never gets here).
            with contextlib.suppress(RuntimeError):
                self._loop.run_until_complete(self._cancel_all(beat))
            for end in self.at_end:  # the transport's connections of this loop
                try:
                    end(self._loop)
                except Exception:
                    log.exception("closing the event loop's connections failed")
            self._loop.close()

    def _dispatch(self) -> None:
        """Start a coroutine for each message to run, ``concurrency`` at most at once."""
        try:
            while True:
                with self._room:
                    while self._running >= self.concurrency and not self._closed.is_set():
                        self._clock.wait(self._room, None)
                    if self._closed.is_set():
                        return
                    room = self.concurrency - self._running
                batch = self._next_messages(room)
                if not batch:
                    return
                with self._room:
                    self._running += len(batch)
                try:
                    self._loop.call_soon_threadsafe(self._begin, batch)
                except RuntimeError:  # the loop is closed: nothing will run them
                    self._give_back(batch)
                    return
        finally:
            self._dispatching = False

    def _begin(self, batch: list[Any]) -> None:
        for message in batch:
            task = self._loop.create_task(self._guarded(message))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _guarded(self, message: Any) -> None:
        try:
            await self._run_one(message)
        except asyncio.CancelledError:
            pass  # at a shutdown's timeout: the message was handed back before
        except GeneratorExit:
            raise  # closed unfinished, its loop gone (at the process's exit): no fault
        except BaseException:
            # A fault of the worker's own (run_one settled the message first): like a
            # handler thread that dies, /healthz reports it.
            self._faults += 1
            log.exception("worker fault: a coroutine handling a message failed")
        finally:
            with self._room:
                self._running -= 1
                self._room.notify()

    async def _heartbeat(self) -> None:
        while True:
            before = self._last_beat = self._ticks.monotonic()
            await asyncio.sleep(self.beat)
            late = self._ticks.monotonic() - before - self.beat
            if late >= BLOCKED:
                self._stall = late  # how long the last stall lasted, for the watchdog

    async def _cancel_all(self, *more: asyncio.Task[None]) -> None:
        tasks = [t for t in (*self._tasks, *more) if not t.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _watch(self) -> None:
        """Report each stall of the loop once, with where the loop thread is stuck, and
        again when it ends, with how long it lasted."""
        stalled = False
        while True:
            with self._closing:
                until = self._ticks.monotonic() + self.beat
                while not self._closed.is_set() and self._ticks.monotonic() < until:
                    self._ticks.wait(self._closing, until)
            if self._closed.is_set():
                return
            late = self.blocked_for()
            if late >= BLOCKED and not stalled:
                stalled = True
                self._observer.loop_blocked(late, self._where())
            elif late < BLOCKED and stalled:
                stalled = False
                self._observer.loop_unblocked(self._stall)

    def _where(self) -> str:
        """The innermost lines the loop thread is running, as a traceback shows them."""
        frame = sys._current_frames().get(self._loop_thread or -1)
        if frame is None:
            return "unknown"
        lines = traceback.format_stack(frame, limit=3)
        return " | ".join(" ".join(line.split()) for line in lines[-3:])
