"""The lease thread: the one owner of every held message's visibility.

Every SQS write about a held message goes through ``LeaseKeeper``: renewing
leases before they expire (``ChangeMessageVisibilityBatch``), deleting after
success (``DeleteMessageBatch``), and returning messages with a delay after a
failure or at shutdown. One owner means a renewal can never race a delete or a
hand-back on the same receipt handle.

Timing:
- a lease of ``T`` seconds is renewed once half of it has passed; renewals due
  within the next quarter of ``T`` ride along in the same batch call;
- no renewal asks past SQS's 12-hour cap, counted from the start of the receive;
- deletes and returns wait at most ``delete_interval`` to fill a batch of 10;
  hand-backs at shutdown go at once.

The lease thread decides; a few sender threads make the calls, renewals first,
and one more sender makes renewals only, so slow ``DeleteMessageBatch`` calls
never hold up a renewal that is due. While a call about a receipt handle is
under way (the message is *busy*), no other call about it starts: a return can
never overtake the renewal before it. A renewal is checked again when it is
sent: a lease lost meanwhile is not renewed.

A lease runs out at ``expires_at``, counted from the start of the request that
set it (the receive, or the last renewal): SQS's own countdown starts later, so
this is never later than SQS's. Whatever the state, a lease past ``expires_at``
is lost: a handler does not start on it, a delete answered after it is not
reported done (SQS may have handed the message to another consumer, and a
stale handle's delete "succeeds" without deleting), and an entry that keeps
failing is dropped instead of retried.
"""

from __future__ import annotations

import enum
import math
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

from .clock import Clock, Task
from .config import MAX_VISIBILITY
from .errors import LeaseLost, TransportError
from .events import Observer
from .health import Progress
from .message import Message
from .transports import MAX_BATCH, BatchResult, Envelope, Transport, chunks

CAP_MARGIN = 30.0  # never ask for visibility closer than this to the 12-hour cap
NEAR_CAP = 1800.0  # warn once when less than this much of the cap remains
RETRY_AFTER_ERROR = 1.0  # seconds before a failed call's entries are tried again
MAX_SENDERS = 16  # calls to SQS under way at once, at most


class State(enum.Enum):
    WAITING = "waiting"  # received, its handler not started
    RUNNING = "running"
    SETTLING = "settling"  # a delete or a visibility change is queued for it
    DONE = "done"
    LOST = "lost"


class Held:
    """A message this worker holds, and its lease (the ``Lease`` its handler sees)."""

    def __init__(self, keeper: LeaseKeeper, envelope: Envelope, received_at: float, timeout: int):
        self.keeper = keeper
        self.envelope = envelope
        self.received_at = received_at  # when the receive began: the 12-hour cap counts from it
        self.timeout = timeout
        self.expires_at = received_at + timeout
        # The latest SQS may hide the message under this handle: a renewal whose answer
        # was lost may have been applied, so past expires_at, SQS may still hold it.
        self.sqs_until = self.expires_at
        self.renew_at = received_at + timeout / 2
        self.state = State.WAITING
        self.disowned = False  # SQS said this receipt handle no longer owns the message
        self.renewals = 0
        self.near_cap_warned = False
        self.outcome: str | None = None  # "delete" or "return", once one is queued
        self.handed_back = False  # returned at shutdown while held: it may no longer begin
        self.busy = False  # a call about its receipt handle is under way
        self.renewing = False  # a renewal of it is queued or under way
        self.renewal_wanted = False  # extend() asked for a renewal not sent yet
        # Times the worker set it aside (its idempotency key busy elsewhere): a thread whose
        # step fails after that no longer owns it, once another thread took it back.
        self.deferrals = 0
        self.message = Message(envelope, keeper.transport.info.name, self)

    # -- the Lease protocol ------------------------------------------------------

    @property
    def seconds_left(self) -> float:
        if self.lost:
            return 0.0
        return max(0.0, self.expires_at - self.keeper.clock.monotonic())

    @property
    def lost(self) -> bool:
        """Another consumer may have the message: SQS's lease ran out or was given back."""
        return self.state is State.LOST or self.handed_back

    @property
    def may_hold_for(self) -> float:
        """Seconds SQS may still hide the message under this handle, at most: past a lost
        lease too, while a renewal whose answer was lost may have been applied. (An
        idempotency claim outlives this, not only ``seconds_left``.)"""
        if self.disowned or self.state is State.DONE:  # handed back: once SQS answered
            return 0.0
        now = self.keeper.clock.monotonic()
        until = self.sqs_until
        if self.renewing:  # sent at the latest now, asking for ``timeout`` from then
            until = max(until, now + self.timeout)
        return max(0.0, until - now)

    @property
    def gone(self) -> bool:
        """Its delete is queued under a lease still held: it will not come back."""
        return self.outcome == "delete" and self.state is not State.LOST

    def extend(self, seconds: int) -> float:
        return self.keeper.extend(self, seconds)


