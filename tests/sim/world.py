"""The fault simulator: real workers, the in-memory SQS, faults and time, all from one seed.

``simulate(seed)`` draws a schedule (queue kind, worker options, messages and what
their handlers do, as ``def``, batch or ``async def`` handlers, faults per SQS action,
outages, SIGTERMs and crashes), runs it
on ``SimClock`` (one thread at a time, see scheduler.py), and checks the
invariants after every step. It returns the violations found; the same seed
replays the same run.

The invariants (docs/delivery.md states the promise they check):
- a handler starts only on a message whose SQS lease is this receive's and alive;
- a message is reported deleted only if SQS no longer holds it;
- a worker holds at most its bound: concurrency + prefetch (auto: at most
  max(10, 2 x concurrency)), plus a batch per lease sender awaiting its answer (with a
  batch handler, concurrency x batch size in place of concurrency);
- every message ends deleted after its handler succeeded, in the dead-letter queue
  for a reason the worker reported, or in the queue: never lost;
- no thread waits forever: lease.extend() returns within a lease, shutdown within
  its timeout plus a receive, every thread of a stopped worker ends, the queue drains;
  no receive thread sleeps while a receive it would make is possible;
- two handlers of one idempotency key never overlap while the first one's lease lives;
- no simulated thread dies of an exception, and no worker's thread is lost (/healthz);
- ordinary messages keep being processed while hostile ones are in the queue: on a
  standard queue, none stays receivable for long while a live worker has had free
  handler room all that time and no fault was injected;
- after a clean shutdown no message received by that worker is invisible.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
from collections import defaultdict
from collections.abc import Callable, Collection, Generator, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from sqsworker import Backoff, Handler, Message, Reject, Retry, Worker, WorkerConfig
from sqsworker import BatchResult as BatchResult_
from sqsworker.coroutines import Helpers
from sqsworker.errors import ConfigError, LeaseLost, StoreError, TransportError
from sqsworker.events import Observer, Observers
from sqsworker.idempotency import CLAIM_MARGIN, HEADROOM
from sqsworker.lease_state import LIVE
from sqsworker.running import Coroutines
from sqsworker.stores import Lease, Record
from sqsworker.stores.memory import MemoryStore
from sqsworker.transports import (
    UNANSWERED,
    BatchResult,
    EntryFailure,
    Envelope,
    OutgoingMessage,
    QueueCounts,
    QueueInfo,
    send_all,
)
from sqsworker.transports.memory import MemorySQS, MemoryTransport

from .scheduler import SimClock, SimStuck

# Seconds between the event loop's heartbeats (0.25 s in a worker): the simulator's
# handlers take seconds to hours, and each beat is a turn of the scheduler.
LOOP_BEAT = 30.0

READ_TIMEOUT_EXTRA = 10  # the boto3 client's read timeout is the wait time plus this
T = TypeVar("T")
# What a simulated call yields: seconds to wait, or the service's act (which may block,
# as a long poll does: on a thread of its own when the call is awaited on a loop).
Step = float | Callable[[], Any]
TRANSIENT = ("InternalError", "ServiceUnavailable", "RequestThrottled")
EVERY_ACTION = frozenset(
    {"ReceiveMessage", "DeleteMessageBatch", "ChangeMessageVisibilityBatch", "GetQueueAttributes"}
)
OUTAGES = (  # what an outage takes down: everything, or one action alone
    EVERY_ACTION,
    frozenset({"DeleteMessageBatch"}),
    frozenset({"ChangeMessageVisibilityBatch"}),
    frozenset({"DeleteMessageBatch", "ChangeMessageVisibilityBatch"}),  # receives still work
)


# -- what a schedule is made of -----------------------------------------------------------


@dataclass
class Plan:
    """What a message's handler does on each attempt."""

    kind: str  # healthy, flaky, poison, reject, exit, retry
    durations: list[float]
    extend: int | None = None  # lease.extend(seconds) halfway through, when set

    @property
    def healthy(self) -> bool:
        return self.kind == "healthy"

    def outcome(self, attempt: int) -> str:
        if self.kind == "healthy":
            return "ok"
        if self.kind == "poison":
            return "raise"
        if self.kind == "reject":
            return "reject"
        # flaky, exit, retry: the first attempt fails that way, the next ones succeed
        return (
            {"flaky": "raise", "exit": "exit", "retry": "retry"}[self.kind]
            if attempt == 1
            else "ok"
        )


@dataclass
class Faults:
    error_rate: dict[str, float]  # per action
    latency: float  # the longest latency of a call
    hang_rate: float  # receives that hang to the read timeout
    outages: list[tuple[float, float, frozenset[str]]]  # (start, end, actions): calls fail
    fatal_rate: float  # non-retryable errors (AccessDenied)
    entry_rate: float  # single entries of a batch failing
    store_latency: float = 0.0  # the longest time an idempotency store call takes
    store_error_rate: float = 0.0  # store calls failing (before or after the store acted)
    deny_deletes: bool = False  # every delete refused (AccessDenied: a policy without it)
    # single entries of a batch the answer leaves unnamed, SQS having acted on them or not
    unnamed_rate: float = 0.0
    # (start, end, acted): every batch answered naming no entry (a proxy's page), SQS
    # having acted on the calls (the proxy forwarded them) or not
    unnamed_windows: list[tuple[float, float, bool]] = field(default_factory=list)
    # receives answered with the last answer again, as far as its messages are held still
    # under those handles (a proxy replaying an answer), alone or beside SQS's own
    replay_rate: float = 0.0
    on: bool = True

    @property
    def none(self) -> bool:
        return self.latency <= 0.05 and not (
            any(self.error_rate.values())
            or self.hang_rate
            or self.outages
            or self.fatal_rate
            or self.entry_rate
            or self.store_latency > 0.05
            or self.store_error_rate
            or self.deny_deletes
            or self.unnamed_rate
            or self.unnamed_windows
            or self.replay_rate
        )


@dataclass
class Schedule:
    seed: int
    fifo: bool
    config: dict[str, Any]
    max_receive_count: int
    plans: dict[int, Plan]
    sends: list[tuple[float, list[int]]]  # (at, message numbers)
    faults: Faults
    stops: list[tuple[float, int]]  # (at, worker index): SIGTERM
    crashes: list[tuple[float, int]]
    workers: int
    horizon: float
    keyed: bool = False  # messages carry idempotency keys; the workers share a store
    # Seconds a message may wait in line while a handler thread is idle (the inbox's
    # hand-over): the simulated handlers take seconds, not the µs the worker's 5 ms is
    # sized for, so the simulator scales it up to make receives wake too few threads.
    hand_over: float = 0.5
    copies: set[int] = field(default_factory=set)  # sent twice under one key
    # Hostile input (drawn apart): message number -> its kind (see HOSTILE), and the
    # receive count SQS reports for "count" messages.
    hostile: dict[int, str] = field(default_factory=dict)
    reported_count: int = 0
    hide_redrive: bool = False  # the workers read no redrive policy (added after they started)
    floods: dict[int, int] = field(default_factory=dict)  # extra copies of one busy key
    coroutines: bool = False  # an async def handler: the plans run as coroutines
    # Its receives on the loop, awaited as the lean client's are (``receive_async``), or
    # on receive threads, as with botocore's client or through a proxy.
    offloaded: bool = False
    # Now and then its handler blocks the loop for 0.5 to 90 s (a blocking call in an
    # async def): the deletes and returns the loop holds up go to the sender threads.
    blocks_loop: bool = False

    @property
    def calm(self) -> bool:
        """No fault, no stop, no crash, no handler blocking the loop (whose receives then
        wait with their answers): then no lease may be lost."""
        return self.faults.none and not self.stops and not self.crashes and not self.blocks_loop

    def describe(self) -> str:
        kinds = defaultdict(int)
        for plan in self.plans.values():
            kinds[plan.kind] += 1
        return (
            f"seed {self.seed}: {'FIFO' if self.fifo else 'standard'}, {self.workers} worker(s), "
            f"{dict(self.config)}, maxReceiveCount {self.max_receive_count}, "
            f"messages {dict(kinds)}, faults {self.faults}, stops {self.stops}, "
            f"crashes {self.crashes}, idempotency keys {self.keyed}, copies {sorted(self.copies)}"
            + (", async def" if self.coroutines else "")
            + (" (receive threads)" if self.offloaded else "")
            + (" (handlers block the loop)" if self.blocks_loop else "")
            + (
                f", hostile {self.hostile} (count {self.reported_count}, redrive hidden "
                f"{self.hide_redrive}), floods {self.floods}"
                if self.hostile or self.floods
                else ""
            )
        )


