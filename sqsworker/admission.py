"""Admission: the steps between taking a message and running its handler.

Its body fetched from S3 if it was offloaded (before its key is derived from the body),
its idempotency key claimed. The answer is a ``Step``: RUN the handler, KEEP the message
to look at again (a duplicate whose key is busy elsewhere, set aside with its lease
kept), or DONE (settled here: rejected, failed, a duplicate deleted, its lease lapsed
meanwhile). A step that raises is the message's failure, contained by the settler.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from .errors import KeyConflict, PayloadUnavailable, Reject, StoreError
from .idempotency import Verdict
from .pointers import is_offloaded

if TYPE_CHECKING:
    from .clock import Clock
    from .config import WorkerConfig
    from .events import Observer
    from .idempotency import Idempotency
    from .inbox import Inbox
    from .lease import Held, LeaseKeeper
    from .payloads import Payloads
    from .settling import Settler


class Step(enum.Enum):
    RUN = "run"
    KEEP = "keep"
    DONE = "done"


class Admission:
    def __init__(
        self,
        keeper: LeaseKeeper,
        settler: Settler,
        inbox: Inbox,
        config: WorkerConfig,
        clock: Clock,
        observer: Observer,
        payloads: Payloads,
        idempotency: Idempotency | None,
    ) -> None:
        self.keeper = keeper
        self.settler = settler
        self.inbox = inbox
        self.config = config
        self.clock = clock
        self.observer = observer
        self.payloads = payloads
        self.idempotency = idempotency

    def blocks(self, held: Held) -> bool:
        """True when admitting ``held`` calls S3 or the store: a coroutine handler's is
        then admitted on a helper thread."""
        return self.idempotency is not None or is_offloaded(held.message.raw_message_attributes)

    def prepare(self, held: Held, started: float, keep: bool = True) -> Step:
        """The steps before the handler; a step that raises is the message's failure,
        contained. Without ``keep`` (a FIFO batch), a busy key's message is returned, not
        kept."""
        deferrals = held.deferrals
        try:
            return self._steps(held, started, keep)
        except Exception as exc:
            # DONE: settled here; KEEP: another thread took it meanwhile, and finishes it.
            contained = self.settler.contain(held, started, exc, deferrals)
            return Step.DONE if contained else Step.KEEP

    def _steps(self, held: Held, started: float, keep: bool) -> Step:
        settler, message = self.settler, held.message
        if settler.refused_before(held):
            return Step.DONE
        if is_offloaded(message.raw_message_attributes):
            try:
                message.fetch_body(self.payloads)  # before the key is derived from the body
            except Reject as exc:
                settler.reject(held, exc, started)
                return Step.DONE
            except PayloadUnavailable as exc:
                settler.fail(held, exc, started, delay=None)
                return Step.DONE
            if not self.keeper.still_running(held):  # the fetch took longer than the lease
                return self._skipped(held, "its body was fetched from S3")
        if self.idempotency:
            verdict = self._admit(held, started, keep)
            if verdict is not Verdict.RUN:
                return Step.KEEP if verdict is Verdict.BUSY else Step.DONE
            if not self.keeper.still_running(held):  # the claim took longer than the lease
                settler.release_claim(message)
                return self._skipped(held, "its idempotency key was being claimed")
        return Step.RUN

    def lapsed(self, held: Held) -> Step:
        """The steps ran on a helper thread, and the event loop resumed the message past
        its lease (a handler blocked the loop; the message may be another consumer's
        now): it does not run, its claim released (the store called, off the loop)."""
        if self.idempotency:
            self.settler.release_claim(held.message)
        return self._skipped(held, "the event loop was blocked")

    def _skipped(self, held: Held, meanwhile: str) -> Step:
        self.settler.traced(held.message, "skipped")
        self.observer.handler_skipped(held.message, f"its lease ran out while {meanwhile}")
        return Step.DONE

    def _admit(self, held: Held, started: float, keep: bool) -> Verdict | None:
        """Claim the message's key: RUN, run the handler; BUSY, kept to look again later;
        anything else (None when no verdict could be had): settled here."""
        assert self.idempotency is not None
        settler, message = self.settler, held.message
        try:
            admission = self.idempotency.admit(message)
        except Reject as exc:  # no key can be derived from this message
            settler.reject(held, exc, started)
            return None
        except StoreError as exc:
            self.observer.store_failed("claim", exc)
            settler.fail(held, exc, started, delay=None)
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
                settler.reject(held, conflict, started)
                return Verdict.CONFLICT
            verdict = Verdict.DUPLICATE
        if verdict is Verdict.DUPLICATE:
            settler.duplicate(held)
        elif verdict is Verdict.BUSY:
            # Held, not returned: a return would use up a receive, and a duplicate that
            # keeps meeting its original would end in the dead-letter queue.
            retry_in = min(max(1.0, admission.retry_in), self.config.visibility_timeout)
            if not keep:
                settler.busy(held, retry_in)
                return None
            with self.inbox.lock:  # one step: the shutdown takes all the deferred or none
                deferred = not self.inbox.closing
                if deferred:
                    self.keeper.defer(held)
                    self.inbox.defer(held, self.clock.monotonic() + retry_in)
            if not deferred:  # the shutdown took the deferred ones already
                self.keeper.hand_back([held])
                return None
            settler.traced(message, "deferred", retry_in=retry_in)
            self.observer.duplicate_deferred(message, retry_in)
        return verdict
