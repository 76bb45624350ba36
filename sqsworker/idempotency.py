"""Idempotency: a redelivered message never repeats a completed side effect.

Before a handler runs, the worker claims the message's key (``keys.py``) in the
store (``stores/``):

- no live record: the key is taken IN_PROGRESS until ``margin`` seconds after the
  message's visibility lease ends; while the handler runs, ``ClaimKeeper`` keeps
  the claim that far ahead of the lease, so a crashed worker's claim lapses
  ``margin`` seconds after SQS hands its message to another;
- COMPLETED: a duplicate, deleted without running the handler;
- IN_PROGRESS under another claim: the message waits until that claim ends, and
  is checked again then;
- a live record with another payload hash: a conflict.

After success the record becomes COMPLETED for ``--idempotency-ttl``; after a
failure it is released, so the retry can run. A handler writing to the store's
own database can commit its writes and the completion in one transaction
(``message.transaction()``): then even a kill between the effect and the delete
cannot repeat the effect.
"""

from __future__ import annotations

import enum
import math
import os
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .clock import Clock, Task
from .keys import KeyPolicy, derive, digest
from .stores import Lease, State, Store, TransactionalStore, open_store

if TYPE_CHECKING:
    from .config import WorkerConfig
    from .message import Message

# A claim outlives its message's lease, as the worker counts it, by this much. SQS
# starts a lease's countdown when a receive or a renewal reaches it, which is later
# than the worker counts from by up to one call's time (the SQS client gives up
# after 5 s to connect plus 30 s to read), and clocks of different hosts disagree
# (records hold wall-clock times). A renewal goes with at least 3/4 of it left
# (45 s): every store's calls are bounded below that (STORE_CALL_LIMIT), so a claim
# cannot lapse while a renewal of it is on its way.
CLAIM_MARGIN = 60.0
RENEW_BELOW = 0.75  # renew a claim once it has less than this share of what renewing gives it
RIDE_ALONG_BELOW = 0.9  # ... or less than this, when a store call goes anyway
MIN_GAIN = 1.0  # seconds a renewal must add to its claim to be worth a store write
LOOK_EVERY = 0.25  # look for a moved lease at least every quarter of the time it has left
MIN_LOOK = 1.0  # ... but not more often than once a second
RETRY_AFTER_ERROR = 1.0  # seconds before claims whose renewal failed are tried again
RENEW_BATCH = 100  # claims per store call


class Verdict(enum.Enum):
    RUN = "run"
    DUPLICATE = "duplicate"  # completed before: delete without running
    BUSY = "busy"  # in progress under another claim: look again later
    CONFLICT = "conflict"  # the key is live with another payload


@dataclass(frozen=True)
class Admission:
    verdict: Verdict
    retry_in: float = 0.0  # for BUSY: seconds until the other claim ends


class Claim:
    """A message's hold on its key: what renewals, completion and transactions need."""

    def __init__(self, guard: Idempotency, key: str, owner: str, digest: str) -> None:
        self.guard = guard
        self.key = key  # as the policy derived it
        self.record_key = f"{guard.namespace}/{key}"  # as the store holds it
        self.owner = owner
        self.digest = digest
        self.committed = False  # completed inside message.transaction()
        self.settled = False  # completed or released: no renewal can lose it any more

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        store = self.guard.store
        if not isinstance(store, TransactionalStore):
            raise RuntimeError(
                f"message.transaction() needs a SQL idempotency store, and {store.url} is not "
                "one: run with --idempotency-store sqlite:///PATH.db or postgresql://..."
            )
        if self.committed:
            raise RuntimeError("message.transaction() commits once per message; it already did")
        expires_at = self.guard.clock.time() + self.guard.ttl
        with store.transaction(self.record_key, self.owner, expires_at) as connection:
            yield connection
        self.committed = True


