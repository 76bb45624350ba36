"""Liveness of the worker's threads, as ``/healthz`` reads it.

Each thread marks the start of every step that must end by itself (an SQS call,
a pause) with how long it may take, and marks itself idle while it waits on
others (the receive thread for room, the lease thread for its next deadline).
A thread is stuck when a step outlasts its allowance: a hung connection, a
deadlock, a pause the process never wakes from.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .clock import Clock


class Progress:
    """One thread's current step: when it began and how long it may take. The two are
    one tuple, replaced whole, so a reader never sees half of an update and the thread
    pays no lock for each step it marks."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._step = (clock.monotonic(), math.inf)

    def step(self, allowance: float) -> None:
        """A step begins that must end within ``allowance`` seconds."""
        self._step = (self._clock.monotonic(), allowance)

    def idle(self) -> None:
        """Waiting on others, which is not being stuck."""
        self._step = (self._clock.monotonic(), math.inf)

    def overdue(self) -> float:
        """Seconds the current step has run past its allowance (0 if it has not)."""
        since, allowance = self._step
        return max(0.0, self._clock.monotonic() - since - allowance)


@dataclass(frozen=True)
class Health:
    started: bool
    stopping: bool
    receiver_overdue: float  # seconds past its allowance; 0 when making progress
    lease_overdue: float
    receiver_alive: bool
    lease_alive: bool
    handlers_alive: int = 0  # handler threads still running their loop
    handlers: int = 0  # how many were started
    claims_alive: bool | None = None  # the idempotency claim keeper; None: no store
    # An async handler's event loop: seconds it has been blocked (None: no loop), and
    # how long it may be before the worker counts as stuck (--stall-timeout).
    loop_blocked: float | None = None
    loop_allowance: float = math.inf
    # Seconds the receives have failed in a row (0 while SQS answers), and the last error.
    # Neither live nor ready depends on it: a restart cannot bring SQS back, and a worker
    # not ready would hold up a rollout (and fail the chart's startup probe) for as long
    # as SQS is away.
    sqs_unanswered: float = 0.0
    sqs_error: str = ""

    @property
    def live(self) -> bool:
        """Every thread runs, the receive and lease threads make progress. A stopping
        worker stays live until it exits."""
        if not self.started:
            return True
        receiver_ok = self.stopping or (self.receiver_alive and self.receiver_overdue == 0)
        lease_ok = (self.stopping or self.lease_alive) and self.lease_overdue == 0
        handlers_ok = self.stopping or self.handlers_alive >= self.handlers
        claims_ok = self.stopping or self.claims_alive is not False
        loop_ok = (self.loop_blocked or 0.0) <= self.loop_allowance
        return receiver_ok and lease_ok and handlers_ok and claims_ok and loop_ok

    @property
    def ready(self) -> bool:
        """Started (the queue was reachable) and not shutting down."""
        return self.started and not self.stopping

    def as_dict(self) -> dict[str, object]:
        return {
            "live": self.live,
            "ready": self.ready,
            "stopping": self.stopping,
            "receiver": _thread(self.receiver_alive, self.receiver_overdue),
            "lease": _thread(self.lease_alive, self.lease_overdue),
            "handlers": f"{self.handlers_alive} of {self.handlers} alive",
            "sqs": _sqs(self.sqs_unanswered, self.sqs_error),
            **({} if self.loop_blocked is None else {"event_loop": _loop(self.loop_blocked)}),
            **({} if self.claims_alive is None else {"claims": _thread(self.claims_alive, 0.0)}),
        }


@dataclass(frozen=True)
class ProcessHealth:
    """Several workers' health: live and ready only while every one of them is."""

    parts: Mapping[str, Health]

    @property
    def live(self) -> bool:
        return all(part.live for part in self.parts.values())

    @property
    def ready(self) -> bool:
        return all(part.ready for part in self.parts.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "live": self.live,
            "ready": self.ready,
            "workers": {name: part.as_dict() for name, part in self.parts.items()},
        }


def _sqs(unanswered: float, error: str) -> str:
    if not unanswered and not error:
        return "ok"
    return f"not answering for {unanswered:.0f}s: {error}"


def _loop(blocked: float) -> str:
    if blocked == math.inf:
        return "stopped"
    return f"blocked for {blocked:.1f}s by a handler's blocking call" if blocked else "ok"


def _thread(alive: bool, overdue: float) -> str:
    if not alive:
        return "exited"
    return f"stuck for {overdue:.0f}s past its allowance" if overdue else "ok"
