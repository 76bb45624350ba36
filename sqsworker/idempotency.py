"""Idempotency: a redelivered message never repeats a completed side effect.

Before a handler runs, the worker claims the message's key (``keys.py``) in the
store (``stores/``):

- no live record: the key is taken IN_PROGRESS to cover the message's visibility
  lease and its next renewal, with ``HEADROOM`` to spare, plus ``margin``. While the
  handler runs, ``ClaimKeeper`` moves the claim before each renewal, and the lease
  thread renews only as far as the claim covers (``Entry.claim_until``): SQS never
  hides the message past its claim, even when the worker stops right after a renewal
  went. A crashed worker's claim lapses at most a visibility timeout plus
  ``HEADROOM``, ``margin`` and one store call's time (at most ``STORE_CALL_LIMIT``)
  after SQS hands its message to another;
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
from .stores import (
    STORE_CALL_LIMIT,
    Lease,
    Record,
    State,
    Store,
    TransactionalStore,
    open_store,
)

if TYPE_CHECKING:
    from .config import WorkerConfig
    from .message import Message

# A claim outlives what SQS may hide its message for, as the worker counts it, by this
# much. SQS starts a lease's countdown when a receive or a renewal reaches it, which
# is later than the worker counts from by up to one call's time (the SQS client gives
# up after 5 s to connect plus 30 s to read), and clocks of different hosts disagree
# (records hold wall-clock times).
CLAIM_MARGIN = 60.0
# A claim covers its lease's next renewal with this much to spare, and moves again once
# half of it is used: a store failing or slow for less than half of it holds up no
# renewal, and even the slowest store call (STORE_CALL_LIMIT) costs no lease of the
# default 30 s, which lasts that long past the last renewal its claim covered.
HEADROOM = 45.0
WRITE_AHEAD = 0.25  # a claim moves once its lease's renewal is this share of a timeout away
RIDE_AHEAD = 0.5  # ... or this share, when a store call goes anyway
MIN_GAIN = 1.0  # seconds a renewal must add to its claim to be worth a store write
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
        # A block holding the whole store's write lock (SQLite) keeps every other worker
        # from the key, and the keeper from moving the claim: the lease goes on without
        # the claim while it runs, and after a commit (the key is completed).
        keeper = self.guard.keeper if getattr(store, "locks_every_key", False) else None
        freed = False
        try:
            if keeper is None:
                block = store.transaction(self.record_key, self.owner, expires_at)
            else:  # a failed block moves the claim before the lock goes
                block = store.transaction(  # type: ignore[call-arg]
                    self.record_key,
                    self.owner,
                    expires_at,
                    keep_until=lambda: keeper.expiry_for(self),
                )
            with block as connection:
                if keeper is not None:
                    keeper.free(self, True)
                    freed = True
                yield connection
        except BaseException:
            if keeper is not None and freed:
                keeper.free(self, False, self._stored(store))
            raise
        self.committed = True

    def _stored(self, store: Store) -> float | None:
        """The expiry the store holds for this claim (a failed block moved it), if ours."""
        try:
            record: Record | None = store.get(self.record_key)  # type: ignore[attr-defined]
        except Exception:  # the keeper moves the claim as it would anyway
            return None
        if record is None or record.owner != self.owner or record.state is not State.IN_PROGRESS:
            return None
        return record.expires_at


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
        lease = message.lease
        seconds = needed(lease)
        cover = getattr(lease, "cover", None)
        if cover is not None:  # no renewal past the claim from now on, even before it is taken
            cover(seconds)
        now = self.clock.time()
        expires_at = now + seconds + self.margin
        record: Record | None = None
        taken = False
        began = self.clock.monotonic()
        try:
            record = self.store.claim(claim.record_key, claim.owner, claim.digest, expires_at, now)
            taken = record is None
            if self.keeper is not None:
                self.keeper.saw_call(self.clock.monotonic() - began)
        finally:
            if not taken and cover is not None:
                cover(math.inf)  # not ours (or not taken): the lease is free of it
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
        self._settle(message, claim)
        if claim.committed:
            return True
        now = self.clock.time()
        return self.store.complete(claim.record_key, claim.owner, claim.digest, now + self.ttl, now)

    def release(self, message: Message) -> None:
        """Forget the claim after a failure, so the retry can run."""
        claim = _claim_of(message)
        if claim is None:
            return
        self._settle(message, claim)
        if not claim.committed:
            message.idempotency = None
            self.store.release(claim.record_key, claim.owner)

    def _settle(self, message: Message, claim: Claim) -> None:
        # Before the store call: a renewal answered after it must not count as a loss.
        claim.settled = True
        if self.keeper is not None:
            self.keeper.forget(claim)  # it moves the claim no more, nor covers the lease
        _uncover(message)  # done with the claim: its lease no longer waits for it

    def close(self, deadline: float | None = None) -> bool:
        """Stop renewing and close the store; False if a renewal was still under way at
        ``deadline`` (monotonic), and the store was left open for it."""
        if self.keeper is not None and not self.keeper.stop(deadline):
            return False
        self.store.close()
        return True


# -- keeping claims ahead of their leases ------------------------------------------------


def reach(hold: float, renew_in: float, timeout: float) -> float:
    """Seconds from now a claim must last, less the margin: what SQS may hide its message
    for now (``hold``) or after the lease's next renewal (due in ``renew_in`` seconds,
    asking ``timeout``), whichever is longer, with ``HEADROOM`` to spare."""
    return max(hold, max(renew_in, 0.0) + timeout) + HEADROOM


def needed(lease: Any) -> float:
    """``reach`` for ``lease`` as it stands: what SQS may hide its message for now (a
    renewal under way counts, whose answer may come after the claim is written) and
    after its next renewal (a lease built by hand has none)."""
    hold = max(lease.seconds_left, getattr(lease, "may_hold_for", 0.0))
    renewal = getattr(lease, "next_renewal", None)
    return hold + HEADROOM if renewal is None else reach(hold, *renewal)


@dataclass(frozen=True)
class Plan:
    """What the claim keeper does with one claim at one moment."""

    wanted: float  # seconds from now a renewal now would make the claim last
    due: bool  # renew it now
    may_ride: bool  # renew it now if a store call goes anyway
    look_in: float  # seconds until it falls due if its lease does not move sooner


def plan(
    have: float, hold: float, renew_in: float, timeout: float, margin: float, lead: float = 0.0
) -> Plan:
    """The rule for one claim that has ``have`` seconds left, of a lease SQS may hide its
    message for ``hold`` seconds, whose next renewal is due in ``renew_in`` seconds and
    asks for ``timeout`` (``renew_in`` is inf at the 12-hour cap: no renewal comes).

    The lease thread renews only as far as the claim, less the margin, lasts (``Entry.
    claimed``). So the claim moves first: once the renewal is a quarter of a timeout
    away, or sooner if it is late, to cover it with ``HEADROOM`` to spare, and no later
    than when half of that headroom is used. As the renewal comes nearer the headroom
    stays; only past its moment (a renewal late or failing) does it shrink. A store call
    takes ``lead`` seconds (the last one's time): the claim moves that much sooner, and
    that much further, so it lands with the same headroom.
    """
    if renew_in == math.inf:  # no renewal comes: the claim covers what was sent
        return Plan(have, False, False, math.inf)
    wanted = reach(hold, renew_in, timeout) + lead + margin
    # The claim falls short of half its headroom at the renewal's moment, or later, at
    # ``short``, once a renewal now would need more than it has.
    short = have - margin - timeout - HEADROOM / 2 - lead
    window = renew_in - WRITE_AHEAD * timeout - lead
    until_due = max(window, 0.0) if short < max(renew_in, 0.0) else short
    if have - margin < hold + HEADROOM / 2 + lead:  # the lease went on without it: at once
        until_due = 0.0
    due = until_due <= 0 and wanted - have >= MIN_GAIN
    ride = renew_in - RIDE_AHEAD * timeout <= 0 and wanted - have >= MIN_GAIN
    return Plan(wanted, due, ride, max(until_due, 0.0) if not due else 0.0)


class _Tracked:
    """One running message's claim, as the keeper keeps it."""

    __slots__ = ("claim", "free", "message", "retry_at", "stored")

    def __init__(self, message: Message, claim: Claim, stored: float) -> None:
        self.message = message
        self.claim = claim
        self.stored = stored  # wall-clock expiry the store holds, as last written
        self.retry_at = -math.inf  # monotonic: not before this after a failed renewal
        self.free = False  # its lease goes on without it (``ClaimKeeper.free``)

    def cover(self, margin: float, wall: float) -> None:
        """Tell its lease how far the claim lets SQS hide the message (the keeper's lock
        held, so never after ``forget``)."""
        cover = getattr(self.message.lease, "cover", None)
        if cover is not None:
            cover(math.inf if self.free else self.stored - margin - wall)


class ClaimKeeper:
    """Keeps each running message's claim ahead of its lease's next renewal (``plan``).

    Its own thread looks at every claim when it falls due, and at once after ``wake``
    (a handler asked for a longer lease). Due claims go to the store in batches, one
    call at a time; each carries the expiry wanted when it is sent, so a slow store
    delays renewals but never queues stale ones behind it. Once the store took one, the
    lease learns how far its claim now covers it (``cover``). A store error is reported
    and retried a second later. A renewal the store refuses because another owner holds
    the key is reported lost, unless the claim was completed or released meanwhile:
    that is no loss.
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
        # Seconds the last store call took: set by this thread's calls, raised by others'.
        self._call_time = 0.0

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
        """Renew the claim no more: it is completed, released, or no longer wanted. Once
        this returns, the keeper sets its lease's cover no more either."""
        with self._wake:
            self._claims.pop(claim.owner, None)

    def free(self, claim: Claim, free: bool, stored: float | None = None) -> None:
        """Let ``claim``'s lease go on without it (``free``: a transaction holds the
        store's write lock, so no other worker can take the key), or hold the lease to
        the claim again, as far as it reaches as ``stored`` (then moved at once if the
        lease went past it meanwhile)."""
        with self._wake:
            t = self._claims.get(claim.owner)
            if t is not None:
                t.free = free
                if stored is not None:
                    t.stored = max(t.stored, stored)
                t.cover(self.margin, self.clock.time())
                self._poke()

    def expiry_for(self, claim: Claim) -> float:
        """The wall-clock expiry that covers ``claim``'s lease now and its next renewal, as
        a claim taken now would (the time itself if it is not kept here)."""
        with self._wake:
            t = self._claims.get(claim.owner)
        wall = self.clock.time()
        if t is None:
            return wall
        return wall + needed(t.message.lease) + self.margin

    def saw_call(self, seconds: float) -> None:
        """A store call of another thread took ``seconds``: claims move that much sooner."""
        self._call_time = max(self._call_time, min(seconds, STORE_CALL_LIMIT))

    def wake(self) -> None:
        """Look at the claims now: a lease wants more. Fits ``LeaseKeeper(on_extend=...)``."""
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
                        if t.claim.committed:  # completed: the lease no longer waits for it
                            _uncover(t.message)
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
            # A lost lease is renewed no more, and its claim covered every renewal that
            # went (a late answer's too): the claim lapses by itself after them.
            if t.claim.committed or t.claim.settled or lease.lost:
                done.append(t)
                continue
            if now < t.retry_at:
                looks.append(t.retry_at)
                continue
            if t.free:
                continue  # its transaction holds the store's lock: looked at once it ends
            renewal = getattr(lease, "next_renewal", None)
            if renewal is None:
                continue  # a lease with no end (a message built by hand)
            hold = getattr(lease, "may_hold_for", lease.seconds_left)
            p = plan(t.stored - wall, hold, renewal[0], renewal[1], self.margin, self._call_time)
            if p.due:
                due.append((t, wall + p.wanted))
            else:
                if p.may_ride:
                    riders.append((t, wall + p.wanted))
                if p.look_in < math.inf:
                    looks.append(now + p.look_in)
        batch = (due + riders)[:RENEW_BATCH] if due else []
        return batch, min(looks, default=None), done

    def _send(self, batch: list[tuple[_Tracked, float]]) -> None:
        leases = [Lease(t.claim.record_key, t.claim.owner, e) for t, e in batch]
        began = self.clock.monotonic()
        try:
            refused = set(self.store.renew(leases))
        except Exception as exc:  # on this thread: an error unreported is an error lost
            self._call_time = min(self.clock.monotonic() - began, STORE_CALL_LIMIT)
            self.on_store_failed("renew", exc)
            with self._wake:
                retry_at = self.clock.monotonic() + RETRY_AFTER_ERROR
                for t, _ in batch:
                    t.retry_at = retry_at
            return
        self._call_time = min(self.clock.monotonic() - began, STORE_CALL_LIMIT)
        lost: list[Message] = []
        with self._wake:
            wall = self.clock.time()
            for t, expires_at in batch:
                if self._claims.get(t.claim.owner) is not t or t.claim.committed:
                    continue  # completed or released while the call went: nothing was lost
                if t.claim.record_key in refused:
                    del self._claims[t.claim.owner]
                    lost.append(t.message)
                    continue
                t.stored = max(t.stored, expires_at)
                t.cover(self.margin, wall)
        for message in lost:
            self.on_claim_lost(message, "the claim lapsed and another worker took the key")


def _claim_of(message: Message) -> Claim | None:
    """The message's claim, made by ``Idempotency.admit`` (a ``Message`` knows it only as
    something with a ``transaction``)."""
    claim = message.idempotency
    assert claim is None or isinstance(claim, Claim)
    return claim


def _uncover(message: Message) -> None:
    """Its lease no longer waits for a claim (``Entry.claim_until``)."""
    cover = getattr(message.lease, "cover", None)
    if cover is not None:
        cover(math.inf)
