"""Running: the handler threads (or coroutines) that take messages from the inbox.

Three runners, one per handler shape: ``Threads`` runs a ``def`` handler one message
per thread, ``Batches`` a batch handler one batch per thread, and ``Coroutines`` an
``async def`` handler on an event loop thread. Each takes a message, begins it on its
lease, admits it (``Admission``: body, key), runs the handler, and settles the outcome
(``Settler``). A step of the worker's own that raises is that message's failure, never
the thread's; only a ``BaseException`` that is not an ``Exception`` ends a thread, its
message returned at once, and ``/healthz`` reports the thread lost.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import batches, coroutines, log_context, tracing
from .admission import Step
from .coroutines import EventLoopRunner
from .events import HANDED_BACK_BEHIND

if TYPE_CHECKING:
    from .admission import Admission
    from .clock import Clock
    from .events import Observer
    from .handler import Handler
    from .inbox import Inbox
    from .lease import Held, LeaseKeeper
    from .settling import Settler
    from .transports import Transport

LOST_WAITING = "its lease was lost while it waited to start"


class Runner:
    """What the three runners share: where messages come from and go."""

    def __init__(
        self,
        handler: Handler,
        concurrency: int,
        inbox: Inbox,
        keeper: LeaseKeeper,
        admission: Admission,
        settler: Settler,
        finished: Callable[[float], None],
        transport: Transport,
        clock: Clock,
        observer: Observer,
        tracer: Any,
    ) -> None:
        self.handler = handler
        self.concurrency = concurrency
        self.inbox = inbox
        self.keeper = keeper
        self.admission = admission
        self.settler = settler
        self.finished = finished  # told each message's time on its thread (the pace)
        self.transport = transport
        self.clock = clock
        self.observer = observer
        self.tracer = tracer
        self.alive = 0  # handler threads running (under inbox.lock)

    def start(self) -> None:
        self.alive = self.concurrency
        for index in range(self.concurrency):
            self.clock.spawn(f"sqsworker-handler-{index}", self._thread)

    def _thread(self) -> None:
        try:
            self.work()
        finally:
            with self.inbox.lock:
                self.alive -= 1  # read by /healthz: a thread lost is not live

    def work(self) -> None:
        raise NotImplementedError

    def alive_count(self) -> int:
        """Handler threads running, for /healthz."""
        return self.alive

    def close(self) -> None:
        """The shutdown's step 5, after the hand-back: nothing to do for threads (they
        cannot be stopped; their late outcomes are skipped)."""

    def finish(self, held: Held, took: float) -> None:
        """``held`` is through its handler (or handed back): it no longer counts."""
        with self.inbox.lock:
            self.finished(took)  # first: the pace may make room a receive is waiting for
            for later in self.inbox.finish(held, took):
                self.keeper.release(later, 0, HANDED_BACK_BEHIND, urgent=True)

    def _thread_fault(self, held: Held, deferrals: int) -> bool:
        """A fault that ends the thread (not an ``Exception``): the message, if still this
        thread's, goes back at once. True when it is another's to finish (kept)."""
        if not self.inbox.reclaim(held, deferrals):
            return True
        self.settler.fault_returns(held)
        return False

    def _begin(self, held: Held) -> bool:
        if self.keeper.begin(held):
            return True
        self.observer.handler_skipped(held.message, LOST_WAITING)
        return False


class Threads(Runner):
    """A ``def`` handler: each thread runs one message at a time."""

    def start(self) -> None:
        if self.concurrency > 1 and not self.inbox.fifo:
            self.inbox.use_hand_over()
        super().start()

    def work(self) -> None:
        while (held := self.inbox.next()) is not None:
            kept = False
            began = self.clock.monotonic()
            deferrals = held.deferrals
            try:
                kept = self._process(held)
            except Exception as exc:  # a step of ours failed: the message's failure
                kept = not self.settler.contain(held, began, exc, deferrals)
            except BaseException:
                kept = self._thread_fault(held, deferrals)
                raise
            finally:
                if not kept:
                    self.finish(held, self.clock.monotonic() - began)

    def _process(self, held: Held) -> bool:
        """Run the handler on ``held``; True when the message is kept to run later."""
        if not self._begin(held):
            return False
        message = held.message
        with tracing.consuming(self.tracer, message):
            started = self.clock.monotonic()
            step = self.admission.prepare(held, started)
            if step is not Step.RUN:
                return step is Step.KEEP
            self.observer.handler_started(message)
            # Log lines of the handler's own (structlog or stdlib logging) carry these.
            tokens = log_context.bind(**message.log_context, handler=self.handler.name)
            error: BaseException | None = None
            try:
                result = self.handler(message)
                if result is not None and inspect.iscoroutine(result):
                    _refuse_coroutine(result, self.handler.name)
            except BaseException as exc:  # SystemExit and the like too: the thread lives on
                error = exc
            # The handler's outcome is decided: no step of ours after it may change it.
            log_context.unbind(tokens)
            try:
                self.settler.settle(held, started, error)
            finally:
                del error  # no cycle through the traceback
        return False


class Batches(Runner):
    """A batch handler: each thread runs one batch at a time."""

    def __init__(self, *args: Any, size: int, window: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.size, self.window = size, window

    def work(self) -> None:
        while batch := self.inbox.collect(self.size, self.window):
            finished: list[Held] = []
            kept: list[Held] = []  # deferred to look at again: no longer this batch's
            began = self.clock.monotonic()
            try:
                finished = self._run(batch, kept)
            except BaseException as exc:
                # A fault of the worker's own: settle what the batch still holds. One it
                # deferred is still its own while among the deferred; one another thread
                # took from there since is that thread's.
                gone = self.inbox.undefer(batch, kept)
                finished = [held for held in batch if held not in gone]
                for held in finished:
                    if not isinstance(exc, Exception):
                        self.settler.fault_returns(held)
                    elif held.outcome is None:  # each one's failure; the thread goes on
                        self.settler.contain(held, began, exc)
                if not isinstance(exc, Exception):
                    raise
            finally:
                took = self.clock.monotonic() - began
                for held in finished:
                    self.finish(held, took)

    def _run(self, batch: list[Held], kept: list[Held]) -> list[Held]:
        """Run the batch handler on ``batch`` and settle each message; what is finished
        (all but those deferred to look at again, put in ``kept``: their key is busy
        elsewhere)."""
        fifo = self.inbox.fifo
        started = self.clock.monotonic()
        with tracing.consuming_batch(self.tracer, [held.message for held in batch]):
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
                if self._begin(held):
                    step = self.admission.prepare(held, started, keep=not fifo)
                    if step is Step.RUN:
                        ready.append(held)
                        continue
                    if step is Step.KEEP:
                        kept.append(held)
                if fifo and not held.gone:
                    stopped.add(group)
            ready, unclaimed = self._still_ready(ready, fifo, behind)
            try:
                if ready:
                    for held in ready:
                        self.observer.handler_started(held.message)
                    self._call(ready, started, fifo, behind)
            finally:
                for held in unclaimed:  # the store's calls, once the handler was called
                    self.settler.release_claim(held.message)
            for held in behind:
                self.keeper.release(held, 0, HANDED_BACK_BEHIND, urgent=True)
        return [held for held in batch if held not in kept]

    def _still_ready(
        self, ready: list[Held], fifo: bool, behind: list[Held]
    ) -> tuple[list[Held], list[Held]]:
        """Those of ``ready`` (in batch order) whose lease is still alive now that the whole
        batch was made ready (the store or S3 may have taken long): the others are not
        run, and on a FIFO queue neither are their group's later ones in the batch. And
        those whose key's claim is to be released, which the caller does once the handler
        was called: a store's call here would let the leases found alive run out before
        the handler starts (simulator seed 658)."""
        still: list[Held] = []
        unclaimed: list[Held] = []
        cut: set[str | None] = set()
        for held in ready:
            group = held.message.group_id
            if group in cut:
                unclaimed.append(held)
                behind.append(held)
            elif self.keeper.still_running(held):
                still.append(held)
            else:
                unclaimed.append(held)
                self.observer.handler_skipped(
                    held.message, "its lease ran out while its batch was made ready"
                )
                if fifo:
                    cut.add(group)
        return still, unclaimed

    def _call(self, ready: list[Held], started: float, fifo: bool, behind: list[Held]) -> None:
        """Call the handler with ``ready`` and settle each by its outcome. On a FIFO queue,
        a group's messages after one that failed go ``behind``, with their key's claim
        completed if the handler did them, else released."""
        messages = [held.message for held in ready]
        returned: object = None
        raised: BaseException | None = None
        info = self.transport.info
        tokens = log_context.bind(
            queue=info.name, batch_size=len(messages), handler=self.handler.name
        )
        try:
            if self.handler.is_lambda:  # Lambda's event names the queue by its ARN
                returned = self.handler.func(messages, info.arn)  # type: ignore[call-arg,arg-type]
            else:
                returned = self.handler(messages)  # type: ignore[arg-type]
        except BaseException as exc:  # SystemExit and the like too: the thread lives on
            raised = exc
        log_context.unbind(tokens)  # never the handler's outcome
        outcomes = batches.outcomes(messages, returned, raised)
        cut: set[str | None] = set()  # FIFO groups a message of which failed here
        try:
            for held, error in zip(ready, outcomes, strict=True):
                group = held.message.group_id
                if group in cut:
                    if error is None:
                        # The handler did it: its key is completed, so when it comes
                        # back behind the failed one it is dropped as a duplicate.
                        self.settler.complete_claim(held.message)
                    else:
                        self.settler.release_claim(held.message)
                    behind.append(held)
                    continue
                self.settler.settle(held, started, error)
                if fifo and not held.gone:
                    cut.add(group)
        finally:
            del raised, outcomes  # no cycle through the traceback


class Coroutines(Runner):
    """An ``async def`` handler: up to ``concurrency`` coroutines on one event loop
    thread. The steps before and after the handler that may block (S3, the idempotency
    store, a dead-letter copy) run on a helper thread."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.loop = EventLoopRunner(
            self.concurrency,
            self.clock,
            self.inbox.next_few,
            self.work_one,
            self.observer,
            give_back=self._give_back,
        )

    def start(self) -> None:
        self.loop.start()

    def close(self) -> None:
        """The shutdown's step 5, after the hand-back: coroutines still running (past the
        timeout) are cancelled, and the event loop stops."""
        self.loop.close()

    def alive_count(self) -> int:
        return self.concurrency if self.loop.alive() else 0

    def _give_back(self, taken: list[Held]) -> None:
        """Messages taken to run that nothing will run (the event loop is gone)."""
        for held in taken:
            self.settler.fault_returns(held)
            self.finish(held, 0.0)

    async def work_one(self, held: Held) -> None:
        """One message, on the event loop."""
        kept = False
        began = self.clock.monotonic()
        deferrals = held.deferrals
        try:
            kept = await self._process(held)
        except asyncio.CancelledError:
            raise  # at the shutdown's timeout: the message was handed back already
        except Exception as exc:  # a step of ours failed: the message's failure
            if self.settler.idempotency is not None:  # releasing its claim calls the store
                contain = self.settler.contain
                kept = not await self.loop.offload(contain, held, began, exc, deferrals)
            else:
                kept = not self.settler.contain(held, began, exc, deferrals)
        except BaseException:
            kept = self._thread_fault(held, deferrals)
            raise
        finally:
            if not kept:
                self.finish(held, self.clock.monotonic() - began)

    async def _process(self, held: Held) -> bool:
        offload = self.loop.offload
        if not self._begin(held):
            return False
        message = held.message
        with tracing.consuming(self.tracer, message):
            started = self.clock.monotonic()
            if self.admission.blocks(held):
                step = await offload(self.admission.prepare, held, started)
                # Resumed by the loop, maybe late (a handler blocked it past the lease).
                if step is Step.RUN and not self.keeper.still_running(held):
                    step = await offload(self.admission.lapsed, held)
            else:
                step = self.admission.prepare(held, started)
            if step is not Step.RUN:
                return step is Step.KEEP
            self.observer.handler_started(message)
            # This coroutine runs in a context of its own: the fields stay with it.
            log_context.bind(**message.log_context, handler=self.handler.name)
            task = asyncio.current_task()
            try:
                await self.handler(message)  # type: ignore[misc]
            except BaseException as exc:  # CancelledError too: settled, then passed on
                if isinstance(exc, GeneratorExit) and not _stepped_by(task):
                    raise  # closed from outside (the collector, at the process's exit)
                await self._settle(held, started, exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
            else:
                await self._settle(held, started, None)
        return False

    async def _settle(self, held: Held, started: float, error: BaseException | None) -> None:
        """``Settler.settle``, on a helper thread when it calls the store or SQS.

        A message handed back at the shutdown timeout had its coroutine cancelled there:
        whatever it did after (raised, or returned swallowing the cancellation), its work
        was cut short, so its key's claim is released, never completed, and nothing more
        is reported: the hand-back was."""
        settler = self.settler
        if held.handed_back and _cancelled(error):
            if settler.idempotency is not None:
                await self.loop.offload(settler.release_claim, held.message)
            return
        if settler.blocks(error):
            await self.loop.offload(settler.settle, held, started, error)
        else:
            settler.settle(held, started, error)


def _stepped_by(task: asyncio.Task[Any] | None) -> bool:
    """This code runs in ``task``'s own step: not in a close of its coroutine from outside
    (the collector's, on any thread, or another task's)."""
    try:
        return task is not None and asyncio.current_task() is task
    except RuntimeError:  # no loop runs on this thread
        return False


def _cancelled(error: BaseException | None) -> bool:
    """The current coroutine was cancelled: it raised the cancellation, or swallowed it."""
    task = asyncio.current_task()
    return isinstance(error, asyncio.CancelledError) or bool(task and task.cancelling())


def helper_threads(handler: Handler, concurrency: int) -> int:
    """Threads that call SQS, S3 or the store on a message's behalf besides the receive
    and lease threads: the handler threads, or a coroutine handler's helpers."""
    if handler.is_async:  # and each coroutine in asyncio.to_thread(...), at most
        return concurrency + min(concurrency, coroutines.MAX_HELPERS)
    return concurrency


def _refuse_coroutine(result: Any, name: str) -> None:
    """A plain def handler returned a coroutine (it calls an async function without
    awaiting it): nothing was done. Fail the message rather than delete it unrun. (Other
    awaitables, a future of work submitted elsewhere say, are a result like any other.)"""
    result.close()  # no "coroutine was never awaited" warning on top of the failure
    raise TypeError(
        f"handler {name} returned {type(result).__name__} without running it: declare the "
        "handler async def and await the call, or call asyncio.run(...) inside it"
    )
