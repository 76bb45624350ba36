"""The worker: receive threads, a pool of handler threads, and the lease thread.

Flow of one message: a receive thread long-polls (only while fewer than
``concurrency + prefetch`` messages are held), hands the message to the lease
thread, which keeps its visibility alive from that moment, and queues it for a
handler thread. The handler's outcome goes back to the lease thread: delete on
success, a delayed return on failure. The worker owns no signals; ``cli.py``
does, so a ``Worker`` can run embedded in another program.

Receives: one long poll while the queue is idle; while receives come back full,
more at once (one receive thread per ten messages of capacity), each asking for
as many as the room left. A receive waits for room for a full batch, unless
handler threads would otherwise sit idle: then it asks for what fits.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import inspect
import math
import threading
import uuid
from functools import partial
from typing import TYPE_CHECKING, Any

import structlog

from . import batches, coroutines, tracing
from .clock import Clock, SystemClock
from .config import WorkerConfig
from .coroutines import EventLoopRunner
from .deadletter import REFUSED_CONTENT, RecentIds, dead_letter_copy
from .errors import (
    ConfigError,
    KeyConflict,
    PayloadUnavailable,
    Reject,
    Retry,
    StartupError,
    StoreError,
    TransportError,
)
from .events import Observer, Observers
from .handler import Handler, as_handler
from .health import Health, Progress
from .idempotency import Idempotency, Verdict
from .lanes import HANDED_BACK_BEHIND, Lanes, Line
from .lease import MAX_SENDERS, Held, LeaseKeeper
from .payloads import Payloads, RemoveAfterDelete, is_offloaded
from .policies import Backoff
from .transports import MAX_BATCH, Transport, send_all

if TYPE_CHECKING:
    from .message import Message
    from .stores import Store

IDLE_PAUSE = 1.0  # between empty receives when --wait-time is 0
BURST_WAIT = 1  # long-poll seconds in burst mode: an empty queue ends the run promptly
MAX_POLLS = 32  # receives under way at once, at most
DEFAULT_BATCH_SIZE = 10  # a batch handler's, when nothing sets --batch-size
MAX_BATCH_SLOTS = 10_000  # concurrency x batch size, at most
MAX_DEFERRED = 1_000  # duplicates held for a busy key without taking room, at least


class _Step(enum.Enum):
    """What ``_prepare`` decided: run the handler, keep the message to look at again, or
    nothing more (it was settled)."""

    RUN = "run"
    KEEP = "keep"
    DONE = "done"


class Worker:
    def __init__(
        self,
        handler: Handler | object,
        config: WorkerConfig | None = None,
        *,
        transport: Transport | None = None,
        clock: Clock | None = None,
        observer: Observer | None = None,
        backoff: Backoff | None = None,
        idempotency_store: Store | None = None,
        payloads: Payloads | None = None,
        tracer: Any = None,
    ) -> None:
        self.handler = as_handler(handler)
        self.config = config or WorkerConfig(**self.handler.options)
        self.clock: Clock = clock or SystemClock()
        # OpenTelemetry (sqsworker[otel], set up from OTEL_*): None when off.
        self.tracer = tracer if tracer is not None else tracing.tracer()
        # Offloaded bodies: fetched from S3 on the handler thread before the handler runs.
        self.payloads = payloads or Payloads(
            bucket=self.config.payload_bucket, region=self.config.region
        )
        # With --delete-payloads, removed once SQS deleted a message handled or dropped.
        self._remover = RemoveAfterDelete(self.payloads) if self.config.delete_payloads else None
        observers = [o for o in (observer, self._remover) if o is not None]
        # Fanned out through Observers, so an observer that raises never breaks a thread.
        self.observer: Observer = Observers(observers)
        self.backoff = backoff or Backoff(self.config.backoff_base, self.config.backoff_max)
        self._transport = transport
        self._store = idempotency_store  # else opened from config.idempotency_store at start
        self.idempotency: Idempotency | None = None
        self._dead_letter_queue: Transport | None = None
        # Messages no copy of which the dead-letter queue takes: returned unrun until SQS's
        # redrive moves them (ids only, the latest few thousand).
        self._refused_copies = RecentIds(4096)
        # A batch handler's thread runs a batch at a time: up to this many messages.
        self.batch_size, self.batch_window = self._batching()
        # Messages that may run at once: one per handler thread, or a batch each.
        self.slots = self.config.concurrency * self.batch_size
        prefetch = self.config.prefetch
        # --prefetch auto: as many as the handler threads could finish during a receive's
        # round trip, so they never wait on one, plus a batch; measured as the worker runs.
        self.pace = None if prefetch is not None else Pace(self.slots)
        self.prefetch_limit = prefetch if prefetch is not None else max(MAX_BATCH, 2 * self.slots)
        self.capacity = self.slots + self.prefetch_limit  # waiting or running
        self.batch = min(MAX_BATCH, self.capacity)  # a receive waits for room for this many
        # One receive thread per batch of capacity: all of it can be asked for at once.
        self.pollers = max(1, min(MAX_POLLS, math.ceil(self.capacity / MAX_BATCH)))
        # Calls to delete, return or renew under way at once: one per batch of capacity.
        self.senders = max(2, min(MAX_SENDERS, math.ceil(self.capacity / MAX_BATCH)))
        # Through their handler, their delete or return not answered yet: this many are
        # held beyond the capacity (a batch per sender), and no more. Deletes failing for a
        # while must not let held messages pile up.
        self.unanswered = MAX_BATCH * self.senders
        # Duplicates held while their key is busy elsewhere take no room from runnable
        # messages, up to this many (past it, each takes room as a waiting message does).
        # Held, not returned: a return would use up one of its receives, and a healthy
        # duplicate must never reach the dead-letter queue.
        self.max_deferred = max(MAX_DEFERRED, 10 * self.slots)
        self.held_bound = self.capacity + self.max_deferred + self.unanswered

        self._stopping = threading.Event()  # set once: no more receives
        # One lock guards _pending, _deferred, _unfinished, _closing, the receives' state
        # (_polls, _asked, _flowing, _polls_began, _pollers_alive) and _handlers_alive.
        # Receive threads and the shutdown wait on _slots (room, state); handler threads
        # on _runnable (a message to run), so a message finishing wakes no idle handler.
        lock = threading.RLock()
        self._slots = threading.Condition(lock)
        self._runnable = threading.Condition(lock)
        # Batch handlers: one thread at a time fills its batch (and waits on _runnable),
        # so batches fill rather than split between threads; the others wait their turn.
        self._filling = False
        self._fill_turn = threading.Condition(lock)
        # Received, waiting for a handler thread: one line, or one lane per FIFO group.
        self._pending: Line | Lanes = Line()
        self._unfinished = 0  # received and not yet through a handler (or handed back)
        # Duplicates whose key is busy elsewhere: held (leases kept), looked at again then.
        self._deferred: list[tuple[float, Held]] = []
        self._closing = False  # handler threads exit when _pending is empty
        self._polls = 0  # receives under way
        self._asked = 0  # messages they asked for: room taken until they are answered
        self._flowing = False  # the last receive came back full: more may run at once
        # By receive thread: when its receive began, and how many it asked for.
        self._polls_began: dict[int, tuple[float, int]] = {}
        self._paused_until = -math.inf  # no receive starts before (after a failure, idle)
        self._failures = 0  # receives failed in a row
        # Since when the receives have failed in a row (None while SQS answers), and why.
        self._failing_since: float | None = None
        self._last_error = ""
        # FIFO receives that failed: the next receives reuse their ids, and so get their
        # messages back instead of leaving a lost response's messages invisible.
        self._failed_attempts: list[str] = []
        self._pollers_alive = 0
        self._returned_at_stop: list[Held] = []  # what polls returned once stopping began
        self._handlers_alive = 0
        self._receiving = [Progress(self.clock) for _ in range(self.pollers)]  # for /healthz
        self._started = False
        self.keeper: LeaseKeeper | None = None
        # An async def handler's coroutines, on an event loop thread; None for a def.
        self._loop_runner: EventLoopRunner | None = None

    @property
    def transport(self) -> Transport:
        if self._transport is None:
            raise RuntimeError("the worker is not started")
        return self._transport

    @property
    def in_hand(self) -> int:
        """Messages received and not yet through a handler: running plus waiting to start."""
        with self._slots:
            return self._unfinished

    @property
    def started(self) -> bool:
        return self._started

    def sqs_unanswered(self) -> tuple[float, str]:
        """Seconds the receives have failed in a row (0 while SQS answers), and the last
        error."""
        since = self._failing_since
        if since is None:
            return 0.0, ""
        return self.clock.monotonic() - since, self._last_error

    def health(self) -> Health:
        unanswered, error = self.sqs_unanswered()
        return Health(
            sqs_unanswered=unanswered,
            sqs_error=error,
            started=self._started,
            stopping=self._stopping.is_set(),
            receiver_overdue=max(p.overdue() for p in self._receiving),
            lease_overdue=self.keeper.overdue() if self.keeper else 0.0,
            receiver_alive=self._pollers_alive == self.pollers,
            lease_alive=self.keeper is not None and self.keeper.alive(),
            handlers_alive=self._coroutines_alive() if self._loop_runner else self._handlers_alive,
            handlers=self.config.concurrency,
            loop_blocked=(
                self._loop_runner.blocked_for(self.config.stall_timeout)
                if self._loop_runner
                else None
            ),
            loop_allowance=self.config.stall_timeout,
            claims_alive=(
                self.idempotency.keeper.alive()
                if self.idempotency and self.idempotency.keeper
                else None
            ),
        )

    def _coroutines_alive(self) -> int:
        assert self._loop_runner is not None
        return self.config.concurrency if self._loop_runner.alive() else 0

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        """Connect, check the queue, and start the threads. Raises ``StartupError``."""
        if self._transport is None:
            from .transports.sqs import SQSTransport

            self._transport = SQSTransport.connect(
                self.config.queue,
                endpoint_url=self.config.endpoint_url,
                region=self.config.region,
                max_connections=self._threads + self.pollers + self.senders + 2,
            )
        if self.transport.info.fifo:
            self._pending = Lanes()
        self.idempotency = self._open_idempotency()
        claims = None
        if self.idempotency:
            # The store is slower than SQS and may be locked: claims are renewed on a
            # thread of their own, woken by the lease thread's renewals.
            claims = self.idempotency.start(self.observer.store_failed, self.observer.claim_lost)
        self.keeper = LeaseKeeper(
            self.transport,
            self.clock,
            self.observer,
            delete_interval=self.config.delete_interval,
            stall_timeout=self.config.stall_timeout,
            on_renewed=claims.wake if claims else None,
            on_released=self._room_changed,
            senders=self.senders,
        )
        self.keeper.start()
        if self.handler.is_async:
            self._loop_runner = self._event_loop()
            self._loop_runner.start()
        else:
            self._handlers_alive = self.config.concurrency
            work = self._work_batches if self.handler.is_batch else self._work
            for index in range(self.config.concurrency):
                self.clock.spawn(f"sqsworker-handler-{index}", work)
        self.observer.worker_started(self.transport.info, self.config)
        self._pollers_alive = self.pollers
        for index in range(self.pollers):
            self.clock.spawn(f"sqsworker-receiver-{index}", partial(self._receive, index))
        self._started = True

    def _batching(self) -> tuple[int, float]:
        """The batch size and window: (1, 0) for a handler of one message."""
        config = self.config
        if not self.handler.is_batch:
            given = [o for o in ("batch_size", "batch_window") if getattr(config, o) is not None]
            if given:
                raise ConfigError(
                    f"{given[0].replace('_', '-')} applies to batch handlers only, and "
                    f"{self.handler.name} handles one message at a time: decorate it with "
                    "@sqsworker.batch_handler(...), leave the option out, or set it for the "
                    f"batch handler alone (--set NAME.{given[0]}=N, or "
                    f"SQSWORKER_NAME__{given[0].upper()})",
                    field=given[0],
                )
            return 1, 0.0
        if self.handler.is_lambda and config.concurrency != 1:
            raise ConfigError(
                f"concurrency is {config.concurrency}, and a Lambda handler runs one batch at "
                "a time, as in one Lambda execution environment (its module-level state is "
                "not made for two at once): leave --concurrency at 1 and run more replicas",
                field="concurrency",
            )
        size = config.batch_size if config.batch_size is not None else DEFAULT_BATCH_SIZE
        if config.concurrency * size > MAX_BATCH_SLOTS:
            raise ConfigError(
                f"concurrency x batch-size is {config.concurrency * size}, and a worker holds "
                f"at most {MAX_BATCH_SLOTS} messages running at once: lower one of them",
                field="batch_size",
            )
        return size, config.batch_window or 0.0

    def _event_loop(self) -> EventLoopRunner:
        return EventLoopRunner(
            self.config.concurrency,
            self.clock,
            self._next_batch,
            self._work_async,
            self.observer,
            give_back=self._give_back,
        )

    def _give_back(self, taken: list[Held]) -> None:
        """Messages taken to run that nothing will run (the event loop is gone)."""
        for held in taken:
            self._fault_returns(held)
            self._finish(held, 0.0)

    def _fault_returns(self, held: Held) -> None:
        """A fault of the worker's own: the message goes back at once rather than be
        held unrun (its thread ends, or its coroutine, and /healthz reports it)."""
        assert self.keeper is not None
        self.keeper.release(held, 0, "worker error", urgent=True)
        self._release_claim(held.message)  # or the claim keeper renews it for ever

    @property
    def _threads(self) -> int:
        """Threads that call SQS, S3 or the store on a message's behalf besides the
        receive and lease threads: the handler threads, or a coroutine handler's helpers."""
        if self.handler.is_async:  # and each coroutine in asyncio.to_thread(...), at most
            return self.config.concurrency + min(self.config.concurrency, coroutines.MAX_HELPERS)
        return self.config.concurrency

    def _open_idempotency(self) -> Idempotency | None:
        namespace = self.transport.info.name
        if self._store is not None:
            return Idempotency(
                self._store,
                self.config.idempotency_key,
                ttl=self.config.idempotency_ttl,
                clock=self.clock,
                namespace=namespace,
            )
        if self.config.idempotency_store is None:
            return None
        try:
            return Idempotency.open(self.config, self.clock, namespace, threads=self._threads)
        except StartupError:
            self.transport.close()
            raise

    def request_stop(self) -> None:
        """Ask the worker to stop receiving; ``shutdown`` does the rest. Safe from any thread."""
        self._stopping.set()
        with self._slots:
            self._slots.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until a stop was requested or burst mode found the queue empty."""
        return self._stopping.wait(timeout)

    def run(self) -> int:
        """Start, run until ``request_stop`` (or an empty queue in burst mode), shut down."""
        self.start()
        self.wait()
        return self.shutdown()

    def shutdown(self) -> int:
        """Stop without losing or stranding a message. Returns 0 if every handler finished."""
        assert self.keeper is not None
        deadline = self.clock.monotonic() + self.config.shutdown_timeout

        # 1. Stop receiving. A long poll already under way ends by itself (within
        #    --wait-time): what it returns is handed back with the rest (3).
        self._stopping.set()
        with self._slots:
            waiting = self._pending.drain() + [held for _, held in self._deferred]
            self._deferred.clear()
            self._unfinished -= len(waiting)
            self._closing = True
            self._slots.notify_all()
            self._runnable.notify_all()
        running = self._unfinished
        self.observer.shutdown_started(len(waiting), running)

        # 2. Wait out the long polls still under way, so none of their messages is
        #    stranded: SQS answers a receive whose connection was closed by hiding its
        #    messages all the same, so a receive cannot be cut short. Each is one HTTP
        #    attempt, bounded by the client's timeouts, so this ends. Handlers run on.
        with self._slots:
            polls = list(self._polls_began.values())
        if polls:
            ends = max(began for began, _ in polls) + self._wait_time()
            self.observer.receives_awaited(len(polls), ends - self.clock.monotonic())
        with self._slots:
            while self._pollers_alive:
                self.clock.wait(self._slots, None)
            returned, self._returned_at_stop = self._returned_at_stop, []

        # 3. Hand back the received-but-unstarted messages, and what those polls
        #    returned: visible to others at once. Only now: a poll of ours still under
        #    way would receive them again, each time using up one of their receives
        #    (maxReceiveCount), and could move them to the dead-letter queue unrun.
        self.keeper.hand_back(waiting + returned)

        # 4. Let running handlers finish; the lease thread keeps their leases alive.
        with self._slots:
            while self._unfinished > 0 and self.clock.monotonic() < deadline:
                self.clock.wait(self._slots, deadline)
            clean = self._unfinished == 0

        # 5. Past the timeout, hand the still-running messages back for another worker,
        #    and those taken to run that never began (a coroutine that had not started, a
        #    batch still being made ready): begun late, they are skipped. Coroutine
        #    handlers still running are cancelled then (thread handlers cannot be).
        overdue = [] if clean else self.keeper.unsettled()
        self.keeper.hand_back(overdue)
        if self._loop_runner:
            self._loop_runner.close()

        # 6. Flush queued deletes and returns, then stop the lease thread.
        unsettled = self.keeper.stop(give_up_after=max(5.0, deadline - self.clock.monotonic()))
        self.transport.close()
        if self.idempotency:  # a store call still under way at the deadline is left to end
            self.idempotency.close(deadline=max(deadline, self.clock.monotonic() + 5.0))
        # The removals of offloaded bodies asked for (one request each), until the deadline,
        # and those the final deletes just asked for at least as long as a flush may take.
        grace = min(5.0, self.config.shutdown_timeout)
        self.payloads.close(timeout=max(grace, deadline - self.clock.monotonic()))
        self.observer.shutdown_finished(clean, self.keeper.handed_back_count, unsettled)
        return 0 if clean else 1

    # -- the receive thread --------------------------------------------------------------

    def _wait_time(self) -> int:
        return (
            min(self.config.wait_time, BURST_WAIT) if self.config.burst else self.config.wait_time
        )

    def _receive(self, index: int) -> None:
        """A receive thread."""
        progress = self._receiving[index]
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
            with self._slots:
                self._pollers_alive -= 1
                self._slots.notify_all()

    def _poll(self, index: int, asked: int, progress: Progress) -> bool:
        """One receive of ``asked`` messages; False when this receive thread is done."""
        assert self.keeper is not None
        wait = self._wait_time()
        with self._slots:
            # The leases of what this receive returns count from when its room was taken:
            # before SQS hid them.
            began, _ = self._polls_began[index]
            attempt_id = None
            if self.transport.info.fifo:
                attempt_id = self._failed_attempts.pop() if self._failed_attempts else None
                attempt_id = attempt_id or uuid.uuid4().hex
        progress.step(wait + self.config.stall_timeout)
        try:
            envelopes = self.transport.receive(
                asked, wait, self.config.visibility_timeout, attempt_id
            )
        except Exception as exc:  # the loop outlives every error; what it got is safe
            with self._slots:
                # Receives under way together when one failed share its pause; only one
                # begun after the last pause ended makes the next one longer.
                if began >= self._paused_until:
                    self._failures += 1
                retry_in = min(30.0, 2.0 ** (min(self._failures, 6) - 1))
                self._paused_until = max(self._paused_until, self.clock.monotonic() + retry_in)
                if attempt_id is not None:
                    self._failed_attempts.append(attempt_id)
                self._answered(index, full=False)
                now = self.clock.monotonic()
                if self._failing_since is None:
                    self._failing_since = began
                self._last_error = str(exc)
                failing_for = now - self._failing_since
            self.observer.receive_failed(_as_transport_error(exc), retry_in)
            self.observer.sqs_unanswered(failing_for, str(exc))
            return True
        with self._slots:
            self._failures = 0
            since, self._failing_since = self._failing_since, None
        if since is not None:
            self.observer.sqs_answered_again(self.clock.monotonic() - since)
        if not envelopes:
            with self._slots:
                if wait == 0:  # no long poll to pace the receives
                    self._paused_until = self.clock.monotonic() + IDLE_PAUSE
                self._answered(index, full=False)
            self.observer.receive_empty()
            if self.config.burst and self._queue_is_empty():
                with self._slots:
                    first = not self._stopping.is_set()
                    self.request_stop()
                if first:
                    self.observer.burst_finished()
                return False
            return True
        held = self.keeper.add(envelopes, began, self.config.visibility_timeout)
        self.observer.received([h.message for h in held])
        with self._slots:
            # Room taken by the ask becomes room taken by the messages, in one step.
            self._answered(index, full=len(held) == asked)
            if self.pace is not None and len(held) == asked:
                # Full: the messages were there, so this took a round trip, not a wait.
                self.pace.answered(self.clock.monotonic() - began)
            if not self._closing:
                self._pending.add(held)
                self._unfinished += len(held)
                self._runnable.notify(len(held))
                return True
            self._returned_at_stop += held  # shutdown began during the poll: handed back
        return False

    def _answered(self, index: int, full: bool) -> None:
        """A receive ended: its room is free again; more run at once only while full.
        Once per receive: later calls do nothing."""
        with self._slots:
            poll = self._polls_began.pop(index, None)
            if poll is None:
                return
            self._polls -= 1
            self._asked -= poll[1]
            self._flowing = full
            self._slots.notify_all()

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
        assert self.keeper is not None
        with self._slots:
            progress.idle()  # waiting on the handlers is not being stuck
            while not self._stopping.is_set():
                if self.clock.monotonic() < self._paused_until:
                    self.clock.wait(self._slots, self._paused_until)
                    continue
                free = self._room() - self._asked
                # Handler threads with nothing to run and no receive under way to bring any:
                # a receive for less than a batch is better than a barrier.
                starved = self._polls == 0 and self._active() < self.slots
                worth = free >= self.batch or (free > 0 and starved)
                if worth and (self._polls == 0 or self._flowing):
                    asked = min(free, MAX_BATCH)
                    self._polls += 1
                    self._asked += asked
                    self._polls_began[index] = (self.clock.monotonic(), asked)
                    return asked
                if not worth and self._capacity() - self._active() - self._asked >= self.batch:
                    # Only unanswered deletes and returns stand in the way: send them now
                    # rather than after --delete-interval, so the handlers are not starved.
                    self.keeper.flush()
                self.clock.wait(self._slots, None)
            return 0

    def _room(self) -> int:
        assert self.keeper is not None
        unanswered = max(0, self.keeper.settling_count() - self.unanswered)
        return self._capacity() - self._active() - unanswered

    def _active(self) -> int:
        """Messages that take room: those not yet through a handler, less the duplicates
        held for a busy key (up to ``max_deferred``). Under ``_slots``."""
        return self._unfinished - min(len(self._deferred), self.max_deferred)

    def _capacity(self) -> int:
        """How many may be waiting or running now: ``capacity`` unless --prefetch is auto."""
        if self.pace is None:
            return self.capacity
        prefetch = min(self.prefetch_limit, MAX_BATCH + self.pace.ahead())
        return self.slots + prefetch

    def _room_changed(self) -> None:
        """Called by the lease thread when deletes or returns were answered."""
        with self._slots:
            self._slots.notify_all()

    def _queue_is_empty(self) -> bool:
        assert self.keeper is not None
        with self._slots:
            if self._unfinished:
                return False
        if self.keeper.held_count():
            return False
        try:
            return self.transport.counts().total == 0
        except TransportError as exc:
            self.observer.request_failed("GetQueueAttributes", exc)
            return False

    # -- the handler threads -------------------------------------------------------------

    def _work(self) -> None:
        try:
            while (held := self._next()) is not None:
                kept = False
                began = self.clock.monotonic()
                deferrals = held.deferrals
                try:
                    kept = self._process(held)
                except Exception as exc:  # a step of ours failed: the message's failure
                    kept = not self._contain(held, began, exc, deferrals)
                except BaseException:
                    kept = not self._reclaim(held, deferrals)
                    if not kept:
                        self._fault_returns(held)
                    raise
                finally:
                    if not kept:
                        self._finish(held, self.clock.monotonic() - began)
        finally:
            with self._slots:
                self._handlers_alive -= 1  # read by /healthz: a thread lost is not live

    # -- batch handlers: each handler thread runs one batch at a time ------------------

    def _work_batches(self) -> None:
        try:
            while batch := self._collect():
                finished: list[Held] = []
                kept: list[Held] = []  # deferred to look at again: no longer this batch's
                began = self.clock.monotonic()
                try:
                    finished = self._run_batch(batch, kept)
                except BaseException as exc:
                    # A fault of the worker's own: settle what the batch still holds. One
                    # it deferred is still its own while among the deferred; one another
                    # thread took from there since is that thread's.
                    with self._slots:
                        deferred = {id(h) for _, h in self._deferred}
                        gone = [h for h in kept if id(h) not in deferred]
                        self._deferred = [(d, h) for d, h in self._deferred if h not in batch]
                    finished = [held for held in batch if held not in gone]
                    for held in finished:
                        if not isinstance(exc, Exception):
                            self._fault_returns(held)
                        elif held.outcome is None:  # each one's failure; the thread goes on
                            self._contain(held, began, exc)
                    if not isinstance(exc, Exception):
                        raise
                finally:
                    took = self.clock.monotonic() - began
                    for held in finished:
                        self._finish(held, took)
        finally:
            with self._slots:
                self._handlers_alive -= 1

    def _collect(self) -> list[Held]:
        """The next batch: up to ``batch_size`` messages, waiting for the first, then at
        most ``batch_window`` seconds for the rest; [] once closing with none left.

        A FIFO group's messages come in order, one run of them per batch. Once taken, the
        messages count as running: at shutdown a batch being filled runs at once.
        """
        with self._slots:
            while self._filling:
                self.clock.wait(self._fill_turn, None)
            self._filling = True
            try:
                return self._fill()
            finally:
                self._filling = False
                self._fill_turn.notify()

    def _fill(self) -> list[Held]:
        """``_collect``'s batch, by the one thread filling one. Under ``_slots``."""
        batch: list[Held] = []
        deadline = math.inf
        while len(batch) < self.batch_size:
            more = self._take_run_now(self.batch_size - len(batch))
            if more:
                if not batch:
                    deadline = self.clock.monotonic() + self.batch_window
                batch += more
                continue
            if self._closing or self.clock.monotonic() >= deadline:
                break
            until = min([deadline, *(d for d, _ in self._deferred)])
            self.clock.wait(self._runnable, None if until == math.inf else until)
        return batch

    def _take_run_now(self, limit: int) -> list[Held]:
        """A deferred message that is due, else up to ``limit`` waiting ones (FIFO: a run
        of one group with none running). Under ``_slots``."""
        now = self.clock.monotonic()
        for index, (due, deferred) in enumerate(self._deferred):
            if due <= now:
                del self._deferred[index]
                return [deferred]
        return self._pending.take_run(limit)

    def _run_batch(self, batch: list[Held], kept: list[Held]) -> list[Held]:
        """Run the batch handler on ``batch`` and settle each message; what is finished
        (all but those deferred to look at again, put in ``kept``: their key is busy
        elsewhere)."""
        assert self.keeper is not None
        fifo = isinstance(self._pending, Lanes)
        started = self.clock.monotonic()
        messages = [held.message for held in batch]
        with tracing.consuming_batch(self.tracer, messages):
            ready: list[Held] = []
            behind: list[Held] = []
            # FIFO: a group stops at a message that did not go; those after it in the
            # batch must not run before it, and go back behind it.
            stopped: set[str | None] = set()
            for held in batch:
                group = held.message.group_id
                if fifo and group in stopped:
                    behind.append(held)
                    continue
                if not self.keeper.begin(held):
                    self.observer.handler_skipped(
                        held.message, "its lease was lost while it waited to start"
                    )
                else:
                    step = self._prepare(held, started, keep=not fifo)
                    if step is _Step.RUN:
                        ready.append(held)
                        continue
                    if step is _Step.KEEP:
                        kept.append(held)
                if fifo and not held.gone:
                    stopped.add(group)
            ready = self._still_ready(ready, fifo, behind)
            if ready:
                for held in ready:
                    self.observer.handler_started(held.message)
                self._call_batch(ready, started, fifo, behind)
            for held in behind:
                self.keeper.release(held, 0, HANDED_BACK_BEHIND, urgent=True)
        return [held for held in batch if held not in kept]

    def _still_ready(self, ready: list[Held], fifo: bool, behind: list[Held]) -> list[Held]:
        """Those of ``ready`` (in batch order) whose lease is still alive now that the whole
        batch was made ready (the store or S3 may have taken long): the others are not
        run, and on a FIFO queue neither are their group's later ones in the batch."""
        assert self.keeper is not None
        still = []
        cut: set[str | None] = set()
        for held in ready:
            group = held.message.group_id
            if group in cut:
                self._release_claim(held.message)
                behind.append(held)
            elif self.keeper.still_running(held):
                still.append(held)
            else:
                self._release_claim(held.message)
                self.observer.handler_skipped(
                    held.message, "its lease ran out while its batch was made ready"
                )
                if fifo:
                    cut.add(group)
        return still

    def _call_batch(
        self, ready: list[Held], started: float, fifo: bool, behind: list[Held]
    ) -> None:
        """Call the handler with ``ready`` and settle each by its outcome. On a FIFO queue,
        a group's messages after one that failed go ``behind``, with their key's claim
        completed if the handler did them, else released."""
        messages = [held.message for held in ready]
        returned: object = None
        raised: BaseException | None = None
        tokens = structlog.contextvars.bind_contextvars(
            queue=self.transport.info.name, batch_size=len(messages), handler=self.handler.name
        )
        try:
            if self.handler.is_lambda:  # Lambda's event names the queue by its ARN
                returned = self.handler.func(messages, self.transport.info.arn)  # type: ignore[call-arg,arg-type]
            else:
                returned = self.handler(messages)  # type: ignore[arg-type]
        except BaseException as exc:  # SystemExit and the like too: the thread lives on
            raised = exc
        finally:
            structlog.contextvars.reset_contextvars(**tokens)
        outcomes = batches.outcomes(messages, returned, raised)
        cut: set[str | None] = set()  # FIFO groups a message of which failed here
        try:
            for held, error in zip(ready, outcomes, strict=True):
                group = held.message.group_id
                if group in cut:
                    if error is None:
                        self._complete_claim(held.message)  # done: its return is dropped
                    else:
                        self._release_claim(held.message)
                    behind.append(held)
                    continue
                self._settle(held, started, error)
                if fifo and not held.gone:
                    cut.add(group)
        finally:
            del raised, outcomes  # no cycle through the traceback

    def _next(self) -> Held | None:
        """The next message to run, waiting for one; None once closing with none left."""
        with self._slots:
            while True:
                waiting = self._take_now()
                if waiting is not None or self._closing:
                    return waiting
                self.clock.wait(self._runnable, min((d for d, _ in self._deferred), default=None))

    def _next_batch(self, limit: int) -> list[Held]:
        """Up to ``limit`` messages to run, waiting for the first; [] once closing."""
        with self._slots:
            first = self._next()
            if first is None:
                return []
            batch = [first]
            while len(batch) < limit and (more := self._take_now()) is not None:
                batch.append(more)
            return batch

    def _take_now(self) -> Held | None:
        """``_take_run_now`` of one message, or None. Under ``_slots``."""
        run = self._take_run_now(1)
        return run[0] if run else None

    def _finish(self, held: Held, took: float) -> None:
        assert self.keeper is not None
        with self._slots:
            # A FIFO group's later messages must not overtake one that comes back. Their
            # returns are queued before they stop counting, so a shutdown cannot stop the
            # lease thread in between and leave them invisible.
            later = self._pending.finish(held, settled=held.gone)
            for h in later:
                self.keeper.release(h, 0, HANDED_BACK_BEHIND, urgent=True)
            self._unfinished -= 1 + len(later)
            if self.pace is not None:
                self.pace.finished(took)
            self._slots.notify_all()  # room for the receives, and the shutdown's count
            if isinstance(self._pending, Lanes):
                self._runnable.notify()  # the group's next message may run now

    def _process(self, held: Held) -> bool:
        """Run the handler on ``held``; True when the message is kept to run later."""
        assert self.keeper is not None
        message = held.message
        if not self.keeper.begin(held):
            self.observer.handler_skipped(message, "its lease was lost while it waited to start")
            return False
        with tracing.consuming(self.tracer, message):
            return self._run(held)

    def _run(self, held: Held) -> bool:
        """``_process`` from the start on: inside the message's consumer span, if traced."""
        message = held.message
        started = self.clock.monotonic()
        step = self._prepare(held, started)
        if step is not _Step.RUN:
            return step is _Step.KEEP
        self.observer.handler_started(message)
        try:
            # Log lines of the handler's own (structlog or stdlib logging) carry these fields.
            tokens = structlog.contextvars.bind_contextvars(
                **message.log_context, handler=self.handler.name
            )
            try:
                result = self.handler(message)
            finally:
                structlog.contextvars.reset_contextvars(**tokens)
            if inspect.iscoroutine(result):
                _refuse_coroutine(result, self.handler.name)
        except BaseException as exc:  # SystemExit and the like too: the thread lives on
            self._settle(held, started, exc)
        else:
            self._settle(held, started, None)
        return False

    async def _work_async(self, held: Held) -> None:
        """``_work`` for one message of a coroutine handler, on the event loop."""
        kept = False
        began = self.clock.monotonic()
        deferrals = held.deferrals
        try:
            kept = await self._process_async(held)
        except asyncio.CancelledError:
            raise  # at the shutdown's timeout: the message was handed back already
        except Exception as exc:  # a step of ours failed: the message's failure
            if self.idempotency is not None:  # releasing its claim calls the store
                offload = self._loop_runner.offload  # type: ignore[union-attr]
                kept = not await offload(self._contain, held, began, exc, deferrals)
            else:
                kept = not self._contain(held, began, exc, deferrals)
        except BaseException:
            kept = not self._reclaim(held, deferrals)
            if not kept:
                self._fault_returns(held)
            raise
        finally:
            if not kept:
                self._finish(held, self.clock.monotonic() - began)

    async def _process_async(self, held: Held) -> bool:
        """``_process`` for a coroutine handler. The steps before and after it that may
        block (S3, the idempotency store, a dead-letter copy) run on a helper thread."""
        assert self.keeper is not None and self._loop_runner is not None
        offload = self._loop_runner.offload
        message = held.message
        if not self.keeper.begin(held):
            self.observer.handler_skipped(message, "its lease was lost while it waited to start")
            return False
        with tracing.consuming(self.tracer, message):
            started = self.clock.monotonic()
            if self.idempotency or is_offloaded(message.raw_message_attributes):
                step = await offload(self._prepare, held, started)
            else:
                step = self._prepare(held, started)
            if step is not _Step.RUN:
                return step is _Step.KEEP
            self.observer.handler_started(message)
            # This coroutine runs in a context of its own: the fields stay with it.
            structlog.contextvars.bind_contextvars(**message.log_context, handler=self.handler.name)
            try:
                await self.handler(message)  # type: ignore[misc]
            except BaseException as exc:  # CancelledError too: settled, then passed on
                await self._settle_async(held, started, exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
            else:
                await self._settle_async(held, started, None)
        return False

    async def _settle_async(self, held: Held, started: float, error: BaseException | None) -> None:
        """``_settle`` for a coroutine, on a helper thread when it calls the store or SQS.

        A message handed back at the shutdown timeout had its coroutine cancelled there:
        whatever it did after (raised, or returned swallowing the cancellation), its work
        was cut short, so its key's claim is released, never completed, and nothing more
        is reported: the hand-back was."""
        assert self._loop_runner is not None
        task = asyncio.current_task()
        cancelled = isinstance(error, asyncio.CancelledError) or bool(task and task.cancelling())
        if held.handed_back and cancelled:
            if self.idempotency is not None:
                await self._loop_runner.offload(self._release_claim, held.message)
            return
        if self._settling_blocks(error):
            await self._loop_runner.offload(self._settle, held, started, error)
        else:
            self._settle(held, started, error)

    # -- containment: no message can stop a worker ------------------------------------------

    def _contain(
        self, held: Held, started: float, error: Exception, deferrals: int | None = None
    ) -> bool:
        """A step of the worker's own around the handler raised: fetching or reading the
        body, deriving or claiming its key, settling its outcome. Whether a bug of ours or
        input no step could read, it is that message's failure, never its thread's: its
        claim released, returned after a backoff (--backoff-max when the backoff is what
        failed), reported and counted; on its last attempt SQS dead-letters it. A message
        already on its way out (its delete or return queued) goes as decided, and one
        another thread or the shutdown took since this one set it aside is theirs: both are
        only reported. True when the message is this thread's to finish."""
        assert self.keeper is not None
        message = held.message
        if not self._reclaim(held, deferrals):
            self.observer.step_failed_settled(message, error)
            return False
        if held.outcome is not None:
            self.observer.step_failed_settled(message, error)
            return True
        if self._remover is not None:
            self._remover.forget(message)  # it comes back: its body is needed
        self._release_claim(message)
        last, delay = self._retry_in(message)
        self.keeper.release(held, delay, "worker error")
        with contextlib.suppress(Exception):  # the span is a nicety; the thread goes on
            self._traced(message, "failed", error, retry_in=delay, last_attempt=last)
        self.observer.step_failed(message, error, delay, last)
        return True

    def _reclaim(self, held: Held, deferrals: int | None) -> bool:
        """Whether a message whose step failed is still this thread's: one it set aside
        among the deferred is, while it is there (taken back here); one another thread or
        the shutdown took from there since (``deferrals`` is its count when this thread
        took it; None: not known, the caller's own) is theirs."""
        with self._slots:
            for index, (_, deferred) in enumerate(self._deferred):
                if deferred is held:
                    del self._deferred[index]
                    return True
            return deferrals is None or held.deferrals == deferrals

    def _retry_in(self, message: Message) -> tuple[bool, float]:
        """Whether this is the message's last attempt, and the seconds before it comes
        back: none on its last attempt (SQS moves it on its next receive), else its
        backoff, or --backoff-max when the backoff itself fails."""
        try:
            last = self._last_attempt(message)
            return last, 0.0 if last else self.backoff.delay(message.receive_count)
        except Exception:
            return False, self.config.backoff_max

    def _prepare(self, held: Held, started: float, keep: bool = True) -> _Step:
        """What comes before the handler (``_steps_before``); a step that raises is the
        message's failure, settled here."""
        deferrals = held.deferrals
        try:
            return self._steps_before(held, started, keep)
        except Exception as exc:
            # DONE: settled here; KEEP: another thread took it meanwhile, and finishes it.
            return _Step.DONE if self._contain(held, started, exc, deferrals) else _Step.KEEP

    def _steps_before(self, held: Held, started: float, keep: bool) -> _Step:
        """Its body fetched from S3 if it was offloaded, its idempotency key claimed. RUN
        the handler, KEEP it to look at again, or DONE (settled here). Without ``keep``, a
        busy key's message is returned, not kept."""
        assert self.keeper is not None
        message = held.message
        if message.message_id in self._refused_copies:
            self.keeper.release(
                held, self._retry_in(message)[1], "its dead-letter copy was refused"
            )
            return _Step.DONE
        if is_offloaded(message.raw_message_attributes):
            try:
                message.fetch_body(self.payloads)  # before the key is derived from the body
            except Reject as exc:
                self._reject(held, exc, started)
                return _Step.DONE
            except PayloadUnavailable as exc:
                self._fail(held, exc, started, delay=None)
                return _Step.DONE
            if not self.keeper.still_running(held):  # the fetch took longer than the lease
                self._traced(message, "skipped")
                self.observer.handler_skipped(
                    message, "its lease ran out while its body was fetched from S3"
                )
                return _Step.DONE
        if self.idempotency:
            verdict = self._admit(held, started, keep)
            if verdict is not Verdict.RUN:
                return _Step.KEEP if verdict is Verdict.BUSY else _Step.DONE
            if not self.keeper.still_running(held):  # the claim took longer than the lease
                self._release_claim(message)
                self._traced(message, "skipped")
                self.observer.handler_skipped(
                    message, "its lease ran out while its idempotency key was being claimed"
                )
                return _Step.DONE
        return _Step.RUN

    def _settle(self, held: Held, started: float, error: BaseException | None) -> None:
        """The handler's outcome (``_settle_outcome``); a step of settling that raises is
        the message's failure all the same."""
        try:
            self._settle_outcome(held, started, error)
        except Exception as exc:
            self._contain(held, started, exc)

    def _settle_outcome(self, held: Held, started: float, error: BaseException | None) -> None:
        """The delete on success (None), else the failure path."""
        assert self.keeper is not None
        message = held.message
        if error is None:
            self._complete_claim(message)
            self._done_with_body(message)
            self.keeper.succeed(held, urgent=self._blocks_its_group(held))
            self._traced(message, "succeeded")
            self.observer.handler_succeeded(message, self.clock.monotonic() - started)
        elif isinstance(error, Retry):
            self._fail(held, error, started, delay=error.delay)
        elif self._rejects(error):
            self._reject(held, error, started)
        else:
            self._fail(held, error, started, delay=None)

    def _rejects(self, error: BaseException) -> bool:
        if isinstance(error, batches.BatchReportError):  # ours, not the handler's: retried
            return False
        return isinstance(error, Exception) and isinstance(
            error, (Reject, *self.config.non_retryable)
        )

    def _settling_blocks(self, error: BaseException | None) -> bool:
        """True when settling ``error`` calls the idempotency store or sends a copy to the
        dead-letter queue: a coroutine handler's is then settled on a helper thread."""
        return self.idempotency is not None or (
            error is not None and not isinstance(error, Retry) and self._rejects(error)
        )

    # -- idempotency: each store call's failure is reported, and never loses the message --

    def _admit(self, held: Held, started: float, keep: bool = True) -> Verdict | None:
        """Claim the message's key: RUN, run the handler; BUSY, kept to look again later;
        anything else (None when no verdict could be had): settled here. Without ``keep``
        (a FIFO batch), a busy key's message goes back to the queue for its wait instead."""
        assert self.keeper is not None and self.idempotency is not None
        message = held.message
        try:
            admission = self.idempotency.admit(message)
        except Reject as exc:  # no key can be derived from this message
            self._reject(held, exc, started)
            return None
        except StoreError as exc:
            self.observer.store_failed("claim", exc)
            self._fail(held, exc, started, delay=None)
            return None
        verdict = admission.verdict
        if verdict is Verdict.CONFLICT:
            outcome = self.config.on_key_conflict
            self.observer.key_conflict(message, outcome)
            if outcome == "reject":
                conflict = KeyConflict(
                    f"idempotency key {message.idempotency_key!r} was used before by a message "
                    "with another body"
                )
                self._reject(held, conflict, started)
                return Verdict.CONFLICT
            verdict = Verdict.DUPLICATE
        if verdict is Verdict.DUPLICATE:
            self._done_with_body(message)
            self.keeper.succeed(held, urgent=self._blocks_its_group(held))
            self._traced(message, "duplicate")
            self.observer.duplicate_suppressed(message)
        elif verdict is Verdict.BUSY:
            # Held, not returned: a return would use up a receive, and a duplicate that
            # keeps meeting its original would end in the dead-letter queue.
            retry_in = min(max(1.0, admission.retry_in), self.config.visibility_timeout)
            if not keep:
                # Held, it could be taken to run beside its group's earlier messages.
                self.keeper.release(held, retry_in, "its idempotency key is in progress elsewhere")
                self._traced(message, "deferred", retry_in=retry_in)
                self.observer.duplicate_deferred(message, retry_in)
                return None
            with self._slots:
                closing = self._closing  # shutdown took the deferred ones already
                if not closing:
                    self.keeper.defer(held)
                    held.deferrals += 1
                    self._deferred.append((self.clock.monotonic() + retry_in, held))
                    self._runnable.notify()  # a waiting handler thread looks at its due time
                    self._slots.notify_all()  # it takes no room now: receives may go on
            if closing:
                self.keeper.hand_back([held])
                return None
            self._traced(message, "deferred", retry_in=retry_in)
            self.observer.duplicate_deferred(message, retry_in)
        return verdict

    def _complete_claim(self, message: Message) -> None:
        if self.idempotency is None:
            return
        try:
            if not self.idempotency.complete(message):
                self.observer.claim_lost(
                    message,
                    "another worker claimed the key while this handler ran (its lease had "
                    "lapsed); the effect may have happened twice",
                )
        except Exception as exc:  # a StoreError, or a store's bug: the delete goes on
            self.observer.store_failed("complete", exc)

    def _release_claim(self, message: Message) -> None:
        if self.idempotency is None:
            return
        try:
            self.idempotency.release(message)
        except Exception as exc:  # the claim lapses with its lease instead
            self.observer.store_failed("release", exc)

    def _traced(
        self, message: Message, outcome: str, error: BaseException | None = None, **details: Any
    ) -> None:
        """The outcome on the message's consumer span, when traced; on a batch's span, an
        event naming the message."""
        if self.tracer is None:
            return
        if self.handler.is_batch:
            details["messaging.message.id"] = message.message_id
        tracing.record(outcome, error, **details)

    def _done_with_body(self, message: Message) -> None:
        """The message is handled (or dropped as a duplicate): with --delete-payloads, its
        offloaded body goes once SQS deleted it. A rejected one's is kept: the copy in the
        dead-letter queue points to it."""
        if self._remover is not None:
            self._remover.expect(message)

    def _blocks_its_group(self, held: Held) -> bool:
        """True when SQS holds back the message's FIFO group until it is deleted.

        That is, when the worker holds no later message of the group: then its
        delete goes at once instead of waiting up to --delete-interval for a batch.
        """
        if not isinstance(self._pending, Lanes):
            return False
        with self._slots:
            return not self._pending.waiting(held)

    def _fail(self, held: Held, exc: BaseException, started: float, delay: float | None) -> None:
        assert self.keeper is not None
        message = held.message
        self._release_claim(message)
        last = self._last_attempt(message)
        if last:
            delay = 0.0  # the next receive moves it to the dead-letter queue: no need to wait
        elif delay is None:
            delay = self.backoff.delay(message.receive_count)
        self.keeper.release(held, delay, "retry")
        duration = self.clock.monotonic() - started
        if isinstance(exc, Retry):  # the handler's decision, not a fault
            self._traced(message, "retry requested", retry_in=delay, reason=str(exc))
            self.observer.handler_retry_requested(message, exc, duration, delay, last)
        else:
            self._traced(message, "failed", exc, retry_in=delay, last_attempt=last)
            self.observer.handler_failed(message, exc, duration, delay, last)

    def _last_attempt(self, message: Message) -> bool:
        """True when SQS moves the message to the dead-letter queue on its next receive."""
        limit = self.transport.info.max_receive_count
        return limit is not None and message.receive_count >= limit

    def _reject(self, held: Held, exc: BaseException, started: float) -> None:
        """A non-retryable failure: to the dead-letter queue now, or kept if there is none."""
        assert self.keeper is not None
        message = held.message
        self._release_claim(message)
        duration = self.clock.monotonic() - started
        target = self.transport.info.dead_letter_arn
        if target is None:
            # Nowhere safe to put it and deleting would lose it: keep it, retried rarely.
            self.keeper.release(
                held, self.config.backoff_max, "rejected without a dead-letter queue"
            )
            self._traced(message, "rejected", exc, kept_for=self.config.backoff_max)
            self.observer.handler_rejected(message, exc, duration, None)
            return
        try:
            dlq = self._dead_letters(target)
            copy, changed = dead_letter_copy(message, exc, dlq.info)
            if copy is None:
                raise TransportError(
                    f"the message takes more than the dead-letter queue's limit of "
                    f"{dlq.info.maximum_message_size:,} bytes",
                    code="MessageTooLong",
                )
            if changed:
                self.observer.dead_letter_notes_cut(message, changed)
            send_all(dlq, [copy])
        except (TransportError, StartupError) as error:
            if isinstance(error, TransportError) and error.code in REFUSED_CONTENT:
                # No copy of it can go, and running it again would not change that: SQS's
                # own redrive moves it after maxReceiveCount receives. Until then this
                # worker returns it unrun whenever it comes.
                self._refused_copies.add(message.message_id)
                last, retry_in = self._retry_in(message)
                self.keeper.release(held, retry_in, "its dead-letter copy was refused")
                self._traced(message, "rejected", exc, dead_letter_copy_refused=str(error))
                self.observer.rejected_copy_refused(message, exc, str(error))
                return
            self.observer.request_failed("SendMessageBatch", _as_transport_error(error))
            last, retry_in = self._retry_in(message)
            self.keeper.release(held, retry_in, "retry")
            self._traced(message, "failed", error, retry_in=retry_in, last_attempt=last)
            self.observer.rejected_copy_failed(message, exc, duration, retry_in, last)
            return
        # At once: until this delete, a crash leaves the original to be copied again.
        self.keeper.succeed(held, urgent=True)
        self._traced(message, "rejected", exc, dead_letter_queue=dlq.info.name)
        self.observer.handler_rejected(message, exc, duration, dlq.info.name)

    def _dead_letters(self, arn: str) -> Transport:
        if self._dead_letter_queue is None:
            self._dead_letter_queue = self.transport.open(arn)
        return self._dead_letter_queue


class Pace:
    """A message's time on its handler thread and a receive's round trip, smoothed, for
    --prefetch auto.

    ``ahead()`` is how many messages the handler threads would finish while one receive
    is under way if none of them waited: held beyond the running ones (waiting, or asked
    for by receives under way), they keep every thread busy until it returns. It counts
    what the threads could do, not what they did: a pace measured while they waited for
    messages would hold fewer and keep them waiting. The caller serialises the calls (the
    worker's ``_slots``).
    """

    WEIGHT = 0.3  # of each new round trip in the smoothed one
    TOOK_WEIGHT = 0.05  # of each message's time: one message is a noisy measure

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self.took = 0.0  # seconds a message keeps its handler thread
        self.trip = 0.0  # seconds a receive that returned messages took

    def finished(self, seconds: float) -> None:
        self.took = _smooth(self.took, max(seconds, 1e-6), self.TOOK_WEIGHT)

    def answered(self, seconds: float) -> None:
        self.trip = _smooth(self.trip, seconds, self.WEIGHT)

    def ahead(self) -> int:
        if self.took == 0:
            return 0
        return math.ceil(self.concurrency * self.trip / self.took)


def _smooth(old: float, new: float, weight: float) -> float:
    """An exponentially weighted mean; the first measure stands alone."""
    return new if old == 0 else old + weight * (new - old)


def _refuse_coroutine(result: Any, name: str) -> None:
    """A plain def handler returned a coroutine (it calls an async function without
    awaiting it): nothing was done. Fail the message rather than delete it unrun. (Other
    awaitables, a future of work submitted elsewhere say, are a result like any other.)"""
    result.close()  # no "coroutine was never awaited" warning on top of the failure
    raise TypeError(
        f"handler {name} returned {type(result).__name__} without running it: declare the "
        "handler async def and await the call, or call asyncio.run(...) inside it"
    )


def _as_transport_error(error: Exception) -> TransportError:
    return error if isinstance(error, TransportError) else TransportError(str(error))