_LIVE = (State.WAITING, State.RUNNING, State.SETTLING)  # a tuple: `in` tests identity first
_DISOWNED = "the receipt handle no longer owns the message; it may be delivered again"
_LAPSED = "its lease ran out while the delete kept failing; it may be delivered again"


@dataclass(frozen=True)
class Snapshot:
    waiting: int
    running: int
    oldest_received_at: float | None  # monotonic; the 12-hour cap counts from it


@dataclass
class _Call:
    """One batch call for a sender thread: ``ops`` to settle or ``renewals`` to renew."""

    ops: list[_Op] = field(default_factory=list)
    renewals: list[Held] = field(default_factory=list)

    @property
    def held(self) -> list[Held]:
        return [op.held for op in self.ops] + self.renewals


@dataclass
class _Op:
    held: Held
    action: str  # "delete" or "return"
    seconds: int = 0  # for "return": visible again after this long
    reason: str = ""
    queued_at: float = 0.0
    urgent: bool = False
    not_before: float = 0.0


def _full_batches(ops: Sequence[_Op]) -> list[_Op]:
    """Of ``ops``, in order, as many of each action as fill whole batches of 10."""
    full: list[_Op] = []
    for action in ("delete", "return"):
        some = [op for op in ops if op.action == action]
        full += some[: len(some) - len(some) % MAX_BATCH]
    return full