def draw(seed: int) -> Schedule:
    rng = random.Random(seed)
    wait = rng.choice([0, 0, 1, 5, 20])
    # Some combinations cannot work (a lease shorter than a long poll): the worker
    # must refuse them at start.
    visibility = wait + rng.choice([0, 1, 2, 3, 3, 5, 10, 30])
    marathon = rng.random() < 0.03  # a handler past SQS's 12-hour cap
    if marathon:
        wait, visibility = 20, 3600
    # Now and then a wide worker: more than ten messages of capacity, so several receives
    # and several deletes or renewals are under way at once.
    wide = rng.random() < 0.15
    config = {
        "queue": "jobs",
        "visibility_timeout": visibility,
        "wait_time": wait,
        "concurrency": rng.randint(6, 14) if wide else rng.randint(1, 3),
        # None: --prefetch auto, sized by the handlers' pace and the receives' round trip.
        "prefetch": rng.choice([None, rng.randint(0, 10)]) if wide else rng.randint(0, 3),
        "delete_interval": rng.choice([0.0, 0.2, 1.0]),
        "shutdown_timeout": float(rng.choice([5, 20, 60])),
        "backoff_base": 1.0,
        "backoff_max": 10.0,
    }
    # Now and then a backlog larger than a worker may hold (capacity and a delete batch).
    count = rng.randint(20, 40) if wide or rng.random() < 0.1 else rng.randint(1, 12)
    plans: dict[int, Plan] = {}
    for n in range(count):
        kind = rng.choices(
            ["healthy", "flaky", "poison", "reject", "exit", "retry"], [12, 2, 1, 1, 1, 1]
        )[0]
        durations = [_duration(rng, visibility) for _ in range(8)]
        # extend() to less than the lease, too: a renewal can move a lease's end earlier.
        extend = rng.choice([None, None, None, max(1, visibility // 3), visibility, 2 * visibility])
        if marathon and n == 0:
            kind, durations, extend = "healthy", [45_000.0] * 8, visibility
        plans[n] = Plan(kind, durations, extend)
    horizon = rng.choice([30.0, 60.0, 4 * visibility])
    numbers = list(plans)
    sends: list[tuple[float, list[int]]] = []
    while numbers:
        batch = numbers[: rng.randint(1, 5)]
        numbers = numbers[len(batch) :]
        sends.append((rng.uniform(0, horizon / 2), batch))
    keyed = rng.random() < 0.35
    copies = {n for n in plans if keyed and rng.random() < 0.4}
    for n in sorted(copies):  # a producer's retry: the same body and key, sent again later
        first = next(at for at, numbers in sends if n in numbers)
        sends.append((rng.uniform(first, first + 2 * visibility), [n]))
    sends.sort(key=lambda s: s[0])
    faulty = rng.random() < 0.7
    faults = Faults(
        error_rate={
            action: (rng.choice([0.0, 0.05, 0.2]) if faulty else 0.0)
            for action in ("ReceiveMessage", "DeleteMessageBatch", "ChangeMessageVisibilityBatch")
        },
        latency=rng.choice([0.02, 0.5, 2.0]) if faulty else 0.02,
        hang_rate=rng.choice([0.0, 0.0, 0.1]) if faulty else 0.0,
        outages=[
            (start, start + rng.uniform(1, 2.5 * visibility), rng.choice(OUTAGES))
            for start in sorted(rng.uniform(0, horizon) for _ in range(rng.choice([0, 0, 1, 2])))
        ]
        if faulty
        else [],
        fatal_rate=rng.choice([0.0, 0.0, 0.02]) if faulty else 0.0,
        entry_rate=rng.choice([0.0, 0.05]) if faulty else 0.0,
        store_latency=rng.choice([0.0, 0.5, 3.0]) if faulty and keyed else 0.0,
        store_error_rate=rng.choice([0.0, 0.0, 0.05, 0.2]) if faulty and keyed else 0.0,
        deny_deletes=faulty and rng.random() < 0.1,
    )
    # Now and then answers that name some entries of a batch call neither successful nor
    # failed (a proxy's page botocore reads as an empty answer). Drawn apart too.
    unnamed = random.Random(f"unnamed entries {seed}")
    if faulty and unnamed.random() < 0.2:
        faults.unnamed_rate = unnamed.choice([0.05, 0.3])
    if faulty and unnamed.random() < 0.15:
        start = unnamed.uniform(0, horizon)
        end = start + unnamed.uniform(1, 2.5 * visibility)
        faults.unnamed_windows.append((start, end, unnamed.random() < 0.5))
    # Now and then a receive answered again with messages held (a proxy replaying). Apart.
    replay = random.Random(f"replayed receives {seed}")
    if faulty and replay.random() < 0.15:
        faults.replay_rate = replay.choice([0.05, 0.3])
    workers = rng.choice([1, 1, 2])
    stops = [(rng.uniform(0, horizon), w) for w in range(workers) if rng.random() < 0.4]
    crashes = [
        (rng.uniform(0, horizon), w)
        for w in range(workers)
        if rng.random() < 0.15 and w not in {s[1] for s in stops}
    ]
    # Now and then a batch handler. Drawn apart, so that every other seed replays the
    # schedule it drew before batch handlers existed.
    batching = random.Random(f"batch {seed}")
    if batching.random() < 0.25:
        config["batch_size"] = batching.choice([2, 3, 5, 10, 12])
        config["batch_window"] = batching.choice([0.0, 0.0, 0.5, 3.0])
    # Now and then a long --delete-interval, past a stop's give-up (5 s at least): ops
    # that may wait to fill a batch must still go once a stop begins. Drawn apart too.
    interval = random.Random(f"interval {seed}")
    if interval.random() < 0.15:
        config["delete_interval"] = interval.choice([5.0, 10.0])
    # Now and then a busy line: many handler threads, most handlers quick, a few slow, so
    # that receives wake fewer threads than messages and the watcher hands over. Drawn
    # apart too, with the hand-over itself (seconds, for handlers of seconds).
    line = random.Random(f"busy line {seed}")
    hand_over = line.choice([1.0, 5.0, 30.0])
    if line.random() < 0.2:
        config["concurrency"] = line.randint(4, 14)
        for plan in plans.values():
            if plan.durations[0] < 45_000.0:  # not the marathon
                plan.durations = [
                    d if line.random() < 0.15 else line.uniform(0, 0.3) for d in plan.durations
                ]
    # Now and then many receive threads for one message at a time (capacity 40 to 120: 4
    # to 12 of them) and a backlog that keeps them coming back full: each change of room
    # wakes one of them, and the one that starts a receive wakes the next. Drawn apart too.
    many = random.Random(f"many receivers {seed}")
    if many.random() < 0.06 and "batch_size" not in config:
        config["concurrency"] = many.randint(20, 40)
        config["prefetch"] = many.choice([None, many.randint(20, 80)])
        _add_backlog(many, many.randint(60, 120), 30, plans, sends, horizon)
    # Now and then as many lease senders as a worker may have (32: from 311 messages of
    # concurrency and prefetch): batches of 12 on 14 to 20 threads, and a backlog that
    # keeps their deletes coming, so the held bound counts a batch per sender at the
    # cap. Drawn apart too.
    cap = random.Random(f"senders cap {seed}")
    if cap.random() < 0.03 and "batch_size" not in config:
        config["concurrency"] = cap.randint(14, 20)
        config["batch_size"] = 12
        config["batch_window"] = cap.choice([0.0, 0.5])
        config["prefetch"] = None
        _add_backlog(cap, cap.randint(150, 300), 60, plans, sends, horizon)
    schedule = Schedule(
        seed=seed,
        hand_over=hand_over,
        fifo=rng.random() < 0.3,
        config=config,
        max_receive_count=rng.choice([3, 5]),
        plans=plans,
        sends=sends,
        faults=faults,
        stops=stops,
        crashes=crashes,
        workers=workers,
        horizon=horizon,
        keyed=keyed,
        copies=copies,
    )
    _draw_hostile(schedule, random.Random(f"hostile {seed}"))
    # Now and then an async def handler (not a batch one: those are def), its coroutines
    # on the worker's event loop, up to --concurrency at once. Drawn apart too.
    drawn = random.Random(f"coroutines {seed}")
    if drawn.random() < 0.2 and "batch_size" not in config:
        schedule.coroutines = True
        schedule.offloaded = drawn.random() < 0.3
        schedule.blocks_loop = drawn.random() < 0.3
    return schedule


def _add_backlog(
    rng: random.Random,
    count: int,
    chunk: int,
    plans: dict[int, Plan],
    sends: list[tuple[float, list[int]]],
    horizon: float,
) -> None:
    """``count`` more healthy messages, each quick or up to 2 s, sent ``chunk`` at a time
    in the schedule's first half."""
    extra = list(range(len(plans), len(plans) + count))
    for n in extra:
        plans[n] = Plan("healthy", [rng.choice([0.0, rng.uniform(0, 2)])] * 8)
    while extra:
        sends.append((rng.uniform(0, horizon / 2), extra[:chunk]))
        extra = extra[chunk:]
    sends.sort(key=lambda s: s[0])


# What a producer can send, and SQS (or another server) report, that no step may choke on:
# a receive count past any exponent, a body nested past Python's JSON parser with the S3
# pointer's size attribute, the same body under a JSON idempotency key, a body of escapes,
# and a flood of copies of one key whose first delivery runs long.
HOSTILE = ("count", "pointer", "deep", "escapes")
DEEP_BODY = "[" * 3000 + "]" * 3000


def _draw_hostile(schedule: Schedule, rng: random.Random) -> None:
    """Now and then hostile messages among the ordinary ones, from their own RNG: every
    seed replays the schedule it drew before they existed, plus these."""
    if rng.random() >= 0.3:
        return
    numbers = sorted(schedule.plans)
    for n in rng.sample(numbers, k=min(len(numbers), rng.randint(1, 3))):
        schedule.hostile[n] = rng.choice(HOSTILE)
    schedule.reported_count = rng.choice([1025, 5000, 2**31 - 1, 2**31])
    if "count" in schedule.hostile.values():
        # A count this high never reaches a worker that knows the redrive policy: SQS
        # would have moved the message. The policy added after the workers started, then.
        schedule.hide_redrive = True
        for n, kind in schedule.hostile.items():
            if kind == "count":  # fails once, so its backoff is computed from the count
                schedule.plans[n].kind = "flaky"
    if schedule.keyed:
        schedule.config["idempotency_key"] = "json:n"  # read from the body: deep ones break it
        if rng.random() < 0.5:
            n = rng.choice(numbers)
            plan = schedule.plans[n]
            # Its first delivery runs long: past the progress invariant's window.
            plan.kind = "healthy"
            plan.durations[0] = max(3.0 * schedule.config["visibility_timeout"], 200.0)
            schedule.floods[n] = rng.randint(8, 20)
            first = next(at for at, sent in schedule.sends if n in sent)
            schedule.sends.append((first + 1.0, [n] * schedule.floods[n]))
            schedule.sends.sort(key=lambda s: s[0])


def _duration(rng: random.Random, visibility: int) -> float:
    return rng.choices(
        [0.0, rng.uniform(0, 2), rng.uniform(0.3, 3) * visibility, rng.uniform(4, 6) * visibility],
        [3, 4, 2, 1],
    )[0]


# -- the simulated parts ------------------------------------------------------------------


def _slept(steps: Generator[Step, Any, T], sleep: Callable[[float], object]) -> T:
    """What ``steps`` returns, sleeping each wait it yields and making each call."""
    value: Any = None
    try:
        while True:
            step = steps.send(value)
            value = step() if callable(step) else sleep(step)
    except StopIteration as done:
        result: T = done.value
        return result


class SimTransport:
    """The in-memory SQS seen through a faulty network, one attempt per call."""

    def __init__(self, inner: MemoryTransport, world: World) -> None:
        self.inner = inner
        self.world = world
        self.info: QueueInfo = inner.info
        if world.schedule.hide_redrive and inner.info.name == world.queue_name:
            self.info = replace(inner.info, dead_letter_arn=None, max_receive_count=None)
        self.requests = inner.requests
        self.request_errors = inner.request_errors
        self.last: list[Envelope] = []  # the last answer to a receive that held messages
        # The receipt handles the worker holds (set once the worker is made).
        self.holds: Callable[[], Collection[str]] = frozenset
        self._service: Helpers | None = None  # where a receive awaited on a loop long-polls

    def _fault(self, action: str) -> TransportError | None:
        faults, clock = self.world.faults, self.world.clock
        if not faults.on:
            return None
        now = clock.monotonic() - self.world.start
        fault = self._draw_fault(action, now)
        outage = any(start <= now < end for start, end, _ in faults.outages)
        if fault is not None and (not fault.retryable or outage):
            # An outage or a refusal: the worker may rightly pause its receives, or hold
            # what it cannot delete. (A passing error here and there must not starve it.)
            self.world.last_fault_at = clock.monotonic()
        return fault

    def _draw_fault(self, action: str, now: float) -> TransportError | None:
        faults, clock = self.world.faults, self.world.clock
        if any(start <= now < end and action in down for start, end, down in faults.outages):
            return TransportError(
                f"{action}: ServiceUnavailable", code="ServiceUnavailable", retryable=True
            )
        if action == "DeleteMessageBatch" and faults.deny_deletes:
            return TransportError(f"{action}: AccessDenied", code="AccessDenied", retryable=False)
        rng = clock.rng
        if rng.random() < faults.fatal_rate:
            return TransportError(f"{action}: AccessDenied", code="AccessDenied", retryable=False)
        if rng.random() < faults.error_rate.get(action, 0.0):
            code = rng.choice(TRANSIENT)
            return TransportError(f"{action}: {code}", code=code, retryable=True)
        return None

    def _latency(self) -> float:
        faults = self.world.faults
        if not faults.on:
            return 0.02
        return self.world.clock.rng.choice([0.02, 0.02, faults.latency])

    def _call(self, action: str, act: Callable[[], Any]) -> Any:
        return _slept(self._call_steps(action, act), self.world.clock.sleep)

    def _call_steps(self, action: str, act: Callable[[], Any]) -> Generator[Step, Any, Any]:
        """One attempt: latency, the server acting, and maybe an error before or after;
        yields the seconds to wait in between (a thread sleeps them, a coroutine awaits)."""
        clock = self.world.clock
        fault = self._fault(action)
        latency = self._latency()
        acted_first = clock.rng.random() < 0.5  # a fault after the server acted: answer lost
        # SQS checks permissions before it acts: an AccessDenied never did anything.
        if fault is not None and (not acted_first or fault.code == "AccessDenied"):
            yield latency
            raise fault
        yield latency / 2
        result = yield act
        yield latency / 2
        if fault is not None:
            if action == "ReceiveMessage":  # received, never seen: a receive spent
                for envelope in result:
                    self.world.trouble[_envelope_number(envelope)].add("answer lost")
            raise fault
        return result

    def receive(
        self,
        max_messages: int,
        wait_seconds: int,
        visibility_timeout: int,
        attempt_id: str | None = None,
    ) -> list[Envelope]:
        steps = self._receive_steps(max_messages, wait_seconds, visibility_timeout, attempt_id)
        return _slept(steps, self.world.clock.sleep)

    def receives_on_loop(self) -> bool:
        """As the lean client's: on the loop (or on threads, where no such call is)."""
        return not self.world.schedule.offloaded

    async def receive_async(
        self,
        max_messages: int,
        wait_seconds: int,
        visibility_timeout: int,
        attempt_id: str | None = None,
    ) -> list[Envelope]:
        """``receive`` as the lean client's on the loop: its waits are the loop's, and the
        in-memory SQS's long poll waits on a thread (SQS's own wait, not the worker's)."""
        steps = self._receive_steps(max_messages, wait_seconds, visibility_timeout, attempt_id)
        got: list[Envelope] = await self._awaited(steps)
        return got

    async def _awaited(self, steps: Generator[Step, Any, T]) -> T:
        """What ``steps`` returns, awaiting each wait it yields on the loop, and making
        each call on a thread (the in-memory SQS's, as SQS acts apart from the worker)."""
        loop = asyncio.get_running_loop()
        if self._service is None:
            self._service = Helpers(self.world.clock, 32, "sim-sqs")
        value: Any = None
        try:
            while True:
                step = steps.send(value)
                if callable(step):
                    value = await loop.run_in_executor(self._service, step)
                else:
                    value = await asyncio.sleep(step)
        except StopIteration as done:
            result: T = done.value
            return result

    def _receive_steps(
        self,
        max_messages: int,
        wait_seconds: int,
        visibility_timeout: int,
        attempt_id: str | None,
    ) -> Generator[Step, Any, list[Envelope]]:
        clock, faults = self.world.clock, self.world.faults
        if faults.on and clock.rng.random() < faults.hang_rate:
            self.world.last_fault_at = clock.monotonic() + wait_seconds + READ_TIMEOUT_EXTRA
            yield wait_seconds + READ_TIMEOUT_EXTRA
            raise TransportError(
                "ReceiveMessage: read timeout", code="ConnectionError", retryable=True
            )
        page = self._page()
        if page is not None:  # a proxy's page, read as an empty answer, back at once or not
            self.world.last_fault_at = clock.monotonic()
            yield self._latency()
            if page:  # the proxy forwarded it: SQS long-polled and hid what it returned
                for envelope in self.inner.receive(
                    max_messages, wait_seconds, visibility_timeout, attempt_id
                ):
                    self.world.trouble[_envelope_number(envelope)].add("answer lost")
                self.world.last_fault_at = clock.monotonic()
            return []
        replay = self._replay()
        if replay and clock.rng.random() < 0.5:  # the replay alone, if still held
            yield self._latency()
            replayed = self._held_of_last()
            if replayed:
                self.world.last_fault_at = clock.monotonic()  # the receives rightly pause
                return replayed
        got: list[Envelope] = yield from self._call_steps(
            "ReceiveMessage",
            lambda: self.inner.receive(max_messages, wait_seconds, visibility_timeout, attempt_id),
        )
        replayed = self._held_of_last() if replay else []
        self.last = got or self.last
        schedule = self.world.schedule
        return replayed + [
            replace(
                e,
                attributes={
                    **e.attributes,
                    "ApproximateReceiveCount": str(schedule.reported_count + e.receive_count),
                },
            )
            if schedule.hostile.get(_envelope_number(e)) == "count"
            else e
            for e in got
        ]

    def _replay(self) -> bool:
        """Whether this receive's answer replays the last one (SQS never does): now and
        then, as a proxy replaying answers would."""
        faults = self.world.faults
        if not (faults.on and faults.replay_rate and self.last):
            return False
        return self.world.clock.rng.random() < faults.replay_rate

    def _held_of_last(self) -> list[Envelope]:
        """The last answer's messages the worker holds still under those handles, as the
        answer comes. (One it let go of would be taken as a new delivery, and run again:
        a replay the worker cannot tell, out of what the invariants allow.)"""
        held = self.holds()
        return [e for e in self.last if e.receipt_handle in held]

    def _page(self) -> bool | None:
        """Inside a window of a proxy's pages: whether it forwarded the calls to SQS (True)
        or not (False); None outside every window."""
        faults = self.world.faults
        now = self.world.clock.monotonic() - self.world.start
        for start, end, acted in faults.unnamed_windows if faults.on else []:
            if start <= now < end:
                return acted
        return None

    def _batch(
        self, action: str, entries: Sequence[Any], send: Callable[[Sequence[Any]], BatchResult]
    ) -> BatchResult:
        return _slept(self._batch_steps(action, entries, send), self.world.clock.sleep)

    def _batch_steps(
        self, action: str, entries: Sequence[Any], send: Callable[[Sequence[Any]], BatchResult]
    ) -> Generator[Step, Any, BatchResult]:
        faults, rng = self.world.faults, self.world.clock.rng
        failing = {e[0] for e in entries if faults.on and rng.random() < faults.entry_rate}
        # Entries the answer will not name: SQS acted on some of them, not on the others.
        unnamed = [
            e[0]
            for e in entries
            if faults.on and faults.unnamed_rate and e[0] not in failing
            if rng.random() < faults.unnamed_rate
        ]
        skipped = {entry_id for entry_id in unnamed if rng.random() < 0.5}
        acted = self._page()
        if acted is not None:  # the worker may rightly hold what it cannot settle
            self.world.last_fault_at = self.world.clock.monotonic()
            # A page names no entry, not even one SQS refused (those stay undone).
            unnamed = [e[0] for e in entries]
            skipped = set() if acted else set(unnamed)

        gone = self.world.gone_handles
        for entry in entries:
            if entry[1] in gone:
                self.world.violation(f"{action} again for a receipt handle SQS said was gone")

        def act() -> BatchResult:
            passed = [e for e in entries if e[0] not in failing and e[0] not in skipped]
            if action == "ChangeMessageVisibilityBatch":  # applied, its answer lost or not
                now = self.world.clock.monotonic()
                for _, handle, seconds in passed:
                    self.world.applied_until[handle] = now + seconds
            if action == "DeleteMessageBatch":  # a stale handle's delete deletes nothing
                world = self.world
                for _, handle in passed:
                    message_id = world.handle_ids.get(handle, "")
                    state = world.sqs_state(message_id)
                    if state is not None and state[0] == handle:
                        world.deleted_by[message_id] = handle
                    elif world.deleted_by.get(message_id) != handle:  # not this receive's
                        world.stale_deletes.add(handle)
            result = send(passed) if passed else BatchResult()
            for entry_id in sorted(failing):
                result.failed.append(EntryFailure(entry_id, "InternalError", "try again", False))
            if unnamed:
                result.succeeded = [i for i in result.succeeded if i not in unnamed]
                result.failed = [f for f in result.failed if f.id not in unnamed]
                result.failed += [EntryFailure(i, UNANSWERED, "not named", False) for i in unnamed]
            return result

        result: BatchResult = yield from self._call_steps(action, act)
        handles = {e[0]: e[1] for e in entries}
        gone.update(handles[f.id] for f in result.failed if _says_gone(f))  # the worker saw it
        return result

    def delete_batch(self, entries: Sequence[tuple[str, str]]) -> BatchResult:
        return self._batch("DeleteMessageBatch", entries, self.inner.delete_batch)

    def change_visibility_batch(self, entries: Sequence[tuple[str, str, int]]) -> BatchResult:
        return self._batch(
            "ChangeMessageVisibilityBatch", entries, self.inner.change_visibility_batch
        )

    async def delete_batch_async(self, entries: Sequence[tuple[str, str]]) -> BatchResult:
        """``delete_batch`` as the lean client's on the loop (receives_on_loop)."""
        steps = self._batch_steps("DeleteMessageBatch", entries, self.inner.delete_batch)
        return await self._awaited(steps)

    async def change_visibility_batch_async(
        self, entries: Sequence[tuple[str, str, int]]
    ) -> BatchResult:
        action, send = "ChangeMessageVisibilityBatch", self.inner.change_visibility_batch
        return await self._awaited(self._batch_steps(action, entries, send))

    def send_batch(self, messages: Sequence[OutgoingMessage]) -> BatchResult:
        result: BatchResult = self._call(
            "SendMessageBatch", lambda: self.inner.send_batch(messages)
        )
        return result

    def counts(self) -> QueueCounts:
        counts: QueueCounts = self._call("GetQueueAttributes", self.inner.counts)
        return counts

    def open(self, queue: str) -> SimTransport:
        return SimTransport(self.inner.open(queue), self.world)

    def close(self) -> None:
        if self._service is not None:  # its threads end once idle
            self._service.shutdown(cancel_futures=True)


class SimStore:
    """The idempotency store the workers share: a ``MemoryStore`` behind delays and errors.

    An error may come before the store acted or after (the answer lost)."""

    def __init__(self, world: World) -> None:
        self.inner = MemoryStore()
        self.world = world

    def _call(self, operation: str, act: Callable[[], Any]) -> Any:
        faults, clock = self.world.faults, self.world.clock
        if not faults.on:
            return act()
        clock.sleep(clock.rng.choice([0.0, 0.01, faults.store_latency]))
        failing = clock.rng.random() < faults.store_error_rate
        if failing and clock.rng.random() < 0.5:
            raise StoreError(f"store {operation}: unavailable")
        result = act()
        if failing:
            raise StoreError(f"store {operation}: connection reset after the write")
        return result

    def claim(
        self, key: str, owner: str, digest: str, expires_at: float, now: float
    ) -> Record | None:
        record: Record | None = self._call(
            "claim", lambda: self.inner.claim(key, owner, digest, expires_at, now)
        )
        return record

    def renew(self, leases: Sequence[Lease]) -> list[str]:
        lost: list[str] = self._call("renew", lambda: self.inner.renew(leases))
        return lost

    def complete(self, key: str, owner: str, digest: str, expires_at: float, now: float) -> bool:
        done: bool = self._call(
            "complete", lambda: self.inner.complete(key, owner, digest, expires_at, now)
        )
        return done

    def release(self, key: str, owner: str) -> None:
        self._call("release", lambda: self.inner.release(key, owner))

    def close(self) -> None:
        pass


class Recorder(Observer):
    """One worker's events, checked against SQS's state as they happen."""

    def __init__(self, world: World, index: int) -> None:
        self.world = world
        self.index = index
        self.handles: set[str] = set()
        self.lost: set[str] = set()
        self.near_cap: set[str] = set()  # at SQS's 12-hour cap: the lease must end
        self.unsettled = 0  # deletes and returns shutdown could not get SQS to take
        self.leased_until: dict[str, float] = {}  # handle -> the end of its last renewal

    def lease_near_cap(self, message: Message, seconds_left: float) -> None:
        self.near_cap.add(message.receipt_handle)

    def shutdown_finished(self, clean: bool, handed_back: int, unsettled: int) -> None:
        self.unsettled = unsettled

    def leases_extended(self, messages: Sequence[Message], seconds: int) -> None:
        until = self.world.clock.monotonic() + seconds  # answered: SQS's end is no later
        self.leased_until.update((m.receipt_handle, until) for m in messages)

    def received(self, messages: Sequence[Message]) -> None:
        self.handles.update(m.receipt_handle for m in messages)
        until = self.world.clock.monotonic() + self.world.schedule.config["visibility_timeout"]
        self.leased_until.update((m.receipt_handle, until) for m in messages)
        self.world.handle_ids.update((m.receipt_handle, m.message_id) for m in messages)

    def handler_started(self, message: Message) -> None:
        state = self.world.sqs_state(message.message_id)
        if state is None or state[0] != message.receipt_handle:
            self.world.violation(
                f"a handler started on {_n(message)} whose receipt handle is stale"
            )
        elif state[1] <= self.world.clock.monotonic():
            self.world.violation(f"a handler started on {_n(message)} whose SQS lease ran out")

    def deleted(self, messages: Sequence[Message]) -> None:
        for message in messages:
            if message.receipt_handle in self.world.stale_deletes:
                self.world.violation(
                    f"{_n(message)} was reported deleted, but its delete named a stale receipt "
                    "handle: SQS deleted nothing"
                )
            elif self.world.sqs_state(message.message_id) is not None:
                self.world.violation(f"{_n(message)} was reported deleted, but SQS still holds it")

    def _trouble(self, message: Message, what: str) -> None:
        self.world.trouble[_number(message)].add(what)

    def handler_failed(
        self,
        message: Message,
        error: BaseException,
        duration: float,
        retry_in: float,
        last_attempt: bool,
    ) -> None:
        self._trouble(message, "failed")

    def handler_retry_requested(
        self, message: Message, request: Retry, duration: float, retry_in: float, last: bool
    ) -> None:
        self._trouble(message, "retry requested")

    def rejected_copy_failed(
        self,
        message: Message,
        error: BaseException,
        duration: float,
        retry_in: float,
        last_attempt: bool,
    ) -> None:
        self._trouble(message, "rejected, not moved")

    def handler_rejected(
        self, message: Message, error: BaseException, duration: float, dead_letter: str | None
    ) -> None:
        self._trouble(message, "rejected")

    def step_failed(
        self, message: Message, error: BaseException, retry_in: float, last_attempt: bool
    ) -> None:
        self._trouble(message, "worker error")

    def step_failed_settled(self, message: Message, error: BaseException) -> None:
        self._trouble(message, "worker error after settling")

    def rejected_copy_refused(self, message: Message, error: BaseException, reason: str) -> None:
        self._trouble(message, "rejected, copy refused")

    def handler_skipped(self, message: Message, reason: str) -> None:
        self._trouble(message, "skipped")
        if self.world.schedule.calm and message.receipt_handle not in self.near_cap:
            self.world.violation(f"{_n(message)} was skipped with no fault injected: {reason}")

    def lease_lost(self, message: Message, reason: str) -> None:
        self._trouble(message, "lease lost")
        if self.world.schedule.calm and message.receipt_handle not in self.near_cap:
            self.world.violation(f"{_n(message)} lost its lease with no fault injected: {reason}")
        self.lost.add(message.receipt_handle)  # SQS's to return now, at its own timeout

    def delete_failed(self, message: Message, reason: str, will_retry: bool) -> None:
        self._trouble(message, "delete failed")

    def deleted_after_lease_lost(self, message: Message) -> None:
        self._trouble(message, "deleted after its lease was lost")

    def returned(self, messages: Sequence[Message], delay: float, reason: str) -> None:
        now = self.world.clock.monotonic()
        for message in messages:
            self.world.trouble[_number(message)].add(f"returned: {reason}")
            self.world.returned_until[message.receipt_handle] = now + delay

    def handler_succeeded(self, message: Message, duration: float) -> None:
        self.world.succeeded.add(_number(message))

    def duplicate_suppressed(self, message: Message) -> None:
        self.world.succeeded.add(_number(message))


class Trace(Observer):
    """Every event of every worker, with its time: what a failing seed prints."""

    def __init__(self, world: World, index: int) -> None:
        for name in [n for n in vars(Observer) if not n.startswith("_")]:
            setattr(self, name, self._note(world, index, name))

    @staticmethod
    def _note(world: World, index: int, name: str) -> Callable[..., None]:
        def note(*args: Any) -> None:
            shown = ", ".join(_show(a) for a in args)
            world.trace.append(
                f"{world.clock.monotonic() - world.start:8.2f} w{index} {name}({shown})"
            )

        return note


def _show(value: object) -> str:
    if isinstance(value, Message):
        return _n(value)
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], Message):
        return "[" + ", ".join(_n(m) for m in value) + "]"
    text = repr(value)
    return text if len(text) < 60 else text[:57] + "..."


def _says_gone(failure: EntryFailure) -> bool:
    """SQS's answer that a receipt handle no longer owns its message (judged here, not by
    the code under test)."""
    return failure.code in ("ReceiptHandleIsInvalid", "MessageNotInflight") or (
        "does not exist or is not available" in failure.message
    )


def _number(message: Message) -> int:
    return _number_of(message.body, message.raw_message_attributes)


def _envelope_number(envelope: Envelope) -> int:
    return _number_of(envelope.body, envelope.message_attributes)


def _number_of(body: str, attributes: Any) -> int:
    """A message's number: a hostile one carries it in an attribute, its body being what
    it is; an ordinary one in its body."""
    if NUMBER in attributes:
        return int(attributes[NUMBER]["StringValue"])
    return int(json.loads(body)["n"])


NUMBER = "sim-n"


def _n(message: Message) -> str:
    return f"message {_number(message)} (receive {message.receive_count})"


# -- the world ----------------------------------------------------------------------------


@dataclass
class Running:
    worker: Worker
    recorder: Recorder
    group: str
    stopped_at: float | None = None
    shutdown_result: list[int] = field(default_factory=list)
    crashed: bool = False
    checked: bool = False  # its state after shutdown was checked
    helpers: Helpers | None = None  # its coroutine handler's, for lease.extend()


class World:
    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule
        self.clock = SimClock(schedule.seed)
        self.start = self.clock.monotonic()
        self.faults = schedule.faults
        try:
            self.memory = MemorySQS(self.clock, seed=schedule.seed)  # type: ignore[call-arg]
        except TypeError:
            self.memory = MemorySQS(self.clock)
        name = "jobs.fifo" if schedule.fifo else "jobs"
        attributes = {"FifoQueue": "true"} if schedule.fifo else {}
        self.memory.create_queue_with_dlq(name, schedule.max_receive_count, **attributes)
        self.queue_name = name
        self.dlq_name = name.removesuffix(".fifo") + "-dlq" + (".fifo" if schedule.fifo else "")
        self.violations: list[str] = []
        self.trouble: defaultdict[int, set[str]] = defaultdict(set)
        self.succeeded: set[int] = set()
        self.attempts: defaultdict[int, int] = defaultdict(int)
        self.workers: list[Running] = []
        self.trace: list[str] = []
        self.returned_until: dict[str, float] = {}  # receipt handle -> hidden until, as asked
        # Receipt handle -> hidden until, by the last visibility change SQS applied (a
        # renewal whose answer was lost too: the worker knows it may hold that long).
        self.applied_until: dict[str, float] = {}
        self.gone_handles: set[str] = set()  # handles SQS answered as no longer owning a message
        self.store = SimStore(self) if schedule.keyed else None
        self.running_keys: defaultdict[int, list[Message]] = defaultdict(list)
        self.loop_blocked: set[str] = set()  # the workers whose loop a handler blocks now
        self.sent: defaultdict[int, int] = defaultdict(int)  # copies sent of each message
        self.stale_deletes: set[str] = set()  # handles a delete named after a newer receive
        self.handle_ids: dict[str, str] = {}  # receipt handle -> message id, as received
        self.deleted_by: dict[str, str] = {}  # message id -> the handle whose delete removed it
        self.last_fault_at = -math.inf  # when a fault was last injected (SQS or the store)
        self.free_since: dict[int, float] = {}  # worker -> since when it has had free room

    # -- SQS's side, read directly ---------------------------------------------------

    def sqs_state(self, message_id: str) -> tuple[str | None, float] | None:
        """(current receipt handle, visible at) of a message the queue holds, else None."""
        message = self.memory._queues[self.queue_name].messages.get(message_id)
        if message is None:
            return None
        return message.handle, message.visible_at

    def violation(self, text: str) -> None:
        self.violations.append(f"t={self.clock.monotonic() - self.start:.2f}: {text}")

    # -- the handler -------------------------------------------------------------------

    def handler(self, message: Message) -> None:
        with self._running_key(message):
            self._handle(message)

    @contextlib.contextmanager
    def _running_key(self, message: Message) -> Iterator[None]:
        """With idempotency keys: the handler runs under its key, checked not to overlap
        another handler of the key on a live lease."""
        if self.store is None:
            yield
            return
        self._check_no_overlap(message)
        self.running_keys[_number(message)].append(message)
        try:
            yield
        finally:
            self.running_keys[_number(message)].remove(message)

    def batch_handler(self, messages: list[Message]) -> BatchResult_:
        """Each message's plan in turn, on this thread; those that failed are reported,
        and a SystemExit among them fails the whole batch. The batch's messages all start
        when it does (the worker began each on a live lease): the overlap of keys is
        checked then, and each counts as running until the batch ends."""
        if self.store is not None:
            for message in messages:
                self._check_no_overlap(message)
                self.running_keys[_number(message)].append(message)
        failed: dict[Message, BaseException] = {}
        exit_code = None
        try:
            for message in messages:
                try:
                    self._handle(message)
                except SystemExit as exc:
                    exit_code = exc.code
                except Exception as exc:
                    failed[message] = exc
        finally:
            if self.store is not None:
                for message in messages:
                    self.running_keys[_number(message)].remove(message)
        if exit_code is not None:
            raise SystemExit(exit_code)
        return BatchResult_(failed)

    def _check_no_overlap(self, message: Message) -> None:
        """Two handlers of one key never overlap while the first one's SQS lease lives."""
        now = self.clock.monotonic()
        for other in self.running_keys[_number(message)]:
            state = self.sqs_state(other.message_id)
            if state is not None and state[0] == other.receipt_handle and state[1] > now:
                self.violation(
                    f"{_n(message)} started while {_n(other)} of the same idempotency key "
                    "runs on a live lease"
                )

    async def coroutine_handler(self, message: Message, helpers: Helpers) -> None:
        """``handler`` as an ``async def``: its waits are ``asyncio.sleep`` on the event
        loop (simulated time), and ``lease.extend()``, which blocks, runs on a helper thread,
        as the docs tell a coroutine to call it."""
        with self._running_key(message):
            plan, attempt, duration = self._attempt(message)
            if plan.extend is not None:
                await asyncio.sleep(duration / 2)

                def extend(extend: int = plan.extend) -> None:  # timed where it runs: a
                    asked = self.clock.monotonic()  # blocked loop delays its resumption
                    with contextlib.suppress(LeaseLost):
                        message.lease.extend(extend)
                    self._check_extend(message, asked)

                await asyncio.get_running_loop().run_in_executor(helpers, extend)
                await asyncio.sleep(duration / 2)
            elif self.schedule.blocks_loop and self.clock.rng.random() < 0.5:
                blocked = min(duration, self.clock.rng.uniform(0.5, 90))
                group = self.clock.current().group
                self.loop_blocked.add(group)  # the simulated thread sleeps, the loop stalls
                try:
                    self.clock.sleep(blocked)
                finally:
                    self.loop_blocked.discard(group)
                await asyncio.sleep(duration - blocked)
            else:
                await asyncio.sleep(duration)
            self._outcome(plan, attempt)

    def _attempt(self, message: Message) -> tuple[Plan, int, float]:
        """The message's plan, which attempt this is, and how long it takes."""
        number = _number(message)
        plan = self.schedule.plans[number]
        self.attempts[number] += 1
        attempt = self.attempts[number]
        return plan, attempt, plan.durations[min(attempt, len(plan.durations)) - 1]

    def _check_extend(self, message: Message, asked: float) -> None:
        took = self.clock.monotonic() - asked
        bound = self.schedule.config["visibility_timeout"] + 4 * self.faults.latency + 2
        if took > bound:
            self.violation(f"lease.extend() on {_n(message)} took {took:.1f} s")

    def _handle(self, message: Message) -> None:
        plan, attempt, duration = self._attempt(message)
        clock = self.clock
        if plan.extend is not None:
            clock.sleep(duration / 2)
            asked = clock.monotonic()
            with contextlib.suppress(LeaseLost):
                message.lease.extend(plan.extend)
            self._check_extend(message, asked)
            clock.sleep(duration / 2)
        else:
            clock.sleep(duration)
        self._outcome(plan, attempt)

    def _outcome(self, plan: Plan, attempt: int) -> None:
        """Raise as the plan says this attempt ends (or return: it succeeded)."""
        outcome = plan.outcome(attempt)
        if outcome == "raise":
            raise RuntimeError("the handler failed")
        if outcome == "reject":
            raise Reject("a poison message")
        if outcome == "exit":
            raise SystemExit(3)
        if outcome == "retry":
            raise Retry(delay=2)

    # -- workers -----------------------------------------------------------------------

    def start_worker(self) -> Running | None:
        index = len(self.workers)
        options = dict(self.schedule.config, queue=self.queue_name)
        try:
            config = WorkerConfig(**options)
        except ConfigError:
            return None
        recorder = Recorder(self, index)
        batched = config.batch_size is not None
        transport = SimTransport(self.memory.transport(self.queue_name), self)
        helpers = Helpers(self.clock, 4, "sim-extend") if self.schedule.coroutines else None
        if batched:
            handler: Any = Handler(self.batch_handler, {}, batch=True)
        elif helpers is not None:

            async def handler(message: Message) -> None:
                await self.coroutine_handler(message, helpers)

        else:
            handler = self.handler
        worker = Worker(
            handler,
            config,
            transport=transport,
            clock=self.clock,
            observer=Observers([recorder, Trace(self, index)]),
            idempotency_store=self.store,
            backoff=Backoff(
                config.backoff_base, config.backoff_max, random.Random(self.schedule.seed + index)
            ),
        )
        worker.inbox.HAND_OVER = self.schedule.hand_over
        transport.holds = lambda: worker.keeper.machine.held if worker.keeper else ()
        group = f"worker-{index}"
        self.clock.group = group
        worker.start()
        if isinstance(worker.runner, Coroutines):  # its threads have not run yet
            worker.runner.loop.beat = LOOP_BEAT
        self.clock.group = "main"
        running = Running(worker, recorder, group, helpers=helpers)
        self.workers.append(running)
        return running

    def stop_worker(self, running: Running) -> None:
        if running.stopped_at is not None or running.crashed:
            return
        running.stopped_at = self.clock.monotonic()
        running.worker.request_stop()
        self.clock.group = running.group
        self.clock.spawn("shutdown", lambda: self._shut_down(running))
        self.clock.group = "main"

    def _shut_down(self, running: Running) -> None:
        running.shutdown_result.append(running.worker.shutdown())
        if running.helpers is not None:
            running.helpers.shutdown()

    def crash_worker(self, running: Running) -> None:
        if running.stopped_at is not None or running.crashed:
            return
        running.crashed = True
        self.clock.freeze(running.group)

    # -- running -----------------------------------------------------------------------

    def run_until(self, moment: float) -> None:
        clock = self.clock
        while True:
            clock.settle()
            self.check()
            nxt = clock.next_deadline()
            if nxt is None or nxt > moment:
                clock.advance_to(moment)
                clock.settle()
                self.check()
                return
            if nxt <= clock.monotonic():
                nxt = clock.monotonic()  # a wait whose deadline has passed: run it now
            clock.advance_to(nxt)

    def act(self, action: Callable[[], object]) -> None:
        action()
        self.clock.settle()
        self.check()

    def check(self) -> None:
        now = self.clock.monotonic()
        for running in self.workers:
            worker = running.worker
            if running.crashed or worker.keeper is None:
                continue
            held = worker.keeper.held_count()
            for broken in worker.keeper.check():  # the lease machine's own invariants
                self.violation(f"worker {running.recorder.index}'s lease machine: {broken}")
            if asleep := _lease_thread_asleep_past_work(self.clock, running.group, worker, now):
                self.violation(f"worker {running.recorder.index}'s lease thread {asleep}")
            if held > worker.held_bound:
                self.violation(
                    f"worker {running.recorder.index} holds {held} > {worker.held_bound}"
                )
            if running.stopped_at is not None and not running.shutdown_result:
                config = worker.config
                bound = (
                    config.shutdown_timeout
                    + config.wait_time
                    + READ_TIMEOUT_EXTRA
                    + 10
                    + 8 * self.faults.latency
                )
                if now - running.stopped_at > bound:
                    self.violation(
                        f"worker {running.recorder.index}'s shutdown took over {bound:.0f} s"
                    )
                    running.stopped_at = now  # report once
            if running.shutdown_result and not running.checked:
                running.checked = True
                self._check_nothing_stranded(running)
        for name, _, trace in self.clock.errors:
            self.violation(f"thread {name} died: {trace}")
        self.clock.errors.clear()
        self._check_progress(now)
        self._check_wakeups()
        self._check_hand_over()

    def _check_wakeups(self) -> None:
        """No lost wake-up on the receive side: with every thread parked, no receive thread
        of a running worker sleeps untimed (and unwoken) while a receive it would make is
        possible, and while one is counted as woken (``Receiver._woken``: later changes
        wake none) one is on its way back. A change wakes a receive thread only when one
        would act, so one left asleep here would stay so until some other change."""
        for running in self.workers:
            worker = running.worker
            if running.crashed or running.stopped_at is not None or not worker.started:
                continue
            receiver = worker.receiver
            if receiver.stopping.is_set():
                continue
            if receiver._loop is not None:
                self._check_loop_wakeups(running)
                continue
            waiting = [
                task
                for task in self.clock.live()
                if task.group == running.group
                and task.name.startswith("sqsworker-receiver")
                and any(task.cond is c for c in receiver._conditions)
            ]
            now = self.clock.monotonic()
            if receiver._woken and not any(
                t.woken or (t.deadline is not None and t.deadline <= now) for t in waiting
            ):
                # wake() does nothing while a thread it woke is on its way back: one that
                # never comes would leave every later change unseen
                self.violation(
                    f"worker {running.recorder.index}: a receive thread counted as woken, "
                    "none on its way back"
                )
            parked = [t for t in waiting if t.deadline is None and not t.woken]
            if not parked:
                continue
            if self.clock.monotonic() < receiver._paused_until:
                continue  # the paused ones wait by the clock
            asked, _ = receiver._look()
            if asked:
                self.violation(
                    f"worker {running.recorder.index}: {len(parked)} receive thread(s) asleep "
                    f"while a receive of {asked} is possible"
                )

    def _check_loop_wakeups(self, running: Running) -> None:
        """``_check_wakeups`` for receives on the event loop: with every thread parked, the
        loop has run every wake-up it was sent, so none is counted as woken, and none
        waits untimed while a receive it would make is possible."""
        receiver, index = running.worker.receiver, running.recorder.index
        if running.group in self.loop_blocked:
            return  # a handler blocks the loop: its receives wait for it
        now = self.clock.monotonic()
        loop = [t for t in self.clock.live() if t.group == running.group]
        loop = [t for t in loop if t.name == "sqsworker-event-loop"]
        if any(t.woken or (t.deadline is not None and t.deadline <= now) for t in loop):
            return  # the loop has wake-ups to run still
        if receiver._woken:
            self.violation(f"worker {index}: a receive on the loop counted as woken, none woken")
        if not receiver._idle or now < receiver._paused_until:
            return  # the paused ones wait by the clock
        asked, _ = receiver._look()
        if asked:
            self.violation(
                f"worker {index}: {len(receiver._idle)} receive(s) on the loop asleep "
                f"while a receive of {asked} is possible"
            )

    def _check_hand_over(self) -> None:
        """No message waits in line past its hand-over unwatched: with every thread
        parked, whenever a handler thread is parked there is a watcher, and while a
        message waits to run with a handler thread idle, the watcher is woken or wakes by
        the moment the message has waited ``hand_over`` (a receive wakes only the threads
        its pace asks for; the watcher covers the rest)."""
        for running in self.workers:
            worker = running.worker
            inbox = worker.inbox
            if running.crashed or not worker.started or inbox.hand_over <= 0:
                continue
            if inbox.closing:
                continue
            index = running.recorder.index
            watcher = inbox._watcher
            if inbox._parked and watcher is None:
                self.violation(f"worker {index}: {len(inbox._parked)} parked, no watcher")
                continue
            oldest = inbox.pending.oldest()
            if oldest is None or watcher is None:
                continue
            task = next(t for t in self.clock.live() if t.cond is watcher)
            if not task.woken and (
                task.deadline is None or task.deadline > oldest + inbox.hand_over + 1e-9
            ):
                self.violation(
                    f"worker {index}: a message waits in line with the watcher asleep "
                    f"past its hand-over (until {task.deadline})"
                )

    def _check_progress(self, now: float) -> None:
        """No worker loses a thread; and on a standard queue, no ordinary message stays
        receivable in SQS for long while a live worker has had room for more to run (fewer
        messages running or waiting to run than its handler slots, duplicates held for a
        busy key apart) all that time, with no fault injected meanwhile."""
        limit = 90.0 + self.schedule.config["wait_time"]
        oldest = math.inf
        if not self.schedule.fifo and now - self.last_fault_at > limit:
            for message in self.memory._queues[self.queue_name].messages.values():
                number = _number_of(message.body, message.message_attributes)
                if number not in self.schedule.hostile and message.visible_at <= now:
                    oldest = min(oldest, message.visible_at)
        for running in self.workers:
            worker, index = running.worker, running.recorder.index
            if running.crashed or running.stopped_at is not None or not worker.started:
                self.free_since.pop(index, None)
                continue
            health = worker.health()
            if health.handlers_alive < health.handlers:
                self.violation(f"worker {index} lost a handler thread: {health.as_dict()}")
            active = worker.inbox.unfinished - len(worker.inbox.deferred)  # every thread is parked
            if active >= worker.slots:
                # Full now: free from the next step that finds it so. (Not "free since
                # it was last seen full": the clock may jump far between two steps, and
                # a slot freed just now is not a slot free all that time.)
                self.free_since.pop(index, None)
                continue
            since = self.free_since.setdefault(index, now)
            if now - oldest > limit and now - since > limit:
                self.violation(
                    f"a message has been receivable for {now - oldest:.0f} s while worker "
                    f"{index} had room for more to run ({active} of {worker.slots} slots) "
                    f"for {now - since:.0f} s"
                )
                self.free_since[index] = now  # report once

    def _check_nothing_stranded(self, running: Running) -> None:
        """After a clean shutdown no message this worker received is still invisible; one
        whose delete or return SQS did not take by the deadline (reported unsettled) is
        invisible no longer than its lease (a renewal SQS applied but whose answer was
        lost counts: the worker knows it may hold that long)."""
        if running.shutdown_result != [0]:
            return
        now = self.clock.monotonic()
        recorder = running.recorder
        for message in self.memory._queues[self.queue_name].messages.values():
            handle = message.handle or ""
            allowed = (
                max(
                    now, recorder.leased_until.get(handle, now), self.applied_until.get(handle, now)
                )
                if recorder.unsettled
                else now
            )
            asked = self.returned_until.get(handle, allowed)
            ours = message.handle in running.recorder.handles - running.recorder.lost
            if ours and message.visible_at > asked:
                body = _number_of(message.body, message.message_attributes)
                self.violation(
                    f"message {body} is invisible after worker {running.recorder.index}'s clean "
                    "shutdown"
                )

    def send(self, numbers: list[int]) -> None:
        queue = self.memory.transport(self.queue_name)
        outgoing = []
        for n in numbers:
            self.sent[n] += 1
            key = {"idempotency-key": {"DataType": "String", "StringValue": f"key-{n}"}}
            body, attributes = _hostile(n, self.schedule.hostile.get(n))
            outgoing.append(
                OutgoingMessage(
                    body,
                    {**(key if self.schedule.keyed else {}), **attributes},
                    group_id=f"g{n % 3}" if self.schedule.fifo else None,
                    deduplication_id=f"{n}-{self.sent[n]}" if self.schedule.fifo else None,
                )
            )
        send_all(queue, outgoing)

    def counts(self, name: str) -> QueueCounts:
        return self.memory.counts(name)

    def dead_lettered(self) -> set[int]:
        messages = self.memory._queues[self.dlq_name].messages.values()
        return {_number_of(m.body, m.message_attributes) for m in messages}


def _hostile(n: int, kind: str | None) -> tuple[str, dict[str, dict[str, str]]]:
    """Message ``n``'s body and attributes: ordinary, or of a hostile ``kind``."""
    if kind is None or kind == "count":
        return json.dumps({"n": n}), {}
    number = {NUMBER: {"DataType": "Number", "StringValue": str(n)}}
    if kind == "pointer":
        size = {"ExtendedPayloadSize": {"DataType": "Number", "StringValue": "300000"}}
        return DEEP_BODY, {**number, **size}
    if kind == "deep":
        return DEEP_BODY, number
    # Valid JSON, its key readable, but long runs of escapes and characters SQS allows
    # that parsers and terminals trip on.
    text = "\\" * 20_000 + "\u2028\u0085\ufeff\U0001f600"
    return json.dumps({"n": n, "s": text}), number


def simulate(seed: int) -> tuple[Schedule, list[str]]:
    """Run the schedule of ``seed``; return it and the violations found."""
    world = World(draw(seed))
    run_world(world)
    return world.schedule, world.violations


def run_world(world: World) -> None:
    world.clock.install()
    try:
        _run(world)
    except SimStuck as exc:  # a thread spun or blocked outside the clock: it would hang
        world.violation(str(exc).splitlines()[0])
    finally:
        world.clock.teardown()
        world.clock.uninstall()


def _run(world: World) -> None:
    schedule = world.schedule
    for _ in range(schedule.workers):
        if world.start_worker() is None:
            return  # refused at start: the option combination cannot work
    events: list[tuple[float, int, Callable[[], object]]] = []
    for order, (at, numbers) in enumerate(schedule.sends):
        events.append((at, order, lambda numbers=numbers: world.send(numbers)))
    for at, index in schedule.stops:
        events.append(
            (at, 1000 + index, lambda index=index: world.stop_worker(world.workers[index]))
        )
    for at, index in schedule.crashes:
        events.append(
            (at, 2000 + index, lambda index=index: world.crash_worker(world.workers[index]))
        )
    events.sort(key=lambda e: (e[0], e[1]))
    for at, _, action in events:
        world.run_until(world.start + at)
        world.act(action)
        if world.violations:
            return
    world.run_until(world.start + schedule.horizon)
    if world.violations:
        return
    _drain(world)


def _drain(world: World) -> None:
    """Faults off; keep one worker alive until the queue is empty, then stop every worker."""
    schedule, clock = world.schedule, world.clock
    world.faults.on = False
    if not any(r.stopped_at is None and not r.crashed for r in world.workers):
        world.act(world.start_worker)
    visibility = schedule.config["visibility_timeout"]
    work = sum(max(p.durations) + visibility + 15 for p in schedule.plans.values())
    # Each copy of a key may wait for its original's claim: its lease, the next renewal's
    # timeout, the headroom and the margin.
    rounds = schedule.max_receive_count * (1 + len(schedule.copies) + len(schedule.floods))
    limit = clock.monotonic() + rounds * (work + visibility + HEADROOM + CLAIM_MARGIN) + 120
    while world.counts(world.queue_name).total and clock.monotonic() < limit:
        # Step to the next thread's deadline (the queue changes only when a thread acts),
        # at least 5 s: fixed 5 s steps made a schedule of handlers hours long run for
        # over ten minutes.
        soonest = clock.next_deadline()
        world.run_until(min(limit, max(clock.monotonic() + 5, soonest or 0.0)))
        if world.violations:
            return
    if world.counts(world.queue_name).total:
        world.violation(f"the queue did not drain: {world.counts(world.queue_name)}")
        return
    for running in world.workers:
        world.act(lambda running=running: world.stop_worker(running))
    world.run_until(clock.monotonic() + 200)
    for running in world.workers:
        if running.crashed:
            continue
        if not running.shutdown_result:
            world.violation(f"worker {running.recorder.index} never finished its shutdown")
        leftover = [t.name for t in clock.tasks if t.group == running.group and not t.finished]
        if running.shutdown_result == [1]:  # handlers overran the timeout: they may run on
            leftover = [name for name in leftover if not name.startswith("sqsworker-handler")]
        if leftover:
            world.violation(f"worker {running.recorder.index}'s threads never ended: {leftover}")
    if world.violations:
        return
    _final_checks(world)


def _final_checks(world: World) -> None:
    dead = world.dead_lettered()
    for number, plan in world.schedule.plans.items():
        if number in dead:
            if not world.trouble[number] - {"returned: shutdown"} and plan.healthy:
                world.violation(f"healthy message {number} reached the DLQ with no reason reported")
        elif number not in world.succeeded:
            world.violation(
                f"message {number} was lost: not in the queue, not dead-lettered, never succeeded"
            )


def _lease_thread_asleep_past_work(
    clock: SimClock, group: str, worker: Worker, now: float
) -> str | None:
    """A wake-up lost: the lease thread sleeps on its condition, and nothing woke it, past
    a moment its machine has work at (a renewal, a delete or return to send, a lease
    running out). Each step that brings such work sooner must wake it; the other
    invariants see a miss only once it cost a lease, if ever. (A message busy in a call
    is left out: that call's end wakes the thread.)"""
    keeper = worker.keeper
    assert keeper is not None
    lease = [t for t in clock.tasks if t.group == group and t.name == "sqsworker-lease"]
    if not lease or lease[-1].finished or lease[-1].woken or lease[-1].cond is not keeper._wake:
        return None
    if keeper._waiting_until == -math.inf:  # the stop's wait for the calls under way
        return None
    until = math.inf if lease[-1].deadline is None else lease[-1].deadline
    machine = keeper.machine
    work = [(e.renew_at, "a renewal") for e in machine._renewable(now)]
    work += [
        (op.not_before if op.urgent else max(op.not_before, machine._send_by(op)), op.action)
        for op in machine.ops
        if not op.entry.busy
    ]
    work += [
        (e.expires_at, "an expiry") for e in machine.held.values() if e.state in LIVE and not e.busy
    ]
    moment, what = min(work, default=(math.inf, ""))
    if moment < until:
        return f"sleeps until {until - now:+.3f} s past {what} due at {moment - now:+.3f} s"
    return None
