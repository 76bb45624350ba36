"""The receive side: the receive threads, the room they count, and their pace.

A receive thread long-polls only while fewer than ``capacity`` messages are held, and
hands what it gets to the lease keeper (which keeps their visibility alive from that
moment) and to the inbox (where the handler threads take them). One long poll while
the queue is idle; while receives come back full, more at once (one receive thread per
ten messages of capacity), each asking for as many as the room left. A receive waits
for room for a full batch, unless handler threads would otherwise sit idle: then it
asks for what fits. After a failure, receives pause (1, 2, 4 ... 30 s); a receive under
way at the shutdown is waited out, and what it brings is handed back.

A coroutine worker's receives are coroutines on its event loop instead of threads, when
its transport receives there without a thread (``receives_on_loop``: the lean client,
no proxy): the same steps with the loop's waits (``_receive_on_loop``), awaiting
``receive_async``, so no thread waits on a socket, and none hands the GIL to another for
it. The rooms, counts and wake-ups are the same, under the same lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import uuid
from collections.abc import Callable, Coroutine
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

import structlog

from .config import MAX_WAIT_TIME
from .errors import TransportError
from .health import Progress
from .room import Pace, Room
from .transports import MAX_BATCH, UNANSWERED

if TYPE_CHECKING:
    from .clock import Clock
    from .config import WorkerConfig
    from .events import Observer
    from .inbox import Inbox
    from .lease import Held, LeaseKeeper
    from .transports import Envelope, Transport

IDLE_PAUSE = 1.0  # between empty receives when --wait-time is 0
BURST_WAIT = 1  # long-poll seconds in burst mode: an empty queue ends the run promptly
# A receive answered only with messages held already, under their receipt handles.
REPLAYED = (
    "ReceiveMessage was answered with messages held already, under the same receipt handles "
    "(SQS never answers so; a proxy replaying answers does): check that the endpoint is SQS"
)
# The longest a receive on the event loop is waited for at the shutdown, from its start:
# past the SQS client's own bounds (a connect of 5 s, then a read of the longest long poll
# and 10 s more), by which a loop that runs has ended it.
LOOP_RECEIVE_MOST = 5 + MAX_WAIT_TIME + 10 + 10
T = TypeVar("T")
log = structlog.get_logger("sqsworker")


class LoopIO(Protocol):
    """An event loop a coroutine worker's receives run on (``EventLoopRunner``)."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    def start_tasks(self, coroutines: list[Coroutine[Any, Any, None]]) -> None: ...

    async def offload(self, func: Callable[..., T], *args: Any) -> T: ...


class LoopReceives(Protocol):
    """A transport that receives on an event loop without a thread (``SQSTransport``
    with the lean client, where ``receives_on_loop()``)."""

    async def receive_async(
        self, max_messages: int, wait: int, visibility: int, attempt_id: str | None
    ) -> list[Envelope]: ...


