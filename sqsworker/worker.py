"""The worker: receiving, running and settling, composed; and the shutdown's order.

One message's path (docs/architecture.md draws it): a receive thread (``receiving``)
long-polls while there is room, hands the message to the lease keeper (``lease``), which
keeps its visibility alive from that moment, and puts it in the ``inbox``. A handler
thread or coroutine (``running``) takes it, begins it on its lease, admits it
(``admission``: its body from S3, its idempotency key claimed), runs the handler, and
the ``settling`` module decides where it goes: deleted, returned after a backoff, or
copied to the dead-letter queue and deleted. The lease keeper sends the deletes and
returns in batches. The worker owns no signals; ``cli.py`` does, so a ``Worker`` can run
embedded in another program.
"""

from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING, Any

from . import tracing
from .admission import Admission
from .clock import Clock, SystemClock
from .config import WorkerConfig
from .errors import ConfigError, StartupError
from .events import Observer, Observers
from .handler import Handler, as_handler
from .health import Health
from .idempotency import Idempotency
from .inbox import Inbox
from .lease import MAX_SENDERS, LeaseKeeper
from .payloads import Payloads, RemoveAfterDelete
from .policies import Backoff
from .receiving import LoopIO, Receiver
from .room import Pace, Room
from .running import Batches, Coroutines, Runner, Threads, helper_threads
from .settling import Settler
from .transports import MAX_BATCH, Transport

if TYPE_CHECKING:
    from .stores import Store