class Idempotency:
    def __init__(
        self,
        store: Store,
        policy: KeyPolicy,
        *,
        ttl: float,
        clock: Clock,
        namespace: str,
        margin: float = CLAIM_MARGIN,
    ) -> None:
        self.store = store
        self.policy = policy
        self.ttl = ttl
        self.clock = clock
        self.namespace = namespace  # the queue's name: keys of different queues never meet
        self.margin = margin  # seconds a claim outlives its message's lease
        self.keeper: ClaimKeeper | None = None  # renews running claims, once started
        self._owner_prefix = f"{socket.gethostname()}/{os.getpid()}"

    @classmethod
    def open(
        cls, config: WorkerConfig, clock: Clock, namespace: str, threads: int | None = None
    ) -> Idempotency:
        """The store ``config`` names. Raises ``StartupError`` when it cannot be used."""
        assert config.idempotency_store is not None
        # DynamoDB's endpoint is boto3's (AWS_ENDPOINT_URL_DYNAMODB) or the URL's ?endpoint=.
        # A pooled store (PostgreSQL) needs a connection per thread that calls it (a
        # handler thread, inside message.transaction() too, or a coroutine handler's
        # helper thread), and a few for claims and renewals beside them.
        threads = config.concurrency if threads is None else threads
        store = open_store(config.idempotency_store, region=config.region, connections=threads + 2)
        return cls(
            store,
            config.idempotency_key,
            ttl=config.idempotency_ttl,
            clock=clock,
            namespace=namespace,
        )

    def start(
        self,
        on_store_failed: Callable[[str, BaseException], None],
        on_claim_lost: Callable[[Message, str], None],
    ) -> ClaimKeeper:
        """Start renewing the claims of running messages, on a thread of their own."""
        self.keeper = ClaimKeeper(
            self.store,
            self.clock,
            margin=self.margin,
            on_store_failed=on_store_failed,
            on_claim_lost=on_claim_lost,
        )
        self.keeper.start()
        return self.keeper

    def admit(self, message: Message) -> Admission:
        """Claim the message's key. Raises ``IdempotencyKeyError`` or ``StoreError``."""
        key = derive(self.policy, message)
        message.idempotency_key = key  # in every log line about it from now on
        claim = Claim(self, key, f"{self._owner_prefix}/{uuid.uuid4().hex[:12]}", digest(message))
        now = self.clock.time()
        expires_at = now + message.lease.seconds_left + self.margin
        record = self.store.claim(claim.record_key, claim.owner, claim.digest, expires_at, now)
        if record is None:
            message.idempotency = claim  # ours to renew, complete or release
            if self.keeper is not None:
                self.keeper.track(message, expires_at)
            return Admission(Verdict.RUN)
        if record.digest != claim.digest:
            return Admission(Verdict.CONFLICT)
        if record.state is State.COMPLETED:
            return Admission(Verdict.DUPLICATE)
        return Admission(Verdict.BUSY, retry_in=record.expires_at - now)

    def complete(self, message: Message) -> bool:
        """Mark the key done after success; False if another claim had taken it meanwhile."""
        claim = _claim_of(message)
        if claim is None:
            return True
        self._settle(claim)
        if claim.committed:
            return True
        now = self.clock.time()
        return self.store.complete(claim.record_key, claim.owner, claim.digest, now + self.ttl, now)

    def release(self, message: Message) -> None:
        """Forget the claim after a failure, so the retry can run."""
        claim = _claim_of(message)
        if claim is None:
            return
        self._settle(claim)
        if not claim.committed:
            message.idempotency = None
            self.store.release(claim.record_key, claim.owner)

    def _settle(self, claim: Claim) -> None:
        # Before the store call: a renewal answered after it must not count as a loss.
        claim.settled = True
        if self.keeper is not None:
            self.keeper.forget(claim)

    def close(self, deadline: float | None = None) -> bool:
        """Stop renewing and close the store; False if a renewal was still under way at
        ``deadline`` (monotonic), and the store was left open for it."""
        if self.keeper is not None and not self.keeper.stop(deadline):
            return False
        self.store.close()
        return True


# -- keeping claims ahead of their leases ------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What the claim keeper does with one claim at one moment."""

    expires_at: float  # what a renewal now would write: the lease's end plus the margin
    due: bool  # renew it now
    may_ride: bool  # renew it now if a store call goes anyway
    look_in: float  # seconds until it can fall due if its lease does not move