class _LoopWaker:
    """A receive on the event loop waiting for room: ``notify`` wakes it from any thread
    (``Receiver.wake``, as a receive thread's condition is notified)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._event = asyncio.Event()

    def clear(self) -> None:
        self._event.clear()

    def notify(self) -> None:
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            self._event.set()
        else:
            self._loop.call_soon_threadsafe(self._event.set)

    async def wait(self, timeout: float) -> None:
        """Until notified, or ``timeout`` seconds (inf: until notified). A millisecond at
        least: the loop runs a timer due within its clock's resolution at once, so a wait
        for less could end before the time it waits for, again and again."""
        if timeout == math.inf:
            await self._event.wait()
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event.wait(), max(timeout, 0.001))


class Receiver:
    """The receive threads, or the receives on a coroutine worker's event loop. Their
    counts live under the inbox's lock."""

    def __init__(
        self,
        inbox: Inbox,
        room: Room,
        config: WorkerConfig,
        clock: Clock,
        observer: Observer,
        stopping: threading.Event,
        auto_prefetch: bool,
    ) -> None:
        self.inbox = inbox
        self.room = room
        self.config = config
        self.clock = clock
        self.observer = observer
        self.stopping = stopping
        # --prefetch auto: as many as the handler threads could finish during a receive's
        # round trip, so they never wait on one, plus a batch; measured as the worker runs.
        self.pace = Pace(room.slots) if auto_prefetch else None
        self.progress = [Progress(clock) for _ in range(room.pollers)]  # for /healthz
        self.alive = 0  # receive threads running
        self._transport: Transport | None = None
        self._keeper: LeaseKeeper | None = None
        self._loop: LoopIO | None = None  # the event loop the receives run on, if any
        # Under inbox.lock:
        self._polls = 0  # receives under way
        self._asked = 0  # messages they asked for: room taken until they are answered
        self._flowing = False  # the last receive came back full: more may run at once
        # By receive thread: when its receive began, and how many it asked for.
        self._polls_began: dict[int, tuple[float, int]] = {}
        self._paused_until = -math.inf  # no receive starts before (after a failure, idle)
        # Each receive thread waits for room on a condition of its own (on inbox.lock);
        # those waiting, the last to begin its wait last: wake() wakes that one.
        self._conditions = [threading.Condition(inbox.lock) for _ in range(room.pollers)]
        self._idle: list[threading.Condition | _LoopWaker] = []
        self._woken = False  # one of them was woken by wake() and is not back yet
        self._failures = 0  # receives failed in a row
        # Since when the receives have failed in a row (None while SQS answers), and why.
        self._failing_since: float | None = None
        self._last_error = ""
        # FIFO receives that failed: the next receives reuse their ids, and so get their
        # messages back instead of leaving a lost response's messages invisible.
        self._failed_attempts: list[str] = []
        self._returned_at_stop: list[Held] = []  # what polls returned once closing began

    def start(self, transport: Transport, keeper: LeaseKeeper, loop: LoopIO | None = None) -> None:
        """Start the receives: on threads of their own, or as coroutines on ``loop``."""
        self._transport, self._keeper, self._loop = transport, keeper, loop
        self.inbox.wake_receiver = self.wake
        self.alive = self.room.pollers
        if loop is not None:
            loop.start_tasks([self._receive_on_loop(i, loop) for i in range(self.room.pollers)])
            return
        for index in range(self.room.pollers):
            self.clock.spawn(f"sqsworker-receiver-{index}", partial(self._receive, index))

    def unanswered(self) -> tuple[float, str]:
        """Seconds the receives have failed in a row (0 while SQS answers), and the last
        error."""
        since = self._failing_since
        if since is None:
            return 0.0, ""
        return self.clock.monotonic() - since, self._last_error

    def capacity(self) -> int:
        """How many may be waiting or running now: the room's capacity unless --prefetch
        is auto, then as many as the pace says."""
        if self.pace is None:
            return self.room.capacity
        prefetch = min(self.room.prefetch_limit, MAX_BATCH + self.pace.ahead())
        return self.room.slots + prefetch

    def finished(self, took: float) -> None:
        """A message was on its handler thread this long. Under inbox.lock."""
        if self.pace is not None:
            self.pace.finished(took)

    def wait_time(self) -> int:
        config = self.config
        return min(config.wait_time, BURST_WAIT) if config.burst else config.wait_time

    def wait_out(self) -> list[Held]:
        """At the shutdown: wait until every receive under way has ended (SQS answers a
        receive whose connection was closed by hiding its messages all the same, so none
        can be cut short; each is one HTTP attempt, bounded by the client's timeouts).
        What they brought once closing began, to be handed back."""
        with self.inbox.lock:
            polls = list(self._polls_began.values())
        last = max((began for began, _ in polls), default=self.clock.monotonic())
        if polls:
            ends = last + self.wait_time()
            self.observer.receives_awaited(len(polls), ends - self.clock.monotonic())
        # On an event loop, a receive ends only while the loop runs: one still under way
        # past the client's own bounds is held up by a handler blocking the loop, and is
        # not waited for (what it brings stays hidden for the visibility timeout, then
        # comes back).
        give_up = last + LOOP_RECEIVE_MOST if self._loop is not None else None
        with self.inbox.lock:
            while self.alive:
                if give_up is not None and self.clock.monotonic() >= give_up:
                    log.error(
                        "receives on the event loop did not end within the SQS client's "
                        "timeouts: a handler blocks the loop",
                        receives=self.alive,
                    )
                    break
                self.clock.wait(self.inbox.slots, give_up)
            returned, self._returned_at_stop = self._returned_at_stop, []
        return returned

    # -- a receive thread ---------------------------------------------------------------

    def _receive(self, index: int) -> None:
        progress = self.progress[index]
        try:
            while True:
                asked = self._await_room(index, progress)
                if asked == 0:
                    return
                try:
                    if not self._poll(index, asked, progress):
                        return
                finally:
                    self._answered(index, full=False)  # if nothing did: room never leaks
        finally:
            self._ended()

    def _poll(self, index: int, asked: int, progress: Progress) -> bool:
        """One receive of ``asked`` messages; False when this receive thread is done."""
        assert self._transport is not None
        began, attempt_id, wait = self._begin_poll(index, progress)
        try:
            envelopes = self._transport.receive(
                asked, wait, self.config.visibility_timeout, attempt_id
            )
            if not envelopes and wait > 0:
                _check_waited(self.clock.monotonic() - began, wait)
        except Exception as exc:  # the loop outlives every error; what it got is safe
            self._failed(index, began, attempt_id, exc)
            return True
        outcome = self._received(index, asked, began, envelopes)
        if outcome is not None:
            return outcome
        if self._empty(index, wait) and self._queue_is_empty():
            return self._burst_ends()
        return True

    # -- a receive on an event loop -------------------------------------------------------

    async def _receive_on_loop(self, index: int, loop: LoopIO) -> None:
        """``_receive``, as a coroutine on the event loop of a coroutine worker: its waits
        are the loop's, and its receive is awaited there (``receive_async``), so no thread
        waits on it."""
        progress, waker = self.progress[index], _LoopWaker(loop.loop)
        try:
            while True:
                asked = await self._await_room_on_loop(index, progress, waker)
                if asked == 0:
                    return
                try:
                    if not await self._poll_on_loop(index, asked, progress, loop):
                        return
                finally:
                    self._answered(index, full=False)
        finally:
            self._ended()

    async def _poll_on_loop(self, index: int, asked: int, progress: Progress, loop: LoopIO) -> bool:
        transport = cast(LoopReceives, self._transport)
        began, attempt_id, wait = self._begin_poll(index, progress)
        try:
            envelopes = await transport.receive_async(
                asked, wait, self.config.visibility_timeout, attempt_id
            )
            if not envelopes and wait > 0:
                _check_waited(self.clock.monotonic() - began, wait)
        except Exception as exc:
            self._failed(index, began, attempt_id, exc)
            return True
        outcome = self._received(index, asked, began, envelopes)
        if outcome is not None:
            return outcome
        if self._empty(index, wait) and await loop.offload(self._queue_is_empty):
            return self._burst_ends()
        return True

    async def _await_room_on_loop(self, index: int, progress: Progress, waker: _LoopWaker) -> int:
        lock = self.inbox.lock
        with lock:
            progress.idle()
        while True:
            with lock:
                asked, until = self._room_or_wait(index)
                if until is None:
                    return asked
                waker.clear()
                self._idle.append(waker)
            try:
                await waker.wait(until - self.clock.monotonic())
            finally:
                with lock:
                    if waker in self._idle:
                        self._idle.remove(waker)
                    self._woken = False

    # -- what a receive thread and a receive on a loop share ------------------------------

    def _ended(self) -> None:
        with self.inbox.lock:
            self.alive -= 1
            self.inbox.slots.notify_all()

    def _begin_poll(self, index: int, progress: Progress) -> tuple[float, str | None, int]:
        """When the receive's room was taken, its FIFO attempt id, and its long poll."""
        assert self._transport is not None
        wait = self.wait_time()
        with self.inbox.lock:
            # The leases of what this receive returns count from when its room was taken:
            # before SQS hid them.
            began, _ = self._polls_began[index]
            attempt_id = None
            if self._transport.info.fifo:
                attempt_id = self._failed_attempts.pop() if self._failed_attempts else None
                attempt_id = attempt_id or uuid.uuid4().hex
        progress.step(wait + self.config.stall_timeout)
        return began, attempt_id, wait

    def _received(
        self, index: int, asked: int, began: float, envelopes: list[Envelope]
    ) -> bool | None:
        """What a receive returned, held and queued to run: False once shutdown began
        meanwhile (what it brought is to be handed back, and the receive thread is done),
        None when it returned nothing (``_empty``)."""
        assert self._keeper is not None
        lock = self.inbox.lock
        held = (
            self._keeper.add(envelopes, began, self.config.visibility_timeout) if envelopes else []
        )
        if len(held) < len(envelopes):  # messages held already, left out: a replayed answer
            kept = {h.handle for h in held}
            for repeat in (e for e in envelopes if e.receipt_handle not in kept):
                self.observer.receive_repeated(repeat.message_id)
            if not held:  # nothing else: as a failed receive, so the receives pause
                self._failed(index, began, None, TransportError(REPLAYED, code=UNANSWERED))
                return True
        with lock:
            self._failures = 0
            since, self._failing_since = self._failing_since, None
        if since is not None:
            self.observer.sqs_answered_again(self.clock.monotonic() - since)
        if not envelopes:
            return None
        self.observer.received([h.message for h in held])
        with lock:
            # Room taken by the ask becomes room taken by the messages, in one step: the
            # next receive thread is woken only once they are in (woken before, it would
            # count their room free, and wake to find none).
            self._answered(index, full=len(held) == asked, wake=False)
            if self.pace is not None and len(held) == asked:
                # Full: the messages were there, so this took a round trip, not a wait.
                self.pace.answered(self.clock.monotonic() - began)
            put = self.inbox.put(held)
            self.wake()
            if put:
                return True
            self._returned_at_stop += held  # shutdown began during the poll: handed back
        return False

    def _failed(self, index: int, began: float, attempt_id: str | None, exc: Exception) -> None:
        with self.inbox.lock:
            # Receives under way together when one failed share its pause; only one
            # begun after the last pause ended makes the next one longer.
            if began >= self._paused_until:
                self._failures += 1
            retry_in = min(30.0, 2.0 ** (min(self._failures, 6) - 1))
            self._paused_until = max(self._paused_until, self.clock.monotonic() + retry_in)
            if attempt_id is not None:
                self._failed_attempts.append(attempt_id)
            self._answered(index, full=False)
            if self._failing_since is None:
                self._failing_since = began
            self._last_error = text = _described(exc)
            failing_for = self.clock.monotonic() - self._failing_since
        error = exc if isinstance(exc, TransportError) else TransportError(text)
        self.observer.receive_failed(error, retry_in)
        self.observer.sqs_unanswered(failing_for, text)

    def _empty(self, index: int, wait: int) -> bool:
        """A receive came back empty. True in burst mode: the caller looks whether the
        queue is empty (``_queue_is_empty``), and if so ends the burst."""
        with self.inbox.lock:
            if wait == 0:  # no long poll to pace the receives
                self._paused_until = self.clock.monotonic() + IDLE_PAUSE
            self._answered(index, full=False)
        self.observer.receive_empty()
        return self.config.burst

    def _burst_ends(self) -> bool:
        """Burst mode found the queue empty: the worker stops. False (the receive is done)."""
        with self.inbox.lock:
            first = not self.stopping.is_set()
            self.stopping.set()
            self._wake_all()
        if first:
            self.observer.burst_finished()
        return False

    def _answered(self, index: int, full: bool, wake: bool = True) -> None:
        """A receive ended: its room is free again; more run at once only while full.
        Once per receive: later calls do nothing. ``wake``: wake a receive thread if one
        would act now (else the caller does, under the same hold of the lock)."""
        with self.inbox.lock:
            poll = self._polls_began.pop(index, None)
            if poll is None:
                return
            self._polls -= 1
            self._asked -= poll[1]
            self._flowing = full
            if wake:
                self.wake()

    def _await_room(self, index: int, progress: Progress) -> int:
        """Wait until a receive is worth making; how many to ask for (0 when stopping).

        One receive at a time while the queue is idle; while receives come back full,
        up to one per receive thread. Each asks for the room left under the held bound,
        once that room is a full batch, or sooner when handler threads would otherwise
        wait with nothing to run.

        The bound counts every message held: waiting and running up to the capacity,
        and beyond a batch per sender, those through their handler with their delete or
        return not yet answered.
        """
        with self.inbox.lock:
            progress.idle()  # waiting on the handlers is not being stuck
            while True:
                asked, until = self._room_or_wait(index)
                if until is None:
                    return asked
                self._wait(index, None if until == math.inf else until)

    def _room_or_wait(self, index: int) -> tuple[int, float | None]:
        """How many the receive asks for now, with None; or 0 and until when it waits for
        room (inf: until woken). 0 and None when stopping. Under inbox.lock."""
        assert self._keeper is not None
        if self.stopping.is_set():
            return 0, None
        if self.clock.monotonic() < self._paused_until:
            return 0, self._paused_until
        asked, flush = self._look()
        if asked:
            self._polls += 1
            self._asked += asked
            self._polls_began[index] = (self.clock.monotonic(), asked)
            self.wake()  # the next thread, if another receive is worth making
            return asked, None
        if flush:
            # Only unanswered deletes and returns stand in the way: send them now
            # rather than after --delete-interval, so the handlers are not starved.
            self._keeper.flush()
        return 0, math.inf

    def _wait(self, index: int, deadline: float | None) -> None:
        """Wait for room (or until ``deadline``), among the idle for ``wake``. Under
        inbox.lock."""
        condition = self._conditions[index]
        self._idle.append(condition)
        try:
            self.clock.wait(condition, deadline)
        finally:
            if condition in self._idle:  # not taken by wake(): its deadline, or all woken
                self._idle.remove(condition)
            self._woken = False  # back, whatever woke it: it looks before it waits again

    def _look(self) -> tuple[int, bool]:
        """How many a receive would ask for now (0: none is worth making), and whether
        only unanswered deletes and returns stand in the way. Under inbox.lock."""
        assert self._keeper is not None
        room, inbox = self.room, self.inbox
        active = inbox.active(room.max_deferred)
        unanswered = max(0, self._keeper.settling_count() - room.unanswered)
        free = self.capacity() - active - unanswered - self._asked
        # Handler threads with nothing to run and no receive under way to bring any:
        # a receive for less than a batch is better than a barrier.
        starved = self._polls == 0 and active < room.slots
        worth = free >= room.batch or (free > 0 and starved)
        if worth and (self._polls == 0 or self._flowing):
            return min(free, MAX_BATCH), False
        return 0, not worth and self.capacity() - active - self._asked >= room.batch

    def wake(self) -> None:
        """Room or state changed: wake one receive thread waiting for room if one would act
        now (receive, or send the deletes standing in the way), unless one woken before
        has not looked yet: it will, and each that starts a receive wakes the next the
        same way, so as many wake as will act. All once stopping. With 256 coroutines (32
        receive threads), waking them all for every message finished took the event
        loop's thread a seventh of its time; waking one for each, while the one woken
        before waited for the GIL, three quarters (each wake-up handed the CPU to the
        thread woken).

        The one woken is the one that began to wait last: while one receive at a time
        keeps the handlers fed (SQS answers at once), one thread makes them all and the
        others stay asleep. Woken oldest first, every receive went to another thread,
        each waking on a CPU the last had left (3 receive threads for 10 handler threads,
        1.5 context switches a message). Under inbox.lock."""
        if self.stopping.is_set():
            self._wake_all()
        elif self._woken or not self._idle:
            return
        elif self.clock.monotonic() >= self._paused_until:  # a paused one wakes by the clock
            asked, flush = self._look()
            if asked or flush:
                self._woken = True
                self._idle.pop().notify()

    def _wake_all(self) -> None:
        """Every receive thread waiting (stopping), and the shutdown's waits. Under
        inbox.lock."""
        self.inbox.slots.notify_all()
        for condition in self._idle:
            condition.notify()

    def _queue_is_empty(self) -> bool:
        assert self._transport is not None and self._keeper is not None
        with self.inbox.lock:
            if self.inbox.unfinished:
                return False
        if self._keeper.held_count():
            return False
        try:
            return self._transport.counts().total == 0
        except TransportError as exc:
            self.observer.request_failed("GetQueueAttributes", exc)
            return False


def _described(exc: Exception) -> str:
    """A receive's error as its log line and /healthz say it: SQS's words, or for a fault
    of another kind (a defect, which may have no words) its type too."""
    if isinstance(exc, TransportError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _check_waited(waited: float, wait: int) -> None:
    """SQS answers a long poll with nothing only once it has waited it out. An empty
    answer well before that is none of SQS's (a proxy's page, which botocore reads as an
    empty answer, or a stub's ``{}``): it fails as a receive does (the receives pause,
    longer each time, and a FIFO receive's attempt id is used again). Taken as empty, it
    had the receive threads ask again at once, as fast as the endpoint answered."""
    if waited < wait / 2:
        raise TransportError(
            f"ReceiveMessage came back empty after {waited:.2f} s of a {wait} s long poll, "
            "which SQS never does: check that the endpoint is SQS",
            code=UNANSWERED,
            retryable=True,
        )