DEFAULT_BATCH_SIZE = 10  # a batch handler's, when nothing sets --batch-size
MAX_BATCH_SLOTS = 10_000  # concurrency x batch size, at most
MAX_DEFERRED = 1_000  # duplicates held for a busy key without taking room, at least


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
        # A batch handler's thread runs a batch at a time: up to this many messages.
        self.batch_size, self.batch_window = self._batching()
        prefetch = self.config.prefetch
        slots = self.config.concurrency * self.batch_size
        # Calls to delete, return or renew under way at once: one per batch of capacity.
        limit = prefetch if prefetch is not None else max(MAX_BATCH, 2 * slots)
        self.senders = max(2, min(MAX_SENDERS, math.ceil((slots + limit) / MAX_BATCH)))
        self.room = Room(
            slots=slots,
            prefetch_limit=limit,
            # Duplicates held while their key is busy elsewhere take no room from runnable
            # messages, up to this many (past it, each takes room as a waiting one does).
            # Held, not returned: a return would use up one of its receives, and a healthy
            # duplicate must never reach the dead-letter queue.
            max_deferred=max(MAX_DEFERRED, 10 * slots),
            # Through their handler, their delete or return not answered yet: this many
            # are held beyond the capacity (a batch per sender), and no more. Deletes
            # failing for a while must not let held messages pile up.
            unanswered=MAX_BATCH * self.senders,
        )
        self._stopping = threading.Event()  # set once: no more receives
        self.inbox = Inbox(self.clock)
        self.receiver = Receiver(
            self.inbox,
            self.room,
            self.config,
            self.clock,
            self.observer,
            self._stopping,
            auto_prefetch=prefetch is None,
        )
        self._started = False
        self.keeper: LeaseKeeper | None = None
        self.runner: Runner | None = None

    # The sizes, by the names the docs and the metrics use.
    @property
    def slots(self) -> int:
        return self.room.slots

    @property
    def capacity(self) -> int:
        return self.room.capacity

    @property
    def pollers(self) -> int:
        return self.room.pollers

    @property
    def max_deferred(self) -> int:
        return self.room.max_deferred

    @property
    def held_bound(self) -> int:
        return self.room.held_bound

    @property
    def pace(self) -> Pace | None:
        return self.receiver.pace

    @property
    def transport(self) -> Transport:
        if self._transport is None:
            raise RuntimeError("the worker is not started")
        return self._transport

    @property
    def in_hand(self) -> int:
        """Messages received and not yet through a handler: running plus waiting to start."""
        with self.inbox.lock:
            return self.inbox.unfinished

    @property
    def started(self) -> bool:
        return self._started

    def sqs_unanswered(self) -> tuple[float, str]:
        """Seconds the receives have failed in a row (0 while SQS answers), and the last
        error."""
        return self.receiver.unanswered()

    def health(self) -> Health:
        unanswered, error = self.sqs_unanswered()
        runner = self.runner
        loop = runner.loop if isinstance(runner, Coroutines) else None
        return Health(
            sqs_unanswered=unanswered,
            sqs_error=error,
            started=self._started,
            stopping=self._stopping.is_set(),
            receiver_overdue=max(p.overdue() for p in self.receiver.progress),
            lease_overdue=self.keeper.overdue() if self.keeper else 0.0,
            receiver_alive=self.receiver.alive == self.room.pollers,
            lease_alive=self.keeper is not None and self.keeper.alive(),
            handlers_alive=runner.alive_count() if runner else 0,
            handlers=self.config.concurrency,
            loop_blocked=loop.blocked_for(self.config.stall_timeout) if loop else None,
            loop_allowance=self.config.stall_timeout,
            claims_alive=(
                self.idempotency.keeper.alive()
                if self.idempotency and self.idempotency.keeper
                else None
            ),
        )

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        """Connect, check the queue, and start the threads. Raises ``StartupError``."""
        if self._transport is None:
            from .transports.sqs import SQSTransport

            threads = helper_threads(self.handler, self.config.concurrency)
            self._transport = SQSTransport.connect(
                self.config.queue,
                endpoint_url=self.config.endpoint_url,
                region=self.config.region,
                max_connections=threads + self.room.pollers + self.senders + 2,
                sqs_client=self.config.sqs_client,
            )
        if self.transport.info.fifo:
            self.inbox.order_by_group()
        self.idempotency = self._open_idempotency()
        claims = None
        if self.idempotency:
            # The store is slower than SQS and may be locked: claims are renewed on a
            # thread of their own, ahead of the renewals of their leases, which wait
            # for them (see ``idempotency.plan``).
            claims = self.idempotency.start(self.observer.store_failed, self.observer.claim_lost)
        self.keeper = LeaseKeeper(
            self.transport,
            self.clock,
            self.observer,
            delete_interval=self.config.delete_interval,
            stall_timeout=self.config.stall_timeout,
            on_extend=claims.wake if claims else None,
            on_released=self.inbox.changed,
            senders=self.senders,
        )
        self.keeper.start()
        self.runner = self._runner(self.keeper)
        self.runner.start()
        self.observer.worker_started(self.transport.info, self.config)
        self.receiver.start(self.transport, self.keeper, self._receive_loop())
        self._started = True

    def _receive_loop(self) -> LoopIO | None:
        """The event loop a coroutine worker's receives, deletes and returns run on: its
        own, when the transport calls SQS there without a thread (the lean client, no
        proxy) and the loop keeps the worker's time (a test's fake clock is not the
        loop's). Else threads. (Renewals stay on a thread: lease_loop.py says why.)"""
        runner, transport, keeper = self.runner, self.transport, self.keeper
        if not isinstance(runner, Coroutines) or not runner.loop.keeps(self.clock):
            return None
        native = getattr(transport, "receives_on_loop", None)
        if native is None or not native() or keeper is None:
            return None
        if hasattr(transport, "delete_batch_async"):  # its calls under way end first
            calls = keeper.on_loop(runner.loop.loop, runner.loop.blocked_for)
            runner.loop.at_end.append(calls.detach)
        close = getattr(transport, "close_on_loop", None)
        if close is not None:  # its connections of the loop, closed as the loop ends
            runner.loop.at_end.append(close)
        return runner.loop

    def _runner(self, keeper: LeaseKeeper) -> Runner:
        """The runner for the handler's shape, with what it settles and admits through."""
        settler = Settler(
            keeper,
            self.clock,
            self.transport,
            self.inbox,
            self.config,
            self.backoff,
            self.observer,
            idempotency=self.idempotency,
            remover=self._remover,
            tracer=self.tracer,
            batch=self.handler.is_batch,
        )
        admission = Admission(
            keeper,
            settler,
            self.inbox,
            self.config,
            self.clock,
            self.observer,
            self.payloads,
            self.idempotency,
        )
        parts = (
            self.handler,
            self.config.concurrency,
            self.inbox,
            keeper,
            admission,
            settler,
            self.receiver.finished,
            self.transport,
            self.clock,
            self.observer,
            self.tracer,
        )
        if self.handler.is_async:
            return Coroutines(*parts)
        if self.handler.is_batch:
            return Batches(*parts, size=self.batch_size, window=self.batch_window)
        return Threads(*parts)

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
        threads = helper_threads(self.handler, self.config.concurrency)
        try:
            return Idempotency.open(self.config, self.clock, namespace, threads=threads)
        except StartupError:
            self.transport.close()
            raise

    def request_stop(self) -> None:
        """Ask the worker to stop receiving; ``shutdown`` does the rest. Safe from any thread."""
        self._stopping.set()
        self.inbox.changed()

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
        assert self.keeper is not None and self.runner is not None
        deadline = self.clock.monotonic() + self.config.shutdown_timeout

        # 1. Stop receiving, and take out what waits to run (and the deferred duplicates).
        self._stopping.set()
        waiting = self.inbox.close()
        self.observer.shutdown_started(len(waiting), self.in_hand)

        # 2. Wait out the long polls still under way (each ends within --wait-time), so
        #    none of their messages is stranded. Handlers run on.
        returned = self.receiver.wait_out()

        # 3. Hand back the waiting messages, and what those polls brought: visible to
        #    others at once. Only now: a poll of ours still under way would receive them
        #    again, each time using up one of their receives (maxReceiveCount), and could
        #    move them to the dead-letter queue unrun.
        self.keeper.hand_back(waiting + returned)

        # 4. Let running handlers finish; the lease thread keeps their leases alive.
        clean = self.inbox.wait_finished(deadline)

        # 5. Past the timeout, hand the still-running messages back for another worker,
        #    and those taken to run that never began (a coroutine that had not started, a
        #    batch still being made ready): begun late, they are skipped. Coroutine
        #    handlers still running are cancelled then (thread handlers cannot be).
        self.keeper.off_loop()  # from now on deletes and returns go to the lease's threads
        self.keeper.hand_back([] if clean else self.keeper.unsettled())
        self.runner.close()

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
