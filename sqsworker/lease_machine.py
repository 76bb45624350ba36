"""The lease decisions as a state machine: events and the time in, commands out.

``LeaseMachine`` holds the lease of every message a worker holds and decides
every SQS write about them: when to renew and for how long, when a queued
delete or return goes and with which others, when a lease is lost. It has no
threads, no transport and no clock: each event takes the time as an argument,
and its answers are plain values. ``lease.LeaseKeeper`` drives it: it feeds the
events under one lock, carries the calls out on its sender threads, feeds the
answers back, and hands the reports to the observer.

Each held message is an ``Entry`` whose state changes only by the table in
``lease_state`` (an event it does not allow raises ``IllegalTransition``).

Timing:
- a lease of ``T`` seconds is renewed once half of it has passed; renewals due
  within the next quarter of ``T`` ride along in the same batch call;
- no renewal asks past SQS's 12-hour cap, counted from the start of the receive;
- deletes and returns wait at most ``delete_interval`` to fill a batch of 10,
  less when the lease would otherwise run out first; urgent ones go at once;
- a failed entry is tried again a second later while its lease lasts, sooner when
  the lease is short or nearly over (``retry_after``);
- a message holding an idempotency claim is renewed only as far as the claim
  covers (``Entry.claim_until``): the claim leads, and while it falls behind a
  renewal asks less, or waits once it would gain nothing.

A lease runs out at ``expires_at``, counted from the start of the request that
set it (the receive, or the last renewal): SQS's own countdown starts later, so
this is never later than SQS's. Whatever the state, a lease past ``expires_at``
is lost: it does not begin, a delete answered after it is not reported done,
and an entry that keeps failing is dropped instead of retried.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TypeVar

from .config import MAX_VISIBILITY
from .lease_state import (
    LIVE,
    TRANSITIONS,
    Call,
    Command,
    D,
    Deleted,
    DeletedAfterLeaseLost,
    DeleteFailed,
    Entry,
    Event,
    Extended,
    IllegalTransition,
    L,
    LeaseLost,
    NearCap,
    Op,
    R,
    Returned,
    Room,
    S,
    State,
    W,
    next_state,
)
from .transports import MAX_BATCH, EntryFailure, chunks

E = TypeVar("E", bound=Entry)  # an entry, or what the keeper makes of one (``Held``)

CAP_MARGIN = 30.0  # never ask for visibility closer than this to the 12-hour cap
NEAR_CAP = 1800.0  # warn once when less than this much of the cap remains
RETRY_AFTER_ERROR = 1.0  # seconds before a failed call's entries are tried again, at most

DISOWNED = "the receipt handle no longer owns the message; it may be delivered again"
LAPSED = "its lease ran out while the delete kept failing; it may be delivered again"
EXPIRED = "the lease expired before it could be renewed"


def full_batches(ops: Sequence[Op]) -> list[Op]:
    """Of ``ops``, in order, as many of each action as fill whole batches of 10."""
    full: list[Op] = []
    for action in ("delete", "return"):
        some = [op for op in ops if op.action == action]
        full += some[: len(some) - len(some) % MAX_BATCH]
    return full


def retry_after(entry: Entry, now: float) -> float:
    """Seconds before a failed call's entry is tried again: a second, an eighth of its
    timeout (a 2 s lease renewed at 1 s has a second left), or half the lease left at
    ``now`` (after extend() to more, a 2 s lease keeps 2 s until renewed), the least."""
    left = max(0.0, entry.expires_at - now)
    return min(RETRY_AFTER_ERROR, entry.timeout / 8, left / 2)


def capped(entry: Entry, seconds: int, now: float) -> int:
    """``seconds`` cut so the total stays inside the 12-hour cap."""
    budget = MAX_VISIBILITY - (now - entry.received_at) - CAP_MARGIN
    return max(0, min(seconds, math.floor(budget)))


class LeaseMachine:
    def __init__(self, delete_interval: float = 0.2) -> None:
        self.delete_interval = delete_interval
        self.held: dict[str, Entry] = {}  # by receipt handle: every live entry
        self.settling = 0  # of them, SETTLING: changed only through _move
        self.ops: list[Op] = []  # queued deletes and returns
        self.stopping = False
        self.give_up_at: float | None = None
        self.under_way = 0  # calls handed out and not ended
        self.handed_back_count = 0  # returns at shutdown SQS took
        self._expiry_floor = math.inf  # no held lease ends before this
        # No held message is due for renewal before this, so ``due`` scans only from then
        # (changed only by _renew_at, received, and the scan that sets it exactly).
        self._renew_floor = math.inf
        self.out: list[Command] = []  # the commands not taken yet (see ``take``)
        # Set when a lease was lost or can be renewed no more: whoever waits on one
        # (extend(), delete_now()) should look again.
        self.woke = False

    def take(self) -> Sequence[Command]:
        """The commands the events since the last take gave, in order."""
        if not self.out:
            return ()
        out, self.out = self.out, []
        return out

    # -- events from the worker's threads --------------------------------------------

    def received(self, entries: Sequence[E]) -> list[E]:
        """Hold a receive's messages; those held, in order. A receipt handle held already
        (or named twice in one answer: a replayed answer) is no delivery, as SQS gives a
        redelivery a new handle: it is left out, lest its handler run twice on one lease."""
        held = self.held
        taken: list[E] = []
        for entry in entries:
            if entry.handle not in held:
                held[entry.handle] = entry
                taken.append(entry)
        if taken:
            self._expiry_floor = min(self._expiry_floor, *(e.expires_at for e in taken))
            self._renew_floor = min(self._renew_floor, *(e.renew_at for e in taken))
        return taken

    def begin(self, entry: Entry, now: float) -> bool:
        """Its handler starts; False if it was lost, settled or handed back meanwhile."""
        self._lapse(entry, now)
        if entry.handed_back and entry.state is W:
            return False
        return self._move(entry, Event.BEGIN) is R

    def still_running(self, entry: Entry, now: float) -> bool:
        self._lapse(entry, now)
        return entry.state is R

    def defer(self, entry: Entry) -> None:
        self._move(entry, Event.DEFER)

    def hand_back(self, entry: Entry) -> bool:
        """Mark a message given back at shutdown; True if it was held unsettled."""
        if entry.state in (W, R):
            entry.handed_back = True
            return True
        return False

    def settle(self, op: Op, now: float, allow_lost: bool = False) -> float:
        """Queue a delete or a return. Returns the moment the lease thread must look by
        (-inf: a batch is full; inf: nothing to look at before a call's answer).

        After a lease that ran out here a delete (``allow_lost``) is still tried (nobody
        may have taken the message yet), reported as unsure; after SQS said the handle
        is gone, not.
        """
        entry = op.entry
        if entry.state in (S, D):
            self._move(entry, Event.SETTLE)
            return math.inf
        # The whole process may have been paused past the lease (a stop, a long GC
        # pause), and the handler finished before the lease thread noticed: never
        # report such a message done.
        self._lapse(entry, now)
        if entry.state is L and (not allow_lost or entry.disowned):
            if op.action == "delete":
                self.out.append(DeleteFailed(entry, DISOWNED, False))
            return math.inf  # SQS returns it by itself (a delete now would change nothing)
        self._move(entry, Event.SETTLE)
        entry.outcome = op.action
        op.queued_at = now
        op.urgent = op.urgent or self.stopping  # a stop sends all it can
        self.ops.append(op)
        # A call's worth of its action queued (deletes and returns go in calls apart).
        alike = sum(o.action == op.action for o in self.ops) if len(self.ops) >= MAX_BATCH else 1
        if alike % MAX_BATCH == 0:
            return -math.inf
        if entry.busy:  # it goes when that call's answer wakes the lease thread
            return math.inf
        return op.not_before if op.urgent else max(op.not_before, self._send_by(op))

    def flush(self, now: float) -> bool:
        """Make the queued ops that can go now in full batches urgent, the oldest first;
        fewer than a batch only when no full one is queued and no call is under way.
        True if any was not urgent yet."""
        ready = self._ready(now)
        going = full_batches(ready)
        if not going and not self.under_way:
            going = ready
        if any(not op.urgent for op in going):
            for op in going:
                op.urgent = True
            return True
        return False

    def extend(self, entry: Entry, seconds: int, now: float) -> int | None:
        """Ask for a renewal of ``seconds`` now and at each later one. Returns the count of
        renewals to wait for (see ``extend_wait``), None if the lease is lost."""
        if not 1 <= seconds <= MAX_VISIBILITY:
            raise ValueError("a lease can be extended by 1 to 43200 seconds")
        self._lapse(entry, now)
        if entry.lost:
            return None
        entry.timeout = seconds
        if entry.renew_at < math.inf:  # at the cap no renewal will come: answer at once
            self._renew_at(entry, -math.inf)
            entry.renewal_wanted = True  # a renewal under way now does not count
        return entry.renewals + 1

    def extend_wait(self, entry: Entry, target: int, now: float) -> float | None:
        """Until when an ``extend`` waits at most; None once renewed, lost, settled, at
        the cap, or past the lease."""
        if (
            entry.renewals < target
            and not entry.handed_back
            and entry.state in (W, R)
            and entry.renew_at < math.inf
        ) and not self._lapse(entry, now):
            return entry.expires_at
        return None

    def stop(self, now: float, give_up_after: float) -> None:
        """Send all that is queued at once; after ``give_up_after`` send nothing more."""
        self.stopping = True
        self.give_up_at = now + give_up_after
        for op in self.ops:
            op.urgent = True

    # -- time passing: the lease thread's pass ---------------------------------------

    def gave_up(self, now: float) -> bool:
        return self.give_up_at is not None and now >= self.give_up_at

    def drained(self) -> bool:
        """Stopping, with nothing queued and no call under way: the lease thread may end."""
        return self.stopping and not self.under_way and not self.ops

    def expire(self, now: float) -> bool:
        """Leases that ran out without a renewal are lost (a stalled thread, a failing SQS)."""
        if now < self._expiry_floor:
            return False
        lapsed = sum(self._lapse(entry, now) for entry in list(self.held.values())) > 0
        self._expiry_floor = min(
            (e.expires_at for e in self.held.values() if e.state in LIVE), default=math.inf
        )
        if lapsed:
            self.out.append(Room())
        return lapsed

    def due(self, now: float) -> list[Call]:
        """The calls to make now: deletes, returns, renewals, each up to 10 to a call.
        Their messages are busy until each call ``ended``."""
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
            ops = full_batches(ready)
        if ops:
            sent = {id(op) for op in ops}
            self.ops = [op for op in self.ops if id(op) not in sent]
        renewals: list[Entry] = []
        if now >= self._renew_floor:
            renewable = self._renewable(now, settling_now=ops)
            if any(e.renew_at <= now for e in renewable):
                renewals = [e for e in renewable if e.renew_at <= now + e.timeout / 4]
            # Exactly, over every held message that may be renewed later (a busy one
            # too: its call's answer makes it renewable without a new moment).
            self._renew_floor = min(
                (e.renew_at for e in self.held.values() if e.state in LIVE), default=math.inf
            )
        calls = [
            Call(ops=list(batch))
            for action in ("delete", "return")
            for batch in chunks([op for op in ops if op.action == action])
        ]
        calls += [Call(renewals=list(batch)) for batch in chunks(renewals)]
        for entry in renewals:
            entry.renewing = True
        for call in calls:
            for entry in call.entries:
                entry.busy = True
        self.under_way += len(calls)
        return calls

    def next_deadline(self, now: float) -> float | None:
        """The earliest moment ``due`` or ``expire`` can find work: exactly their rules."""
        deadlines = [  # a busy message's op waits for its call's answer, which wakes this
            op.not_before if op.urgent else max(op.not_before, self._send_by(op))
            for op in self.ops
            if not op.entry.busy
        ]
        if self._renew_floor > now:
            deadlines.append(self._renew_floor)  # none is due before: wake then, look
        else:
            deadlines += [e.renew_at for e in self._renewable(now)]
        deadlines.append(self._expiry_floor)
        if self.give_up_at is not None:
            deadlines.append(self.give_up_at)
        deadline = min(deadlines)
        return deadline if deadline < math.inf else None

    # -- a call goes out, and is answered ---------------------------------------------

    def sending(self, call: Call, now: float) -> list[tuple[Entry, int]]:
        """A delete or return call goes out now: each entry, and for a return its delay
        (cut to the 12-hour cap)."""
        self._mark_sent(call)
        return [(op.entry, capped(op.entry, op.seconds, now)) for op in call.ops]

    def renewing(self, call: Call, now: float) -> dict[int, list[Entry]]:
        """A renewal call goes out now: what is still ours to renew, by the seconds to ask
        for (one batch call each). A lease lost, settled or handed back meanwhile is not
        renewed; one at the 12-hour cap is renewed no more."""
        self._mark_sent(call)
        by_seconds: dict[int, list[Entry]] = {}
        for entry in call.renewals:
            self._lapse(entry, now)
            if entry.state not in LIVE or entry.handed_back or not entry.covered(now):
                continue  # lost, settled, handed back, or its claim fell behind meanwhile
            seconds = capped(entry, entry.timeout, now)
            budget = MAX_VISIBILITY - (now - entry.received_at)
            if budget < NEAR_CAP and not entry.near_cap_warned:
                entry.near_cap_warned = True
                self.out.append(NearCap(entry, budget))
            if seconds < 1:
                self._renew_at(entry, math.inf)  # at the cap: it will expire and come back
                self.woke = True  # an extend() waiting for a renewal returns
                continue
            asked = entry.claimed(seconds, now)  # less while its claim falls behind
            if asked == seconds:
                entry.renewal_wanted = False  # this renewal carries what extend() asked
            by_seconds.setdefault(asked, []).append(entry)
        return by_seconds

    def settled(self, call: Call, failures: Mapping[int, EntryFailure], now: float) -> None:
        """SQS answered a delete or return call: ``failures`` by the entry's index."""
        self._check_answer(call)
        done: list[Op] = []
        retry: list[Op] = []
        for index, op in enumerate(call.ops):
            entry = op.entry
            # Answered after the lease ran out: SQS may have handed the message to
            # another consumer first, so a "successful" delete proves nothing.
            failure = failures.get(index)
            if failure is not None and failure.lease_lost:
                entry.disowned = True
            self._lapse(entry, now)
            if failure is None:
                done.append(op)
                self._move(entry, Event.CONFIRM)
                self.held.pop(entry.handle, None)
            elif failure.lease_lost:
                self._lose(entry, Event.GONE, f"{failure.code}: {failure.message}")
                if op.action == "delete":
                    self.out.append(DeleteFailed(entry, DISOWNED, False))
            else:
                lapsed = entry.state is L
                if not lapsed:
                    retry.append(op)
                if op.action == "delete":
                    reason = f"{failure.code}: {failure.message}"
                    self.out.append(DeleteFailed(entry, reason, not lapsed))
        self._retry(retry, now)
        confirmed: list[Entry] = []
        for op in done:
            if op.action != "delete":
                continue
            if op.entry.state is L:  # not a hand-back the delete overtook
                self.out.append(DeletedAfterLeaseLost(op.entry))
            else:
                confirmed.append(op.entry)
        if confirmed:
            self.out.append(Deleted(confirmed))
        by_reason: dict[tuple[int, str], list[Entry]] = {}
        for op in done:
            if op.action == "return":
                by_reason.setdefault((op.seconds, op.reason), []).append(op.entry)
        for (seconds, reason), entries in by_reason.items():
            if reason == "shutdown":
                self.handed_back_count += len(entries)
            self.out.append(Returned(entries, seconds, reason))

    def settle_failed(self, call: Call, retryable: bool, reason: str, now: float) -> None:
        """A delete or return call failed whole: tried again in a second while the lease
        lasts, or (not ``retryable``: AccessDenied, a deleted queue) given up, SQS
        returning the messages by itself."""
        self._check_answer(call)
        if retryable:
            self._retry(call.ops, now)
            return
        for op in call.ops:
            self._lose(op.entry, Event.REFUSED, reason)
            if op.action == "delete":
                self.out.append(DeleteFailed(op.entry, reason, False))

    def renewed(
        self,
        batch: Sequence[Entry],
        seconds: int,
        started: float,
        failures: Mapping[int, EntryFailure],
        now: float,
    ) -> None:
        """SQS answered one renewal batch (asked at ``started``), ``failures`` by index."""
        extended: list[Entry] = []
        for index, entry in enumerate(batch):
            failure = failures.get(index)
            # SQS hides it until then at the latest, lost here or not; so it may when the
            # answer did not name the entry (SQS may have acted, as with a lost answer).
            if failure is None or failure.unanswered:
                entry.sqs_until = max(entry.sqs_until, now + seconds)
            elif failure.lease_lost:
                entry.disowned = True  # even if its lease ran out here meanwhile
            self._lapse(entry, now)
            if entry.state not in LIVE:
                continue
            if failure is None:
                entry.expires_at = started + seconds  # earlier, after extend() to less
                self._expiry_floor = min(self._expiry_floor, entry.expires_at)
                self._renew_at(entry, started + seconds / 2)
                if entry.renewal_wanted:  # extend() asked after this call went: again
                    self._renew_at(entry, -math.inf)
                else:
                    entry.renewals += 1
                extended.append(entry)
            elif failure.lease_lost:
                self._lose(entry, Event.GONE, f"{failure.code}: {failure.message}")
            elif failure.past_cap:
                self._renew_at(entry, math.inf)  # SQS says the cap is reached: it comes back
                self.out.append(NearCap(entry, entry.left(now)))
                self.woke = True
            else:
                self._renew_at(entry, started + retry_after(entry, started))
        if extended:
            self.out.append(Extended(extended, seconds))

    def renewal_failed(
        self, batch: Sequence[Entry], seconds: int, started: float, retryable: bool, now: float
    ) -> None:
        """One renewal batch call failed whole: tried again ``retry_after`` it began."""
        for entry in batch:
            self._renew_at(entry, started + retry_after(entry, started))
            if retryable:  # SQS may have acted before the answer was lost
                entry.sqs_until = max(entry.sqs_until, now + seconds)

    def broke(self, call: Call, now: float) -> None:
        """Making the call raised something unforeseen: its entries are tried again."""
        unsettled = [op for op in call.ops if op.entry.state is not D and op not in self.ops]
        self._retry(unsettled, now)
        for entry in call.renewals:
            self._renew_at(entry, now + retry_after(entry, now))

    def ended(self, call: Call) -> None:
        """The call is over, answered or not: its messages are free for the next."""
        if call.ended:
            raise IllegalTransition("a call ended twice")
        call.ended = True
        for entry in call.entries:
            entry.busy = False
        for entry in call.renewals:
            entry.renewing = False
        self.under_way -= 1
        if call.ops or any(e.state is L for e in call.renewals):
            self.out.append(Room())

    # -- queries -----------------------------------------------------------------------

    def in_states(self, *states: State) -> list[Entry]:
        return [e for e in self.held.values() if e.state in states]

    def check(self) -> list[str]:
        """The machine's own invariants, broken ones as sentences (for the simulator)."""
        broken = []
        live = self.in_states(*LIVE)
        if live and self._renew_floor > min(e.renew_at for e in live):
            broken.append(
                f"the renewal floor {self._renew_floor} is above a held message's renewal "
                f"at {min(e.renew_at for e in live)}"
            )
        settling = len(self.in_states(S))
        if settling != self.settling:
            broken.append(f"counts {self.settling} settling, holds {settling}")
        return broken

    # -- the one place a state changes -------------------------------------------------

    def _move(self, entry: Entry, event: Event) -> State:
        state = TRANSITIONS.get((entry.state, event))
        if state is None:
            state = next_state(entry.state, event)  # raises IllegalTransition, saying which
        self.settling += (state is S) - (entry.state is S)
        entry.state = state
        return state

    def _lose(self, entry: Entry, event: Event, reason: str) -> None:
        """Lose the lease (reported once: a lost lease stays lost)."""
        was = entry.state
        self._move(entry, event)
        if event is Event.GONE:
            entry.disowned = True
        if was is L:
            return
        self.held.pop(entry.handle, None)
        self.out.append(LeaseLost(entry, reason))
        self.woke = True  # an extend() waiting on this lease returns

    def _lapse(self, entry: Entry, now: float) -> bool:
        """Lose a held message's lease if it ran out unrenewed, a queued delete's too."""
        if entry.state in LIVE and now >= entry.expires_at:
            self._lose(entry, Event.EXPIRE, EXPIRED)
            return True
        return False

    def _renew_at(self, entry: Entry, moment: float) -> None:
        """Every change of a renewal moment goes through here, so ``_renew_floor`` stays
        at or below each of them."""
        entry.renew_at = moment
        self._renew_floor = min(self._renew_floor, moment)

    def _mark_sent(self, call: Call) -> None:
        if call.sent or call.ended:
            raise IllegalTransition("a call sent twice, or after it ended")
        call.sent = True

    def _check_answer(self, call: Call) -> None:
        if not call.sent or call.ended:
            raise IllegalTransition("an answer to a call not under way")

    def _retry(self, ops: Iterable[Op], now: float) -> None:
        """Try again after ``retry_after``, while the lease lasts: a lost one is SQS's to
        return."""
        for op in ops:
            self._lapse(op.entry, now)
            if op.entry.state is L:
                if op.action == "delete":  # handled, and it may be delivered again
                    self.out.append(DeleteFailed(op.entry, LAPSED, False))
                continue
            op.not_before = now + retry_after(op.entry, now)
            op.urgent = op.urgent or self.stopping  # a stop sends all it can
            self.ops.append(op)

    def _send_by(self, op: Op) -> float:
        """When a queued op goes at the latest: ``delete_interval`` after it was queued, or
        sooner at its lease's renewal moment (a return's lease is not renewed) or, at the
        12-hour cap, half a timeout before the lease ends."""
        e = op.entry
        return min(op.queued_at + self.delete_interval, e.renew_at, e.expires_at - e.timeout / 2)

    def _ready(self, now: float) -> list[Op]:
        """The queued ops that may go now, the oldest first (a retried op is queued again
        at the end)."""
        ready = [op for op in self.ops if op.not_before <= now and not op.entry.busy]
        return sorted(ready, key=lambda op: op.queued_at)

    def _prune(self) -> None:
        """Drop queued ops that can no longer help: a lost lease's return (SQS returns the
        message by itself), and any op on a handle SQS said is gone."""
        keep: list[Op] = []
        for op in self.ops:
            if op.entry.state is not L or (op.action == "delete" and not op.entry.disowned):
                keep.append(op)
            elif op.action == "delete":
                self.out.append(DeleteFailed(op.entry, DISOWNED, False))
        self.ops = keep

    def _renewable(self, now: float, settling_now: Sequence[Op] = ()) -> list[Entry]:
        """Held messages whose lease is ours to renew at ``now``: not lost, not at the cap,
        not returning, the claim ahead. A queued delete's lease is renewed until the delete
        is sent, not in the pass that sends it (its handle may be gone by then)."""
        skip = {id(op.entry) for op in self.ops if op.action == "return"}
        skip |= {id(op.entry) for op in settling_now}
        return [e for e in self.held.values() if id(e) not in skip and e.may_renew(now)]
