"""The lease threads: they carry out what the lease machine decides.

Every SQS write about a held message goes through ``LeaseKeeper``: renewing leases
before they expire (``ChangeMessageVisibilityBatch``), deleting after success
(``DeleteMessageBatch``), and returning messages with a delay after a failure or at
shutdown. One owner means a renewal can never race a delete or a hand-back on the same
receipt handle.

What to send and when is decided by ``lease_machine.LeaseMachine`` (the timing rules are
written there); this module only drives it. Under one lock, the worker's threads feed it
events (``add``, ``begin``, ``succeed``, ``release``, ``hand_back``, ``extend``,
``stop``) and the lease thread feeds it the time and takes the calls it gives. A few
sender threads make the calls, renewals first, and one more makes renewals only, so slow
deletes never hold up a renewal that is due; each feeds SQS's answer back. (A coroutine
worker's deletes and returns may be made on its event loop instead: lease_loop.py.) The
reports the machine gives go to the observer outside the lock, on the thread whose event
gave them.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import cast

from .clock import Clock, Task
from .errors import LeaseLost, TransportError
from .events import Observer
from .health import Progress
from .held import Held, HeldLease, Snapshot, message_of, messages_of
from .lease_loop import LOOK, LoopCalls
from .lease_machine import CAP_MARGIN, NEAR_CAP, RETRY_AFTER_ERROR, LeaseMachine
from .lease_state import (
    Call,
    Command,
    Deleted,
    DeletedAfterLeaseLost,
    DeleteFailed,
    Entry,
    Extended,
    IllegalTransition,
    NearCap,
    Op,
    Returned,
    Room,
    State,
)
from .lease_state import LeaseLost as LeaseLostReport
from .transports import BatchResult, EntryFailure, Envelope, Transport

__all__ = [
    "CAP_MARGIN",
    "MAX_SENDERS",
    "NEAR_CAP",
    "RETRY_AFTER_ERROR",
    "Held",
    "HeldLease",
    "IllegalTransition",
    "LeaseKeeper",
    "Snapshot",
    "State",
]

# Calls to SQS under way at once, at most. 1,000 coroutines of 100 ms at 20 ms a request
# need about 20 delete calls under way; behind 16, deletes not yet made took the room of
# the receives, and the worker moved 0.63 of its ideal (0.77 with 32: bench/README.md).
MAX_SENDERS = 32


def _failures(batch: Sequence[object], result: BatchResult) -> dict[int, EntryFailure]:
    """A batch result's failed entries by their index in ``batch`` (ids are indexes)."""
    if not result.failed:
        return {}
    by_id = {f.id: f for f in result.failed}
    return {i: by_id[str(i)] for i in range(len(batch)) if str(i) in by_id}