def plan(stored: float, lease_left: float, now: float, margin: float) -> Plan:
    """The rule for one claim: ``stored`` is the expiry its record holds, ``now`` wall time.

    A renewal moves a claim to ``margin`` past its lease's end. It is due once a quarter
    of what renewing would give it is gone: when the claim has less than 3/4 of
    ``lease_left + margin`` left. So it waits for the lease to move (a renewal before
    would change nothing) and then goes with at least 3/4 of the margin to spare.
    """
    wanted = now + lease_left + margin
    poll = max(MIN_LOOK, lease_left * LOOK_EVERY)
    if wanted - stored < MIN_GAIN:  # the lease has not moved: nothing to gain yet
        return Plan(wanted, False, False, poll)
    have, fresh = stored - now, wanted - now
    due = have <= RENEW_BELOW * fresh + 1e-6
    ride = have < RIDE_ALONG_BELOW * fresh
    # Both shrink as time passes: have - x <= k (fresh - x) once x >= (have - k fresh) / (1 - k).
    until_due = max(0.0, (have - RENEW_BELOW * fresh) / (1 - RENEW_BELOW))
    return Plan(wanted, due, ride, min(poll, until_due))


class _Tracked:
    """One running message's claim, as the keeper keeps it."""

    __slots__ = ("claim", "message", "retry_at", "stored")

    def __init__(self, message: Message, claim: Claim, stored: float) -> None:
        self.message = message
        self.claim = claim
        self.stored = stored  # wall-clock expiry the store holds, as last written
        self.retry_at = -math.inf  # monotonic: not before this after a failed renewal


