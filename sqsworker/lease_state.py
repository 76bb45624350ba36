"""A held message's lease: its states, the events that move it, and the commands out.

The values ``lease_machine.LeaseMachine`` takes and gives. Each held message is
an ``Entry`` in one of five states::

    WAITING --begin--> RUNNING --settle--> SETTLING --confirm--> DONE
       ^                  |                    ^
       '------defer-------'                    |
       '--settle-------------------------------'
    WAITING, RUNNING, SETTLING --expire, gone, refused--> LOST

``TRANSITIONS`` is the whole table, and ``LeaseMachine._move`` the one place a
state changes: an event not in the table for the entry's state raises
``IllegalTransition`` at once. Events that may arrive late from another thread
(a handler finishing as the shutdown hands its message back) are in the table
as moves to the same state.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from .config import MAX_VISIBILITY
from .errors import SQSWorkerError


class IllegalTransition(SQSWorkerError):
    """An event the lease machine cannot take in its state: a defect in its driver."""


class State(enum.Enum):
    WAITING = "waiting"  # received, its handler not started
    RUNNING = "running"
    SETTLING = "settling"  # a delete or a visibility change is queued for it
    DONE = "done"
    LOST = "lost"

    __hash__ = object.__hash__  # members are unique: hashed by identity, in C (the table's keys)


class Event(enum.Enum):
    BEGIN = "begin"  # its handler starts (refused unless WAITING)
    DEFER = "defer"  # set aside to begin again later, its lease kept
    SETTLE = "settle"  # a delete or a return is queued
    EXPIRE = "expire"  # its lease ran out here, unrenewed
    GONE = "gone"  # SQS said the receipt handle no longer owns the message
    REFUSED = "refused"  # SQS refused its delete or return for good
    CONFIRM = "confirm"  # SQS took its delete or return

    __hash__ = object.__hash__


W, R, S, D, L = State.WAITING, State.RUNNING, State.SETTLING, State.DONE, State.LOST
TRANSITIONS: dict[tuple[State, Event], State] = {
    (W, Event.BEGIN): R,
    (S, Event.BEGIN): S,  # refused: settled or lost meanwhile
    (D, Event.BEGIN): D,
    (L, Event.BEGIN): L,
    (R, Event.DEFER): W,
    (S, Event.DEFER): S,  # handed back meanwhile (a shutdown)
    (D, Event.DEFER): D,
    (L, Event.DEFER): L,
    (W, Event.SETTLE): S,
    (R, Event.SETTLE): S,
    (S, Event.SETTLE): S,  # settled already (handed back at a shutdown timeout)
    (D, Event.SETTLE): D,
    (L, Event.SETTLE): L,  # a delete is still tried, reported unsure
    (W, Event.EXPIRE): L,
    (R, Event.EXPIRE): L,
    (S, Event.EXPIRE): L,
    (W, Event.GONE): L,
    (R, Event.GONE): L,
    (S, Event.GONE): L,
    (L, Event.GONE): L,
    (S, Event.REFUSED): L,
    (L, Event.REFUSED): L,
    (S, Event.CONFIRM): D,
    (L, Event.CONFIRM): L,  # a delete after the lease ran out: nobody may have taken it
}
LIVE = (W, R, S)  # a tuple: `in` tests identity first


def next_state(state: State, event: Event) -> State:
    """The state ``event`` moves an entry in ``state`` to, by ``TRANSITIONS``."""
    then = TRANSITIONS.get((state, event))
    if then is None:
        raise IllegalTransition(f"{event.value} in state {state.value}")
    return then


class Entry:
    """One held message's lease, as the machine keeps it."""

    def __init__(self, handle: str, received_at: float, timeout: int) -> None:
        self.handle = handle  # the receipt handle
        self.received_at = received_at  # when the receive began: the 12-hour cap counts from it
        self.timeout = timeout
        self.expires_at = received_at + timeout
        # The latest SQS may hide the message under this handle: a renewal whose answer
        # was lost may have been applied, so past expires_at, SQS may still hold it.
        self.sqs_until = self.expires_at
        self.renew_at = received_at + timeout / 2
        # While it holds an idempotency claim, SQS must not hide it past this moment: the
        # claim lasts a margin longer. A renewal asks no further (``claimed``).
        self.claim_until = math.inf
        self.state = State.WAITING
        self.disowned = False  # SQS said this receipt handle no longer owns the message
        self.renewals = 0
        self.near_cap_warned = False
        self.outcome: str | None = None  # "delete" or "return", once one is queued
        self.handed_back = False  # returned at shutdown while held: it may no longer begin
        self.busy = False  # a call about its receipt handle is under way
        self.renewing = False  # a renewal of it is queued or under way
        self.renewal_wanted = False  # extend() asked for a renewal not sent yet

    @property
    def lost(self) -> bool:
        """Another consumer may have the message: SQS's lease ran out or was given back."""
        return self.state is State.LOST or self.handed_back

    @property
    def gone(self) -> bool:
        """Its delete is queued under a lease still held: it will not come back."""
        return self.outcome == "delete" and self.state is not State.LOST

    def claimed(self, seconds: int, now: float) -> int:
        """Of ``seconds``, what a renewal at ``now`` may ask: all, or what its claim covers."""
        if now + seconds <= self.claim_until:
            return seconds
        return max(0, math.floor(self.claim_until - now))

    def covered(self, now: float) -> bool:
        """A renewal at ``now`` may go: its claim covers it whole, or enough of it to make
        the lease a second longer (while a claim falls behind, its lease lasts as long)."""
        asked = self.claimed(self.timeout, now)
        return asked == self.timeout or now + asked >= self.expires_at + 1

    def may_renew(self, now: float) -> bool:
        """Live, not at the cap, in no call, and its claim ahead of a renewal now."""
        return (
            self.state in LIVE and self.renew_at < math.inf and not self.busy and self.covered(now)
        )

    def left(self, now: float) -> float:
        """Seconds of the lease left at ``now``."""
        return 0.0 if self.lost else max(0.0, self.expires_at - now)

    def may_hold(self, now: float) -> float:
        """Seconds SQS may still hide the message under this handle, at most: past a lost
        lease too, while a renewal whose answer was lost may have been applied."""
        if self.disowned or self.state is State.DONE:  # handed back: once SQS answered
            return 0.0
        until = self.sqs_until
        if self.renewing:  # sent at the latest now, asking for ``timeout`` from then
            until = max(until, min(now + self.timeout, self.received_at + MAX_VISIBILITY))
        return max(0.0, until - now)