class LeaseKeeper:
    def __init__(
        self,
        transport: Transport,
        clock: Clock,
        observer: Observer,
        *,
        delete_interval: float = 0.2,
        stall_timeout: float = 120.0,
        on_renewed: Callable[[list[Message]], None] | None = None,
        on_released: Callable[[], None] | None = None,
        senders: int = 2,
    ) -> None:
        self.transport = transport
        self.clock = clock
        self.observer = observer
        self.delete_interval = delete_interval
        self.stall_timeout = stall_timeout
        self.progress = Progress(clock)  # read by /healthz
        # Called on this thread after each renewal: the idempotency claims follow the leases.
        self.on_renewed = on_renewed
        # Called on this thread (no lock held) when held messages were settled or lost.
        self.on_released = on_released
        self._lock = threading.Lock()  # guards _held, _ops, every Held's state, _stopping
        # The lease thread, stop() and extend() callers wait on _wake. The senders wait on
        # conditions of their own, so waking the lease thread (once per finished message
        # at times) wakes no sender, and a call queued wakes one sender, not all of them.
        self._wake = threading.Condition(self._lock)
        self._call_ready = threading.Condition(self._lock)  # the general senders
        self._renewal_ready = threading.Condition(self._lock)  # the renewals-only sender
        self._held: dict[str, Held] = {}  # by receipt handle
        self._settling = 0  # of them, SETTLING: changed only through _set_state
        self._expiry_floor = math.inf  # no held lease ends before this
        # No held message is due for renewal before this: a pass of the lease thread
        # scans for renewals only from then on (changed only through _renew_at, add, and
        # the scan that sets it exactly).
        self._renew_floor = math.inf
        # The lease thread waits until then (inf: until woken); -inf while it works.
        self._waiting_until = -math.inf
        self._ops: list[_Op] = []
        self._stopping = False
        self.handed_back_count = 0  # returns at shutdown SQS took: read by the closing line
        self._give_up_at: float | None = None
        self._thread: Task | None = None
        self._finished = False  # the thread has returned
        # For the sender threads: renewals go first, and sender 0 makes nothing else.
        self._renewal_calls: deque[_Call] = deque()
        self._settle_calls: deque[_Call] = deque()
        self._under_way = 0  # calls queued or being made
        # One sender for renewals only, and ``senders`` for every call, renewals first.
        self._senders = [Progress(clock) for _ in range(1 + max(1, min(senders, MAX_SENDERS)))]
        self._senders_alive = 0

    # -- called by the worker's threads -------------------------------------------

    def start(self) -> None:
        self._senders_alive = len(self._senders)
        for index, progress in enumerate(self._senders):
            send = partial(self._send, progress, renewals_only=index == 0)
            self.clock.spawn(f"sqsworker-lease-sender-{index}", send)
        self._thread = self.clock.spawn("sqsworker-lease", self._run)

    def add(self, envelopes: Sequence[Envelope], received_at: float, timeout: int) -> list[Held]:
        held = [Held(self, e, received_at, timeout) for e in envelopes]
        with self._wake:
            for h in held:
                self._held[h.envelope.receipt_handle] = h
            self._expiry_floor = min(self._expiry_floor, received_at + timeout)
            self._renew_floor = min(self._renew_floor, min(h.renew_at for h in held))
            self._wake.notify_all()
        return held

    def begin(self, held: Held) -> bool:
        """Mark a waiting message as running; False if it was lost or handed back meanwhile."""
        with self._wake:
            self._lapse(held, self.clock.monotonic())
            if held.state is not State.WAITING or held.handed_back:
                return False
            held.state = State.RUNNING
            return True

    def still_running(self, held: Held) -> bool:
        """True if ``held`` is running on a lease that has not run out (checked now)."""
        with self._lock:
            self._lapse(held, self.clock.monotonic())
            return held.state is State.RUNNING

    def defer(self, held: Held) -> None:
        """A running message goes back to waiting (its lease still kept), to begin again."""
        with self._lock:
            if held.state is State.RUNNING:
                held.state = State.WAITING

    def succeed(self, held: Held, urgent: bool = False) -> None:
        """Queue the delete (``urgent``: send it now, with whatever else is queued).

        After a lease that ran out here the delete is still tried (nobody may have taken
        the message yet), reported as unsure; after SQS said the handle is gone, not.
        """
        self._queue(held, _Op(held, "delete", urgent=urgent), allow_lost=True)

    def delete_now(self, held: Sequence[Held], timeout: float) -> int:
        """Delete ``held`` at once and wait until SQS answered for each, at most ``timeout``.

        Returns how many deletes are still unanswered (queued, being retried).
        """
        for h in held:
            self.succeed(h, urgent=True)
        return self._answered_within(held, timeout)

    def hand_back_now(self, held: Sequence[Held], timeout: float) -> int:
        """``hand_back`` these, and wait until SQS answered for each, at most ``timeout``.

        Returns how many returns are still unanswered (queued, being retried).
        """
        self.hand_back(held)
        return self._answered_within(held, timeout)

    def _answered_within(self, held: Sequence[Held], timeout: float) -> int:
        deadline = self.clock.monotonic() + timeout
        with self._wake:
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
        with self._wake:
            ready = self._ready(self.clock.monotonic())
            going = _full_batches(ready)
            if not going and not self._under_way:
                going = ready
            if any(not op.urgent for op in going):
                for op in going:
                    op.urgent = True
                self._wake.notify_all()

    def release(self, held: Held, seconds: float, reason: str, urgent: bool = False) -> None:
        """Return the message to the queue, visible again after ``seconds``."""
        self._queue(held, _Op(held, "return", math.ceil(seconds), reason, urgent=urgent))

    def hand_back(self, held: Sequence[Held]) -> None:
        """Make these messages visible again at once (shutdown).

        A handler still running on one is told its lease is lost from now on; one about
        to begin cannot.
        """
        for h in held:
            with self._wake:
                # Marked before its return is queued, in one step with the state read:
                # a begin() in between (a thread that had just taken it) must fail.
                if h.state in (State.WAITING, State.RUNNING):
                    h.handed_back = True
                    self._wake.notify_all()  # an extend() waiting on it raises LeaseLost
            self.release(h, 0, "shutdown", urgent=True)

    def running(self) -> list[Held]:
        with self._lock:
            return [h for h in self._held.values() if h.state is State.RUNNING]

    def unsettled(self) -> list[Held]:
        """Held messages not yet settled: running, or taken to run and not yet begun."""
        with self._lock:
            return [h for h in self._held.values() if h.state in (State.WAITING, State.RUNNING)]

    def held_count(self) -> int:
        with self._lock:
            return len(self._held)

    def settling_count(self) -> int:
        """Held messages through their handler, their delete or return not yet answered."""
        return self._settling  # one int, read whole: no lock needed

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
            held = list(self._held.values())
        states = [h.state for h in held]
        return Snapshot(
            waiting=states.count(State.WAITING),
            running=states.count(State.RUNNING),
            oldest_received_at=min((h.received_at for h in held), default=None),
        )

    def extend(self, held: Held, seconds: int) -> float:
        if not 1 <= seconds <= MAX_VISIBILITY:
            raise ValueError("a lease can be extended by 1 to 43200 seconds")
        with self._wake:
            self._lapse(held, self.clock.monotonic())
            if held.lost:
                raise LeaseLost(f"the lease of message {held.envelope.message_id} was lost")
            target = held.renewals + 1
            held.timeout = seconds
            if held.renew_at < math.inf:  # at the cap no renewal will come: answer at once
                self._renew_at(held, -math.inf)
                held.renewal_wanted = True  # a renewal under way now does not count
            self._wake.notify_all()
            # Until renewed, lost, settled, at the cap, or past the lease: never longer.
            while (
                held.renewals < target
                and not held.handed_back
                and held.state in (State.WAITING, State.RUNNING)
                and held.renew_at < math.inf
            ):
                now = self.clock.monotonic()
                if now >= held.expires_at:
                    self._lapse(held, now)
                    break
                self.clock.wait(self._wake, held.expires_at)
            if held.lost:  # set by the lease thread while this one waited
                raise LeaseLost(f"the lease of message {held.envelope.message_id} was lost")
        return held.seconds_left

    def stop(self, give_up_after: float) -> int:
        """Flush what is queued, then end the thread. Returns how many ops stayed unsent."""
        with self._wake:
            self._stopping = True
            self._give_up_at = self.clock.monotonic() + give_up_after
            for op in self._ops:
                op.urgent = True
            self._wake.notify_all()
            while self._thread is not None and (not self._finished or self._senders_alive):
                self.clock.wait(self._wake, None)
            return len(self._ops)

    def _queue(self, held: Held, op: _Op, allow_lost: bool = False) -> None:
        with self._wake:
            if held.state in (State.SETTLING, State.DONE):
                return  # settled already (e.g. handed back at a shutdown timeout)
            # The whole process may have been paused past the lease (a stop, a long GC
            # pause), and the handler finished before the lease thread noticed: never
            # report such a message done.
            self._lapse(held, self.clock.monotonic())
            if held.state is State.LOST and (not allow_lost or held.disowned):
                if op.action == "delete":
                    self.observer.delete_failed(held.message, _DISOWNED, False)
                return  # SQS returns it by itself (a delete now would change nothing)
            if held.state is not State.LOST:
                self._set_state(held, State.SETTLING)
            held.outcome = op.action
            op.queued_at = self.clock.monotonic()
            op.urgent = op.urgent or self._stopping  # a stop sends all it can
            self._ops.append(op)
            # Wake the lease thread only if it waits past this op's moment (an op on a
            # busy message goes when that call's answer wakes it) or a batch is full.
            due = op.not_before if op.urgent else max(op.not_before, self._send_by(op))
            if (not held.busy and due < self._waiting_until) or len(self._ops) % MAX_BATCH == 0:
                self._wake.notify_all()

    # -- the thread ----------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            with self._wake:
                self._finished = True  # the senders end once the calls under way are made
                self._wake.notify_all()
                self._call_ready.notify_all()
                self._renewal_ready.notify_all()

    def _loop(self) -> None:
        while True:
            with self._wake:
                now = self.clock.monotonic()
                if self._gave_up(now):  # nothing new: the answers under way, then the end
                    if not self._under_way:
                        return
                    self.progress.idle()
                    self.clock.wait(self._wake, None)
                    continue
                lapsed = self._expire(now)
                ops, renewals = self._due(now)
                if ops or renewals:
                    self._hand_out(ops, renewals)
                elif not lapsed:
                    if self._stopping and not self._under_way and not self._ops:
                        return
                    self.progress.idle()
                    deadline = self._next_deadline(now)
                    self._waiting_until = math.inf if deadline is None else deadline
                    self.clock.wait(self._wake, deadline)
                    self._waiting_until = -math.inf
                    self.progress.step(self.stall_timeout)
            if lapsed and self.on_released is not None:
                self.on_released()  # room for more messages under the held bound

    def _hand_out(self, ops: list[_Op], renewals: list[Held]) -> None:
        """Queue the batch calls for the senders; their messages are busy until answered."""
        settles = [
            _Call(ops=list(batch))
            for action in ("delete", "return")
            for batch in chunks([op for op in ops if op.action == action])
        ]
        renews = [_Call(renewals=list(batch)) for batch in chunks(renewals)]
        for held in renewals:
            held.renewing = True
        for call in settles + renews:
            for held in call.held:
                held.busy = True
        self._settle_calls.extend(settles)
        self._renewal_calls.extend(renews)
        self._under_way += len(settles) + len(renews)
        if renews:
            self._renewal_ready.notify()
        self._call_ready.notify(len(settles) + len(renews))  # they take renewals first too

    def _send(self, progress: Progress, renewals_only: bool) -> None:
        """A sender thread: make the calls the lease thread queued, one at a time."""
        try:
            while True:
                ready = self._renewal_ready if renewals_only else self._call_ready
                with self._wake:
                    while not self._finished and not (
                        self._renewal_calls or (self._settle_calls and not renewals_only)
                    ):
                        progress.idle()
                        self.clock.wait(ready, None)
                    if self._renewal_calls:
                        call = self._renewal_calls.popleft()
                    elif self._settle_calls and not renewals_only:
                        call = self._settle_calls.popleft()
                    else:
                        return  # the lease thread ended and nothing is left for this one
                progress.step(self.stall_timeout)
                self._make(call)
                progress.idle()
        finally:
            with self._wake:
                self._senders_alive -= 1
                self._wake.notify_all()

    def _make(self, call: _Call) -> None:
        try:
            if call.ops:
                self._settle(call.ops)
            else:
                self._renew(call.renewals)
        except Exception as exc:  # never let a sender die: every lease hangs on them
            self.observer.request_failed("lease sender", TransportError(repr(exc)))
            with self._lock:
                unsettled = [
                    op for op in call.ops if op.held.state is not State.DONE and op not in self._ops
                ]
            self._retry(unsettled)
            with self._lock:
                for held in call.renewals:
                    self._renew_at(held, self.clock.monotonic() + RETRY_AFTER_ERROR)
        finally:
            with self._wake:
                for held in call.held:
                    held.busy = False
                for held in call.renewals:
                    held.renewing = False
                self._under_way -= 1
                self._wake.notify_all()  # the lease thread, and extend() callers waiting
        dropped = any(h.state is State.LOST for h in call.renewals)
        if (call.ops or dropped) and self.on_released is not None:
            self.on_released()  # room for more messages under the held bound

    def _gave_up(self, now: float) -> bool:
        return self._give_up_at is not None and now >= self._give_up_at

    def _expire(self, now: float) -> bool:
        """Leases that ran out without a renewal are lost (a stalled thread, a failing SQS)."""
        if now < self._expiry_floor:
            return False
        lapsed = sum(self._lapse(held, now) for held in list(self._held.values())) > 0
        self._expiry_floor = min(
            (h.expires_at for h in self._held.values() if h.state in _LIVE), default=math.inf
        )
        return lapsed

    def _lapse(self, held: Held, now: float) -> bool:
        """Lose a held message's lease if it ran out unrenewed, a queued delete's too."""
        if held.state in _LIVE and now >= held.expires_at:
            self._lose(held, "the lease expired before it could be renewed")
            return True
        return False

    def _renew_at(self, held: Held, moment: float) -> None:
        """Every change of a held message's renewal moment goes through here (the lock
        held), so ``_renew_floor`` stays at or below each of them."""
        held.renew_at = moment
        self._renew_floor = min(self._renew_floor, moment)

    def _set_state(self, held: Held, state: State) -> None:
        """Every change into or out of SETTLING goes through here (the lock held), so
        ``settling_count`` is a counter, not a scan of every held message."""
        self._settling += (state is State.SETTLING) - (held.state is State.SETTLING)
        held.state = state

    def _lose(self, held: Held, reason: str, disowned: bool = False) -> None:
        self._set_state(held, State.LOST)
        held.disowned = held.disowned or disowned
        self._held.pop(held.envelope.receipt_handle, None)
        self.observer.lease_lost(held.message, reason)
        self._wake.notify_all()  # an extend() waiting on this lease returns

    def _due(self, now: float) -> tuple[list[_Op], list[Held]]:
        self._prune()
        ready = self._ready(now)
        if any(op.urgent or self._send_by(op) <= now for op in ready):
            ops = []
            for action in ("delete", "return"):
                some = [op for op in ready if op.action == action]
                # Beyond full batches, the newest that may wait wait to fill theirs (once
                # stopping, none may: every op is urgent then).
                extra = len(some) % MAX_BATCH if len(some) > MAX_BATCH else 0
                if extra and not any(op.urgent or self._send_by(op) <= now for op in some[-extra:]):
                    some = some[:-extra]
                ops += some
        else:  # full batches only: the rest wait to fill theirs
            ops = _full_batches(ready)
        if ops:
            sent = {id(op) for op in ops}
            self._ops = [op for op in self._ops if id(op) not in sent]
        renewals: list[Held] = []
        if now >= self._renew_floor:
            renewable = self._renewable(settling_now=ops)
            if any(h.renew_at <= now for h in renewable):
                renewals = [h for h in renewable if h.renew_at <= now + h.timeout / 4]
            # Exactly, over every held message that may be renewed later (a busy one
            # too: its call's answer makes it renewable without a new moment).
            self._renew_floor = min(
                (h.renew_at for h in self._held.values() if h.state in _LIVE), default=math.inf
            )
        return ops, renewals

    def _ready(self, now: float) -> list[_Op]:
        """The queued ops that may go now, the oldest first (a retried op is queued again
        at the end)."""
        ready = [op for op in self._ops if op.not_before <= now and not op.held.busy]
        return sorted(ready, key=lambda op: op.queued_at)

    def _send_by(self, op: _Op) -> float:
        """When a queued op goes at the latest: ``delete_interval`` after it was queued, or
        when its lease would be renewed, if sooner (a return's lease is not renewed, so
        waiting longer to fill a batch could let it run out first); at the 12-hour cap,
        where no renewal comes, half a timeout before the lease ends."""
        held = op.held
        return min(
            op.queued_at + self.delete_interval, held.renew_at, held.expires_at - held.timeout / 2
        )

    def _prune(self) -> None:
        """Drop queued ops that can no longer help: a lost lease's return (SQS returns the
        message by itself), and any op on a handle SQS said is gone."""
        keep: list[_Op] = []
        for op in self._ops:
            if op.held.state is not State.LOST or (op.action == "delete" and not op.held.disowned):
                keep.append(op)
            elif op.action == "delete":
                self.observer.delete_failed(op.held.message, _DISOWNED, False)
        self._ops = keep

    def _renewable(self, settling_now: Sequence[_Op] = ()) -> list[Held]:
        """Held messages whose lease is ours to renew: not lost, not at the cap, not returning.

        A queued delete's lease is renewed until the delete is sent, not in the pass
        that sends it (its handle may be gone by the time a renewal went).
        """
        skip = {id(op.held) for op in self._ops if op.action == "return"}
        skip |= {id(op.held) for op in settling_now}
        return [
            h
            for h in self._held.values()
            if id(h) not in skip and h.state in _LIVE and h.renew_at < math.inf and not h.busy
        ]

    def _next_deadline(self, now: float) -> float | None:
        """The earliest moment ``_due`` or ``_expire`` can find work: exactly their rules."""
        deadlines = [  # a busy message's op waits for its call's answer, which wakes this
            op.not_before if op.urgent else max(op.not_before, self._send_by(op))
            for op in self._ops
            if not op.held.busy
        ]
        if self._renew_floor > now:
            deadlines.append(self._renew_floor)  # none is due before: wake then, look
        else:
            deadlines += [h.renew_at for h in self._renewable()]
        deadlines.append(self._expiry_floor)
        if self._give_up_at is not None:
            deadlines.append(self._give_up_at)
        deadline = min(deadlines)
        return deadline if deadline < math.inf else None

    # -- SQS calls, made outside the lock --------------------------------------------

    def _settle(self, batch: list[_Op]) -> None:
        """One batch of deletes, or of returns."""
        if batch[0].action == "delete":
            self._call(
                "DeleteMessageBatch",
                batch,
                lambda b: self.transport.delete_batch(
                    [(str(i), op.held.envelope.receipt_handle) for i, op in enumerate(b)]
                ),
            )
        else:
            self._call(
                "ChangeMessageVisibilityBatch",
                batch,
                lambda b: self.transport.change_visibility_batch(
                    [
                        (str(i), op.held.envelope.receipt_handle, self._capped(op.held, op.seconds))
                        for i, op in enumerate(b)
                    ]
                ),
            )

    def _call(
        self, action: str, batch: Sequence[_Op], send: Callable[[Sequence[_Op]], BatchResult]
    ) -> None:
        try:
            result = send(batch)
        except TransportError as exc:
            self.observer.request_failed(action, exc)
            if exc.retryable:
                self._retry(batch)
            else:  # retrying cannot help (AccessDenied, a deleted queue): SQS returns them
                self._give_up(batch, f"{action} was refused: {exc}")
            return
        failures = {f.id: f for f in result.failed}
        done: list[_Op] = []
        retry: list[_Op] = []
        with self._wake:
            answered = self.clock.monotonic()
            for index, op in enumerate(batch):
                # Answered after the lease ran out: SQS may have handed the message to
                # another consumer first, so a "successful" delete proves nothing.
                failure = failures.get(str(index))
                if failure is not None and failure.lease_lost:
                    op.held.disowned = True
                self._lapse(op.held, answered)
                if failure is None:
                    done.append(op)
                    if op.held.state is not State.LOST:
                        self._set_state(op.held, State.DONE)
                    self._held.pop(op.held.envelope.receipt_handle, None)
                elif failure.lease_lost:
                    if op.held.state is not State.LOST:
                        self._lose(op.held, f"{failure.code}: {failure.message}", disowned=True)
                    if op.action == "delete":
                        self.observer.delete_failed(op.held.message, _DISOWNED, False)
                else:
                    lapsed = op.held.state is State.LOST
                    if not lapsed:
                        retry.append(op)
                    if op.action == "delete":
                        self.observer.delete_failed(
                            op.held.message, f"{failure.code}: {failure.message}", not lapsed
                        )
        if retry:
            self._retry(retry)
        confirmed: list[Message] = []
        for op in done:
            if op.action != "delete":
                continue
            if op.held.state is State.LOST:  # not a hand-back the delete overtook
                self.observer.deleted_after_lease_lost(op.held.message)
            else:
                confirmed.append(op.held.message)
        if confirmed:
            self.observer.deleted(confirmed)
        by_reason: dict[tuple[int, str], list[Message]] = {}
        for op in done:
            if op.action == "return":
                by_reason.setdefault((op.seconds, op.reason), []).append(op.held.message)
        for (seconds, reason), messages in by_reason.items():
            if reason == "shutdown":
                self.handed_back_count += len(messages)
            self.observer.returned(messages, seconds, reason)

    def _retry(self, ops: Sequence[_Op]) -> None:
        """Try again in a second, while the lease lasts: a lost one is SQS's to return."""
        with self._wake:
            now = self.clock.monotonic()
            for op in ops:
                self._lapse(op.held, now)
                if op.held.state is State.LOST:
                    if op.action == "delete":  # handled, and it may be delivered again
                        self.observer.delete_failed(op.held.message, _LAPSED, False)
                    continue
                op.not_before = now + RETRY_AFTER_ERROR
                op.urgent = op.urgent or self._stopping  # a stop sends all it can
                self._ops.append(op)

    def _give_up(self, ops: Sequence[_Op], reason: str) -> None:
        with self._wake:
            for op in ops:
                if op.held.state is not State.LOST:
                    self._lose(op.held, reason)
                if op.action == "delete":
                    self.observer.delete_failed(op.held.message, reason, False)

    def _capped(self, held: Held, seconds: int) -> int:
        """``seconds`` cut so the total stays inside the 12-hour cap."""
        budget = MAX_VISIBILITY - (self.clock.monotonic() - held.received_at) - CAP_MARGIN
        return max(0, min(seconds, math.floor(budget)))

    def _renew(self, renewals: list[Held]) -> None:
        """Renew what is still ours to renew, decided now that the call goes out."""
        by_seconds: dict[int, list[Held]] = {}
        with self._wake:
            now = self.clock.monotonic()
            for held in renewals:
                self._lapse(held, now)
                if held.state not in _LIVE or held.handed_back:
                    continue  # lost, settled or handed back while the call waited
                held.renewal_wanted = False  # this renewal carries what extend() asked
                seconds = self._capped(held, held.timeout)
                budget = MAX_VISIBILITY - (now - held.received_at)
                if budget < NEAR_CAP and not held.near_cap_warned:
                    held.near_cap_warned = True
                    self.observer.lease_near_cap(held.message, budget)
                if seconds < 1:
                    self._renew_at(held, math.inf)  # at the cap: it will expire and come back
                    self._wake.notify_all()  # an extend() waiting for a renewal returns
                    continue
                by_seconds.setdefault(seconds, []).append(held)
        for seconds, batch in by_seconds.items():
            self._renew_batch(batch, seconds)

    def _renew_batch(self, batch: Sequence[Held], seconds: int) -> None:
        started = self.clock.monotonic()
        try:
            result = self.transport.change_visibility_batch(
                [(str(i), h.envelope.receipt_handle, seconds) for i, h in enumerate(batch)]
            )
        except TransportError as exc:
            self.observer.request_failed("ChangeMessageVisibilityBatch", exc)
            with self._lock:
                failed_at = self.clock.monotonic()
                for held in batch:
                    self._renew_at(held, started + RETRY_AFTER_ERROR)
                    if exc.retryable:  # SQS may have acted before the answer was lost
                        held.sqs_until = max(held.sqs_until, failed_at + seconds)
            return
        failures = {f.id: f for f in result.failed}
        extended: list[Message] = []
        with self._wake:
            answered = self.clock.monotonic()
            for index, held in enumerate(batch):
                failure = failures.get(str(index))
                if failure is None:  # SQS hides it until then at the latest, lost here or not
                    held.sqs_until = max(held.sqs_until, answered + seconds)
                elif failure.lease_lost:
                    held.disowned = True  # even if its lease ran out here meanwhile
                self._lapse(held, answered)
                if held.state not in _LIVE:
                    continue
                if failure is None:
                    held.expires_at = started + seconds  # earlier, after extend() to less
                    self._expiry_floor = min(self._expiry_floor, held.expires_at)
                    self._renew_at(held, started + seconds / 2)
                    if held.renewal_wanted:  # extend() asked after this call went: again
                        self._renew_at(held, -math.inf)
                    else:
                        held.renewals += 1
                    extended.append(held.message)
                elif failure.lease_lost:
                    self._lose(held, f"{failure.code}: {failure.message}", disowned=True)
                elif failure.past_cap:
                    self._renew_at(held, math.inf)  # SQS says the cap is reached: it will come back
                    self.observer.lease_near_cap(held.message, held.seconds_left)
                    self._wake.notify_all()
                else:
                    self._renew_at(held, started + RETRY_AFTER_ERROR)
        if extended:
            self.observer.leases_extended(extended, seconds)
            if self.on_renewed is not None:
                self.on_renewed(extended)