class LeaseKeeper:
    def __init__(
        self,
        transport: Transport,
        clock: Clock,
        observer: Observer,
        *,
        delete_interval: float = 0.2,
        stall_timeout: float = 120.0,
        on_extend: Callable[[], None] | None = None,
        on_released: Callable[[], None] | None = None,
        senders: int = 2,
    ) -> None:
        self.transport = transport
        self.clock = clock
        self.observer = observer
        self.stall_timeout = stall_timeout
        self.progress = Progress(clock)  # read by /healthz
        # Called (no lock held) when a handler asks for more: its claim must cover it first.
        self.on_extend = on_extend
        # Called on this thread (no lock held) when held messages were settled or lost.
        self.on_released = on_released
        self.machine = LeaseMachine(delete_interval)  # guarded by lock, as is every Held
        self.lock = self._lock = threading.Lock()
        # The lease thread, stop() and extend() callers wait on _wake; each sender on one
        # of its own (``_ready``): a call queued wakes the idle one that began to wait last,
        # so while one keeps up, one makes every call (see ``_hand_out``). All on _lock.
        self._wake = threading.Condition(self._lock)
        # The lease thread waits until then (inf: until woken); -inf while it works.
        self._waiting_until = -math.inf
        self._thread: Task | None = None
        self._finished = False  # the thread has returned
        # One sender for renewals only, and ``senders`` for every call, renewals first.
        self._renewal_calls: deque[Call] = deque()
        self._settle_calls: deque[Call] = deque()
        self._senders = [Progress(clock) for _ in range(1 + max(1, min(senders, MAX_SENDERS)))]
        self._ready = [threading.Condition(self._lock) for _ in self._senders]
        self._idle: list[threading.Condition] = []  # general senders waiting, latest last
        self._senders_alive = 0
        self._loop_calls: LoopCalls | None = None  # deletes and returns go there (lease_loop.py)

    @property
    def delete_interval(self) -> float:
        return self.machine.delete_interval

    @property
    def handed_back_count(self) -> int:
        """Returns at shutdown SQS took: read by the closing line."""
        return self.machine.handed_back_count

    # -- called by the worker's threads -------------------------------------------

    def start(self) -> None:
        self._senders_alive = len(self._senders)
        for index, progress in enumerate(self._senders):
            send = partial(self._send, progress, self._ready[index], renewals_only=index == 0)
            self.clock.spawn(f"sqsworker-lease-sender-{index}", send)
        self._thread = self.clock.spawn("sqsworker-lease", self._run)

    def on_loop(self, loop: asyncio.AbstractEventLoop, blocked: Callable[[], float]) -> LoopCalls:
        """Deletes and returns go to ``loop`` while ``blocked()`` is 0 (lease_loop.py)."""
        with self._lock:
            self._loop_calls = LoopCalls(self, loop, blocked)
            return self._loop_calls

    def off_loop(self) -> None:
        """The loop ends: what it has not begun, and every later call, go to the senders."""
        with self._lock:
            if self._loop_calls is not None and not self._loop_calls.detached:
                self._loop_calls.detached = True
                self._to_senders(self._loop_calls.take_waiting())

    def add(self, envelopes: Sequence[Envelope], received_at: float, timeout: int) -> list[Held]:
        arrived = [Held(self, e, received_at, timeout) for e in envelopes]
        with self._lock:
            held = self.machine.received(arrived)  # without messages held already
            # Only a lease thread waiting past their renewal wakes (a busy one sees them).
            if held and min(h.renew_at for h in held) < self._waiting_until:
                self._wake.notify_all()
        return held

    def begin(self, held: Held) -> bool:
        """Mark a waiting message as running; False if it was lost or handed back meanwhile."""
        machine = self.machine
        with self._lock:
            began = machine.begin(held, self.clock.monotonic())
            if not machine.out:  # nothing to report: the usual case
                return began
            commands = self._take()
        self._carry_out(commands)
        return began

    def still_running(self, held: Held) -> bool:
        """True if ``held`` is running on a lease that has not run out (checked now)."""
        machine = self.machine
        with self._lock:
            running = machine.still_running(held, self.clock.monotonic())
            if not machine.out:  # nothing to report: the usual case
                return running
            commands = self._take()
        self._carry_out(commands)
        return running

    def defer(self, held: Held) -> None:
        """A running message goes back to waiting (its lease still kept), to begin again."""
        with self._lock:
            self.machine.defer(held)

    def succeed(self, held: Held, urgent: bool = False) -> None:
        """Queue the delete (``urgent``: send it now, with whatever else is queued).
        After a lease that ran out here the delete is still tried (nobody may have taken
        the message yet), reported as unsure; after SQS said the handle is gone, not."""
        self._queue(Op(held, "delete", urgent=urgent), allow_lost=True)

    def delete_now(self, held: Sequence[Held], timeout: float) -> int:
        """Delete ``held`` at once and wait until SQS answered for each, at most ``timeout``.
        Returns how many deletes are still unanswered (queued, being retried)."""
        for h in held:
            self.succeed(h, urgent=True)
        return self._answered_within(held, timeout)

    def hand_back_now(self, held: Sequence[Held], timeout: float) -> int:
        """``hand_back`` these, and wait until SQS answered for each, at most ``timeout``.
        Returns how many returns are still unanswered (queued, being retried)."""
        self.hand_back(held)
        return self._answered_within(held, timeout)

    def _answered_within(self, held: Sequence[Held], timeout: float) -> int:
        deadline = self.clock.monotonic() + timeout
        with self._lock:
            while self.clock.monotonic() < deadline and any(
                h.state is State.SETTLING for h in held
            ):
                self.clock.wait(self._wake, deadline)
            return sum(h.state is State.SETTLING for h in held)

    def flush(self) -> None:
        """Send the queued deletes and returns that can go now in full batches (of one
        action), the oldest first, rather than wait out --delete-interval; fewer than a
        batch only when no full one is queued and no call is under way.

        Fewer than a batch are left to fill one while calls are under way: their answers
        free room as soon, and a receive thread calls this each time it finds no room.
        """
        with self._lock:
            if self.machine.flush(self.clock.monotonic()):
                self._wake.notify_all()

    def release(self, held: Held, seconds: float, reason: str, urgent: bool = False) -> None:
        """Return the message to the queue, visible again after ``seconds``."""
        self._queue(Op(held, "return", math.ceil(seconds), reason, urgent=urgent))

    def hand_back(self, held: Sequence[Held]) -> None:
        """Make these messages visible again at once (shutdown). A handler still running
        on one is told its lease is lost from now on; one about to begin cannot."""
        for h in held:
            with self._lock:
                # Marked before its return is queued, in one step with the state read:
                # a begin() in between (a thread that had just taken it) must fail.
                if self.machine.hand_back(h):
                    self._wake.notify_all()  # an extend() waiting on it raises LeaseLost
            self.release(h, 0, "shutdown", urgent=True)

    def running(self) -> list[Held]:
        with self._lock:
            return cast(list[Held], self.machine.in_states(State.RUNNING))

    def unsettled(self) -> list[Held]:
        """Held messages not yet settled: running, or taken to run and not yet begun."""
        with self._lock:
            return cast(list[Held], self.machine.in_states(State.WAITING, State.RUNNING))

    def held_count(self) -> int:
        with self._lock:
            return len(self.machine.held)

    def settling_count(self) -> int:
        """Held messages through their handler, their delete or return not yet answered."""
        return self.machine.settling  # one int, read whole: no lock needed

    def check(self) -> list[str]:
        """The lease machine's invariants that do not hold now (for the simulator)."""
        with self._lock:
            return self.machine.check()

    def alive(self) -> bool:
        with self._lock:
            return (
                self._thread is not None
                and not self._finished
                and self._senders_alive == len(self._senders)
            )

    def overdue(self) -> float:
        """Seconds the lease thread or a sender is past its step's allowance (for /healthz)."""
        return max(p.overdue() for p in [self.progress, *self._senders])

    def snapshot(self) -> Snapshot:
        """What is held now, for the metrics: counts by state and the oldest receive."""
        with self._lock:
            held = list(self.machine.held.values())
        states = [h.state for h in held]
        return Snapshot(
            waiting=states.count(State.WAITING),
            running=states.count(State.RUNNING),
            oldest_received_at=min((h.received_at for h in held), default=None),
        )

    def extend(self, held: Held, seconds: int) -> float:
        now = self.clock.monotonic
        with self._lock:
            target = self.machine.extend(held, seconds, now())
            self._wake.notify_all()
        if target is not None and self.on_extend is not None:
            self.on_extend()  # its claim, if it has one, must move first
        with self._lock:
            # Until renewed, lost, settled, at the cap, or past the lease: never longer.
            while target and (until := self.machine.extend_wait(held, target, now())) is not None:
                self.clock.wait(self._wake, until)
            commands = self._take()
        if commands:
            self._carry_out(commands)
        if held.lost:  # found so, or set by the lease thread while this one waited
            raise LeaseLost(f"the lease of message {held.envelope.message_id} was lost")
        return held.seconds_left

    def cover(self, held: Held, seconds: float) -> None:
        """``held``'s claim lets SQS hide it ``seconds`` from now (inf: it holds none)."""
        with self._lock:
            held.claim_until = self.clock.monotonic() + seconds
            if held.renew_at < self._waiting_until:  # a renewal it held back may go now
                self._wake.notify_all()

    def stop(self, give_up_after: float) -> int:
        """Flush what is queued, then end the thread. Returns how many ops stayed unsent."""
        with self._lock:
            self.machine.stop(self.clock.monotonic(), give_up_after)
            self._wake.notify_all()
            while self._thread is not None and (not self._finished or self._senders_alive):
                self.clock.wait(self._wake, None)
            return len(self.machine.ops)

    def _queue(self, op: Op, allow_lost: bool = False) -> None:
        with self._lock:
            look_by = self.machine.settle(op, self.clock.monotonic(), allow_lost)
            loop = self._loop_calls
            if look_by == -math.inf and loop is not None and loop.takes_calls(here=True):
                # A batch filled on the loop the calls are made on: handed out here, as
                # the lease thread would, so that no thread wakes for it (unless it does
                # not look at the loop within LOOK).
                now = self.clock.monotonic()
                self.machine.expire(now)
                self._hand_out(self.machine.due(now))
                look_by = now + LOOK if loop.pending() else math.inf
            # Wake the lease thread only if it waits past this op's moment (an op on a
            # busy message goes when that call's answer wakes it) or a batch is full.
            if look_by == -math.inf or look_by < self._waiting_until:
                self._wake.notify_all()
            if not self.machine.out:  # nothing to report: the usual case
                return
            commands = self._take()
        self._carry_out(commands)

    # -- the machine's commands ------------------------------------------------------

    def _take(self) -> Sequence[Command]:
        """The machine's commands from the event just fed (the lock held); wakes those
        waiting on a lease if one was lost or reached the cap."""
        if self.machine.woke:
            self.machine.woke = False
            self._wake.notify_all()
        return self.machine.take()

    def _carry_out(self, commands: Sequence[Command]) -> None:
        """Report what the machine said, outside the lock, in its order."""
        for command in commands:
            if isinstance(command, LeaseLostReport):
                self.observer.lease_lost(message_of(command.entry), command.reason)
            elif isinstance(command, DeleteFailed):
                message = message_of(command.entry)
                self.observer.delete_failed(message, command.reason, command.retrying)
            elif isinstance(command, Deleted):
                self.observer.deleted(messages_of(command.entries))
            elif isinstance(command, DeletedAfterLeaseLost):
                self.observer.deleted_after_lease_lost(message_of(command.entry))
            elif isinstance(command, Returned):
                messages = messages_of(command.entries)
                self.observer.returned(messages, command.seconds, command.reason)
            elif isinstance(command, Extended):
                messages = messages_of(command.entries)
                self.observer.leases_extended(messages, command.seconds)
            elif isinstance(command, NearCap):
                self.observer.lease_near_cap(message_of(command.entry), command.seconds_left)
            elif isinstance(command, Room) and self.on_released is not None:
                self.on_released()  # room for more messages under the held bound

    # -- the lease thread: time passing ----------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            with self._lock:
                self._finished = True  # the senders end once the calls under way are made
                self._wake.notify_all()
                for ready in self._ready:
                    ready.notify()

    def _loop(self) -> None:
        machine = self.machine
        while True:
            with self._lock:
                now = self.clock.monotonic()
                late = self._late_on_loop(now)
                ended = False
                if machine.gave_up(now):  # nothing new: the answers under way, then the end
                    ended = not machine.under_way
                    if not ended:
                        self.progress.idle()
                        self.clock.wait(self._wake, self._loop_look(now, None))
                else:
                    lapsed = machine.expire(now)
                    calls = machine.due(now)
                    if calls:
                        self._hand_out(calls)
                    elif not lapsed and not late:
                        ended = machine.drained()
                        if not ended:
                            self.progress.idle()
                            deadline = self._loop_look(now, machine.next_deadline(now))
                            self._waiting_until = math.inf if deadline is None else deadline
                            self.clock.wait(self._wake, deadline)
                            self._waiting_until = -math.inf
                            self.progress.step(self.stall_timeout)
                commands = self._take()
            if commands:
                self._carry_out(commands)
            if ended:
                return

    def _late_on_loop(self, now: float) -> bool:
        """Calls a blocked loop holds up go to the threads (lease_loop.py); if any did."""
        not_begun, gave_up = self._loop_calls.late(now) if self._loop_calls else ([], False)
        self._to_senders(not_begun)
        return bool(not_begun) or gave_up

    def _loop_look(self, now: float, deadline: float | None) -> float | None:
        """``deadline``, or sooner: every LOOK seconds while the loop has calls."""
        if self._loop_calls is None or not self._loop_calls.pending():
            return deadline
        return now + LOOK if deadline is None else min(deadline, now + LOOK)

    def _hand_out(self, calls: list[Call]) -> None:
        """Queue the calls for the senders, or deletes and returns for the loop (locked)."""
        settles = [call for call in calls if call.ops]
        renews = [call for call in calls if call.renewals]
        loop = self._loop_calls
        if loop is not None and settles and loop.takes_calls():
            loop.queue(settles)
            settles = []
        self._renewal_calls.extend(renews)
        if renews:
            self._ready[0].notify()
        self._to_senders(settles, len(renews))

    def _to_senders(self, settles: Sequence[Call], more: int = 0) -> None:
        """Queue deletes and returns for the senders (the lock held), waking an idle one a
        call (and ``more``), longest-waiting first: each on a CPU the last had left."""
        self._settle_calls.extend(settles)
        for _ in range(min(len(settles) + more, len(self._idle))):  # renewals first too
            self._idle.pop().notify()

    # -- the senders: SQS calls, made outside the lock ---------------------------------

    def _send(self, progress: Progress, ready: threading.Condition, renewals_only: bool) -> None:
        """A sender thread: make the calls the lease thread queued, one at a time."""
        try:
            while True:
                with self._lock:
                    while not self._finished and not (
                        self._renewal_calls or (self._settle_calls and not renewals_only)
                    ):
                        progress.idle()
                        if not renewals_only:
                            self._idle.append(ready)
                        try:
                            self.clock.wait(ready, None)
                        finally:
                            if ready in self._idle:  # woken by the lease thread's end
                                self._idle.remove(ready)
                    if self._renewal_calls:
                        call = self._renewal_calls.popleft()
                    elif self._settle_calls and not renewals_only:
                        call = self._settle_calls.popleft()
                    else:
                        return  # the lease thread ended and nothing is left for this one
                progress.step(self.stall_timeout)
                self._make(call)
                del call  # not kept while idle: its messages (bodies up to 1 MiB) would live on
                progress.idle()
        finally:
            with self._lock:
                self._senders_alive -= 1
                self._wake.notify_all()

    def _make(self, call: Call) -> None:
        try:
            if call.ops:
                self._settle(call)
            else:
                self._renew(call)
        except IllegalTransition:
            raise  # a defect in this driver: loud, never retried as if SQS had failed
        except Exception as exc:  # never let a sender die: every lease hangs on them
            self._broke(call, TransportError(repr(exc)))
        finally:
            self._ended(call)

    def _broke(self, call: Call, error: TransportError) -> None:
        """Making the call raised something unforeseen: its entries are tried again."""
        self.observer.request_failed("lease sender", error)
        with self._lock:
            self.machine.broke(call, self.clock.monotonic())
            commands = self._take()
        if commands:
            self._carry_out(commands)

    def _ended(self, call: Call) -> None:
        with self._lock:
            self.machine.ended(call)
            self._wake.notify_all()  # the lease thread, and extend() callers waiting
            commands = self._take()
        if commands:
            self._carry_out(commands)

    def _settle(self, call: Call) -> None:
        """One batch of deletes, or of returns."""
        # No lock: the call is this sender's alone, and what it reads of its entries (the
        # receive's start, the op's delay) does not change once queued.
        entries = self.machine.sending(call, self.clock.monotonic())
        result: BatchResult | TransportError
        try:
            if call.ops[0].action == "delete":
                result = self.transport.delete_batch(
                    [(str(i), e.handle) for i, (e, _) in enumerate(entries)]
                )
            else:
                result = self.transport.change_visibility_batch(
                    [(str(i), e.handle, seconds) for i, (e, seconds) in enumerate(entries)]
                )
        except TransportError as exc:
            result = exc
        self._answered(call, entries, result)

    def _answered(
        self, call: Call, entries: list[tuple[Entry, int]], outcome: BatchResult | TransportError
    ) -> None:
        """SQS's answer to a delete or return call, or its error."""
        delete = call.ops[0].action == "delete"
        action = "DeleteMessageBatch" if delete else "ChangeMessageVisibilityBatch"
        if isinstance(outcome, TransportError):
            self.observer.request_failed(action, outcome)
        with self._lock:
            now = self.clock.monotonic()
            if isinstance(outcome, TransportError):
                # Not retryable (AccessDenied, a deleted queue): SQS returns them.
                reason = f"{action} was refused: {outcome}"
                self.machine.settle_failed(call, outcome.retryable, reason, now)
            else:
                self.machine.settled(call, _failures(entries, outcome), now)
            commands = self._take()
        if commands:
            self._carry_out(commands)

    def loop_call_ended(
        self, call: Call, entries: list[tuple[Entry, int]], outcome: BatchResult | BaseException
    ) -> None:
        """A call made on the loop (lease_loop.py) ended: fed back as a sender's is."""
        try:
            if isinstance(outcome, IllegalTransition):  # a defect of this driver: loud
                raise outcome
            if isinstance(outcome, BatchResult | TransportError):
                self._answered(call, entries, outcome)
            else:  # something unforeseen, or the loop ended under it: made again
                self._broke(call, TransportError(repr(outcome)))
        finally:  # the call ends all the same
            self._ended(call)

    def _renew(self, call: Call) -> None:
        """Renew what is still ours to renew, decided now that the call goes out."""
        with self._lock:
            by_seconds = self.machine.renewing(call, self.clock.monotonic())
            commands = self._take()
        if commands:
            self._carry_out(commands)
        for seconds, batch in by_seconds.items():
            self._renew_batch(batch, seconds)

    def _renew_batch(self, batch: Sequence[Entry], seconds: int) -> None:
        with self._lock:  # after a call before it, what a claim no longer covers waits
            started = self.clock.monotonic()
            if not (batch := [e for e in batch if e.claimed(seconds, started) == seconds]):
                return
        try:
            result = self.transport.change_visibility_batch(
                [(str(i), e.handle, seconds) for i, e in enumerate(batch)]
            )
        except TransportError as exc:
            self.observer.request_failed("ChangeMessageVisibilityBatch", exc)
            with self._lock:
                now = self.clock.monotonic()
                self.machine.renewal_failed(batch, seconds, started, exc.retryable, now)
            return
        with self._lock:
            now = self.clock.monotonic()
            self.machine.renewed(batch, seconds, started, _failures(batch, result), now)
            commands = self._take()
        if commands:
            self._carry_out(commands)