@dataclass
class Op:
    """A queued delete or return."""

    entry: Entry
    action: str  # "delete" or "return"
    seconds: int = 0  # for "return": visible again after this long
    reason: str = ""
    queued_at: float = 0.0
    urgent: bool = False
    not_before: float = 0.0


@dataclass(eq=False)
class Call:
    """One batch call for a sender: ``ops`` to settle, or ``renewals`` to renew."""

    ops: list[Op] = field(default_factory=list)
    renewals: list[Entry] = field(default_factory=list)
    sent: bool = False
    ended: bool = False

    @property
    def entries(self) -> list[Entry]:
        return [op.entry for op in self.ops] + self.renewals


# -- commands: what the driver reports (the calls themselves are ``Call``s) ------------


@dataclass(frozen=True)
class LeaseLost:
    entry: Entry
    reason: str


@dataclass(frozen=True)
class DeleteFailed:
    entry: Entry
    reason: str
    retrying: bool


@dataclass(frozen=True)
class Deleted:
    entries: list[Entry]


@dataclass(frozen=True)
class DeletedAfterLeaseLost:
    entry: Entry


@dataclass(frozen=True)
class Returned:
    entries: list[Entry]
    seconds: int
    reason: str


@dataclass(frozen=True)
class Extended:
    entries: list[Entry]
    seconds: int


@dataclass(frozen=True)
class NearCap:
    entry: Entry
    seconds_left: float


@dataclass(frozen=True)
class Room:
    """Held messages were settled or lost: there is room for more under the held bound."""


Report = LeaseLost | DeleteFailed | Deleted | DeletedAfterLeaseLost | Returned | Extended
Command = Report | NearCap | Room