class ClaimKeeper:
    """Keeps each running message's claim ``margin`` seconds ahead of its lease.

    Its own thread looks at every claim when it can fall due (``plan``), at least every
    quarter of its lease's remaining time, and at once after ``wake``. Due claims go to
    the store in batches, one call at a time; each carries the expiry wanted when it is
    sent, so a slow store delays renewals but never queues stale ones behind it. A store
    error is reported and retried a second later. A renewal the store refuses because
    another owner holds the key is reported lost, unless the claim was completed or
    released meanwhile: that is no loss.
    """

    def __init__(
        self,
        store: Store,
        clock: Clock,
        *,
        margin: float,
        on_store_failed: Callable[[str, BaseException], None],
        on_claim_lost: Callable[[Message, str], None],
    ) -> None:
        self.store = store
        self.clock = clock
        self.margin = margin
        self.on_store_failed = on_store_failed
        self.on_claim_lost = on_claim_lost
        # _wake's lock guards _claims, _changed, _stopping, _finished and waiting_until.
        self._wake = threading.Condition(threading.Lock())
        self._claims: dict[str, _Tracked] = {}  # by claim owner
        self._changed = False  # a claim was added or a lease moved since the last look
        self._stopping = False
        self._finished = False
        self._task: Task | None = None
        # When the thread looks again (monotonic; inf: when told to); None while it works.
        self.waiting_until: float | None = None

    def start(self) -> None:
        self._task = self.clock.spawn("sqsworker-claims", self._run)

    def track(self, message: Message, expires_at: float) -> None:
        """Keep ``message``'s claim, written to expire at ``expires_at``, ahead of its lease."""
        claim = _claim_of(message)
        assert claim is not None
        with self._wake:
            self._claims[claim.owner] = _Tracked(message, claim, expires_at)
            self._poke()

    def forget(self, claim: Claim) -> None:
        """Renew the claim no more: it is completed, released, or no longer wanted."""
        with self._wake:
            self._claims.pop(claim.owner, None)

    def wake(self, messages: object = None) -> None:
        """Look at the claims now: a lease moved. Fits ``LeaseKeeper(on_renewed=...)``."""
        with self._wake:
            self._poke()

    def alive(self) -> bool:
        """The thread runs (read by /healthz: claims nobody renews lapse under handlers)."""
        return self._task is not None and not self._finished

    def tracked(self) -> int:
        with self._wake:
            return len(self._claims)

    def stop(self, deadline: float | None = None) -> bool:
        """End the thread, at once if it waits, else when its store call returns.

        False if that call was still under way at ``deadline`` (monotonic). Claims are
        not released: each lapses ``margin`` after its lease, or is completed meanwhile.
        """
        with self._wake:
            self._stopping = True
            self._wake.notify_all()
            while self._task is not None and not self._finished:
                if deadline is not None and self.clock.monotonic() >= deadline:
                    return False
                self.clock.wait(self._wake, deadline)
            return True

    def _poke(self) -> None:
        self._changed = True
        self.waiting_until = None
        self._wake.notify_all()

    # -- the thread ----------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            with self._wake:
                self._finished = True
                self.waiting_until = None
                self._wake.notify_all()

    def _loop(self) -> None:
        while True:
            with self._wake:
                if self._stopping:
                    return
                self._changed = False
                tracked = list(self._claims.values())
            # Leases are read without this lock held: their owner may hold its own.
            batch, look_at, done = self._look(tracked)
            with self._wake:
                for t in done:
                    if self._claims.get(t.claim.owner) is t:
                        del self._claims[t.claim.owner]
                if self._stopping:
                    return
                if not batch:
                    if not self._changed:
                        self.waiting_until = math.inf if look_at is None else look_at
                        self.clock.wait(self._wake, look_at)
                        self.waiting_until = None
                    continue
            self._send(batch)

    def _look(
        self, tracked: list[_Tracked]
    ) -> tuple[list[tuple[_Tracked, float]], float | None, list[_Tracked]]:
        """The claims to renew now (due first, then riders), when to look next, and those
        no longer to keep (committed in a transaction, or their lease lost)."""
        now, wall = self.clock.monotonic(), self.clock.time()
        due: list[tuple[_Tracked, float]] = []
        riders: list[tuple[_Tracked, float]] = []
        done: list[_Tracked] = []
        looks: list[float] = []
        for t in tracked:
            lease = t.message.lease
            # A lost lease's claim lapses by itself, once SQS cannot still hide the
            # message from others (a renewal whose answer was lost may have been applied).
            left = getattr(lease, "may_hold_for", 0.0) if lease.lost else lease.seconds_left
            if t.claim.committed or t.claim.settled or (lease.lost and left <= 0):
                done.append(t)
                continue
            if now < t.retry_at:
                looks.append(t.retry_at)
                continue
            if not math.isfinite(left):
                continue  # a lease with no end (a message built by hand)
            p = plan(t.stored, left, wall, self.margin)
            if p.due:
                due.append((t, p.expires_at))
            else:
                if p.may_ride:
                    riders.append((t, p.expires_at))
                looks.append(now + p.look_in)
        batch = (due + riders)[:RENEW_BATCH] if due else []
        return batch, min(looks, default=None), done

    def _send(self, batch: list[tuple[_Tracked, float]]) -> None:
        leases = [Lease(t.claim.record_key, t.claim.owner, e) for t, e in batch]
        try:
            refused = set(self.store.renew(leases))
        except Exception as exc:  # on this thread: an error unreported is an error lost
            self.on_store_failed("renew", exc)
            with self._wake:
                retry_at = self.clock.monotonic() + RETRY_AFTER_ERROR
                for t, _ in batch:
                    t.retry_at = retry_at
            return
        lost: list[Message] = []
        with self._wake:
            for t, expires_at in batch:
                if self._claims.get(t.claim.owner) is not t:
                    continue  # completed or released while the call went: nothing was lost
                if t.claim.record_key in refused:
                    del self._claims[t.claim.owner]
                    lost.append(t.message)
                else:
                    t.stored = max(t.stored, expires_at)
        for message in lost:
            self.on_claim_lost(message, "the claim lapsed and another worker took the key")


def _claim_of(message: Message) -> Claim | None:
    """The message's claim, made by ``Idempotency.admit`` (a ``Message`` knows it only as
    something with a ``transaction``)."""
    claim = message.idempotency
    assert claim is None or isinstance(claim, Claim)
    return claim
