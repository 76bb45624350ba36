"""A message the worker holds, and the lease its handler sees (``message.lease``)."""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, cast

from .clock import Clock
from .errors import LeaseLost
from .lease_machine import capped
from .lease_state import Entry
from .message import Message
from .transports import Envelope, Transport


@dataclass(frozen=True)
class Snapshot:
    """What a keeper holds, for the metrics: counts by state and the oldest receive."""

    waiting: int
    running: int
    oldest_received_at: float | None  # monotonic; the 12-hour cap counts from it


class Keeper(Protocol):
    """What a held message asks of its keeper (``lease.LeaseKeeper``)."""

    transport: Transport
    clock: Clock

    def extend(self, held: Held, seconds: int) -> float: ...

    def cover(self, held: Held, seconds: float) -> None: ...


class Held(Entry):
    """A message this worker holds, and its lease (the ``Lease`` its handler sees)."""

    def __init__(self, keeper: Keeper, envelope: Envelope, received_at: float, timeout: int):
        super().__init__(envelope.receipt_handle, received_at, timeout)
        self.keeper = keeper
        self.envelope = envelope
        # Times the worker set it aside (its idempotency key busy elsewhere): a thread whose
        # step fails after that no longer owns it, once another thread took it back.
        self.deferrals = 0
        self.queued_at = 0.0  # when the inbox queued it to run (with a hand-over set)
        self.message = Message(envelope, keeper.transport.info.name, HeldLease(self))

    # -- what its ``HeldLease`` reads ---------------------------------------------

    @property
    def seconds_left(self) -> float:
        return self.left(self.keeper.clock.monotonic())

    @property
    def may_hold_for(self) -> float:
        """Seconds SQS may still hide the message under this handle, at most: past a lost
        lease too, while a renewal whose answer was lost may have been applied. (An
        idempotency claim outlives this, not only ``seconds_left``.)"""
        return self.may_hold(self.keeper.clock.monotonic())

    @property
    def next_renewal(self) -> tuple[float, int]:
        """Seconds until its lease's next renewal is due (-inf: at once; inf: none comes,
        at the 12-hour cap), and the seconds that renewal asks for."""
        now = self.keeper.clock.monotonic()
        if self.renew_at == math.inf:
            return math.inf, self.timeout
        seconds = capped(self, self.timeout, max(now, self.renew_at))
        return (self.renew_at - now if seconds >= 1 else math.inf), seconds

    def extend(self, seconds: int) -> float:
        return self.keeper.extend(self, seconds)

    def cover(self, seconds: float) -> None:
        """Its idempotency claim lets SQS hide it up to ``seconds`` from now (inf: it has
        none): no renewal goes that would hide it longer."""
        self.keeper.cover(self, seconds)


class HeldLease:
    """``message.lease`` of a held message: a view of its ``Held``, by weak reference.

    The ``Held`` keeps its message; were the message to keep the ``Held``, every message
    would sit in a reference cycle, and its memory (a body of up to 1 MiB) would wait
    for the cyclic garbage collector's next full pass. The worker keeps the ``Held``
    while it runs or settles the message; a view that outlives it reads as a lease lost
    (``extend`` raises ``LeaseLost``), which it is to whoever kept only the message.
    """

    __slots__ = ("_held",)

    def __init__(self, held: Held) -> None:
        self._held = weakref.ref(held)

    @property
    def held(self) -> Held | None:
        """The worker's hold of the message, while it keeps one."""
        return self._held()

    @property
    def seconds_left(self) -> float:
        held = self._held()
        return 0.0 if held is None else held.seconds_left

    @property
    def lost(self) -> bool:
        held = self._held()
        return True if held is None else held.lost

    @property
    def may_hold_for(self) -> float:
        held = self._held()
        return 0.0 if held is None else held.may_hold_for

    @property
    def next_renewal(self) -> tuple[float, int] | None:
        held = self._held()
        return None if held is None else held.next_renewal

    def extend(self, seconds: int) -> float:
        held = self._held()
        if held is None:
            raise LeaseLost("the worker no longer holds this message")
        return held.extend(seconds)

    def cover(self, seconds: float) -> None:
        held = self._held()
        if held is not None:
            held.cover(seconds)


def message_of(entry: Entry) -> Message:
    return cast(Held, entry).message


def messages_of(entries: Sequence[Entry]) -> list[Message]:
    return [h.message for h in cast(Sequence[Held], entries)]
