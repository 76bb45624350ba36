"""Prometheus metrics: an ``Observer`` for what happens, a collector for what is held.

Counters and histograms move with the worker's events. Those that move with every
message or batch (received, succeeded, deleted, renewed, the handler's time, the
message's age and receive count) are ``TallyFamily``s: each thread adds to counts of
its own, with no lock, and a scrape sums them (prometheus_client's own take a lock for
every counter increment and every histogram bucket: seven a message). What the worker
holds now (messages by state, the oldest lease's distance to the 12-hour cap, SQS
requests so far) is read from the worker when Prometheus scrapes, so the hot path pays
nothing for it. Several handlers' ``Metrics`` may share one registry (one process, one
/metrics): each series is labelled with its queue and handler. Every metric is listed
in docs/observability.md.
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from bisect import bisect_left
from collections import deque
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from .clock import Clock, SystemClock
from .config import MAX_VISIBILITY
from .events import HANDED_BACK_BEHIND, Observer
from .version import __version__

if TYPE_CHECKING:
    from .errors import Retry, TransportError
    from .message import Message
    from .worker import Worker

LABELS = ("queue", "handler")
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)
AGE_BUCKETS = (0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 24 * 3600, 4 * 86400)
RECEIVE_COUNT_BUCKETS = (1, 2, 3, 5, 10, 20, 50, 100)


def queue_name(queue: str) -> str:
    """The queue's name, given a name, a URL or an ARN."""
    return queue.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1]


class ThreadTally:
    """One series' counts, kept apart by thread: each thread adds to a list of its own,
    so no lock is taken and no increment is lost; ``read`` sums the threads' lists.

    A histogram's list holds a count per bucket (the first whose upper bound is at least
    the value; the last is +Inf), then the sum; a counter's holds its value last. Values
    are finite (a duration, an age, a count): a NaN would count in the first bucket. A
    scrape reads each list as it stands, so it may see a bucket counted and its sum not
    yet, as prometheus_client's own series may (they lock each number, not both)."""

    __slots__ = ("_gone", "_lists", "_local", "_lock", "_retired", "bounds", "created")

    def __init__(self, bounds: Sequence[float] = ()) -> None:
        self.bounds = tuple(bounds)
        self.created = time.time()
        self._local = threading.local()
        self._lists: list[list[float]] = []  # each thread's, until it is gone
        self._retired = [0.0] * (len(bounds) + 2)  # the threads' that are gone, summed
        # Lists of threads gone, to be summed into _retired by the next read: appended by
        # a finalizer, which may run anywhere the cyclic collector does (inside a read,
        # say), so it takes no lock.
        self._gone: deque[list[float]] = deque()
        self._lock = threading.Lock()  # guards _lists and _retired

    def _own(self) -> list[float]:
        try:
            counts: list[float] = self._local.counts
        except AttributeError:
            counts = self._local.counts = [0] * (len(self.bounds) + 2)
            with self._lock:
                self._lists.append(counts)
            # A thread gone, its counts join the retired ones: threads that come and go
            # (workers run one after another, sharing a registry) leave no list behind.
            weakref.finalize(threading.current_thread(), self._gone.append, counts)
        return counts

    def inc(self, amount: float = 1) -> None:
        self._own()[-1] += amount

    def observe(self, value: float) -> None:
        counts = self._own()
        counts[bisect_left(self.bounds, value)] += 1
        counts[-1] += value

    def read(self) -> list[float]:
        """The sums over every thread: the buckets' counts (not cumulative), then the sum."""
        with self._lock:
            while self._gone:
                gone = self._gone.popleft()
                self._lists = [c for c in self._lists if c is not gone]
                for i, n in enumerate(gone):
                    self._retired[i] += n
            total = list(self._retired)
            for counts in self._lists:
                for i, n in enumerate(counts):
                    total[i] += n
        return total


class TallyFamily(Collector):
    """A counter or histogram family whose series are ``ThreadTally``s, labelled alike."""

    def __init__(
        self,
        kind: str,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Sequence[float] = (),
    ) -> None:
        self.kind, self.name, self.documentation = kind, name, documentation
        self.labelnames = tuple(labelnames)
        self.buckets = tuple(float(b) for b in buckets)
        self._series: dict[tuple[str, ...], ThreadTally] = {}
        self._lock = threading.Lock()  # only to add a series

    def labels(self, **labels: str) -> ThreadTally:
        key = tuple(labels[name] for name in self.labelnames)
        series = self._series.get(key)
        if series is None:
            with self._lock:
                series = self._series.setdefault(key, ThreadTally(self.buckets))
        return series

    def collect(self) -> Iterator[Metric]:
        series = list(self._series.items())  # in the order they came, as prometheus_client
        if self.kind == "counter":
            counter = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
            for key, tally in series:
                counter.add_metric(list(key), tally.read()[-1], created=tally.created)
            yield counter
            return
        histogram = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        bounds = [_go_float(b) for b in (*self.buckets, math.inf)]
        for key, tally in series:
            counts, cumulative, buckets = tally.read(), 0.0, []
            for bound, count in zip(bounds, counts, strict=False):
                cumulative += count
                buckets.append((bound, cumulative))
            histogram.add_metric(list(key), buckets, counts[-1])
            labels = dict(zip(self.labelnames, key, strict=True))
            histogram.samples.append(Sample(f"{self.name}_created", labels, tally.created))
        yield histogram


def _go_float(value: float) -> str:
    """A bucket's bound as its ``le`` label, as prometheus_client writes it."""
    text: str = floatToGoString(value)  # type: ignore[no-untyped-call]
    return text


class _Families:
    """The metric families of one registry: the handlers of one process share them, each
    with its own queue and handler labels."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry

        def counter(name: str, text: str, *extra: str) -> Counter:
            return Counter(name, text, [*LABELS, *extra], registry=r)

        def tally(name: str, text: str, *extra: str, buckets: Sequence[float] = ()) -> TallyFamily:
            family = TallyFamily(
                "histogram" if buckets else "counter", name, text, [*LABELS, *extra], buckets
            )
            r.register(family)
            return family

        self.messages_received = tally("sqsworker_messages_received", "Messages received.")
        self.messages_succeeded = tally(
            "sqsworker_messages_succeeded", "Messages whose handler returned normally."
        )
        self.messages_failed = counter(
            "sqsworker_messages_failed",
            "Handler errors, by exception type: the message is retried, or on its last "
            "attempt moved by SQS to the dead-letter queue. Retry and rejections are "
            "counted on their own.",
            "exception",
        )
        self.messages_retry_requested = counter(
            "sqsworker_messages_retry_requested", "Messages whose handler raised Retry."
        )
        self.messages_rejected = counter(
            "sqsworker_messages_rejected",
            "Messages rejected (Reject, a --non-retryable exception, an idempotency key "
            "conflict or no key), by exception type.",
            "exception",
        )
        self.messages_retried = counter(
            "sqsworker_messages_retried",
            "Messages returned to the queue to be retried, after a handler error or a Retry.",
        )
        self.messages_dead_lettered = counter(
            "sqsworker_messages_dead_lettered",
            "Messages bound for the dead-letter queue: reason=max_receives when the last "
            "attempt failed (SQS moves it on the next receive), reason=rejected when the "
            "handler rejected it (moved by the worker).",
            "reason",
        )
        self.messages_skipped = counter(
            "sqsworker_messages_skipped", "Held messages not run because their lease was lost."
        )
        self.worker_errors = counter(
            "sqsworker_worker_errors",
            "Messages on which a step of the worker's own around the handler raised (a bug, "
            "or input no step could read), by exception type: each is returned after a "
            "backoff, and the thread goes on.",
            "exception",
        )
        self.deletes = tally(
            "sqsworker_deletes",
            "Messages deleted: after success, or once a rejected message was copied to the "
            "dead-letter queue.",
        )
        self.delete_failures = counter(
            "sqsworker_delete_failures",
            "Deletes that failed; will_retry=false means the message may be delivered again.",
            "will_retry",
        )
        self.extensions = tally(
            "sqsworker_visibility_extensions", "Leases renewed (one per message per renewal)."
        )
        self.leases_lost = counter(
            "sqsworker_leases_lost", "Leases lost: another consumer may now have the message."
        )
        self.near_cap = counter(
            "sqsworker_leases_near_cap", "Messages that neared the 12-hour visibility cap."
        )
        self.handed_back = counter(
            "sqsworker_messages_handed_back", "Messages made visible again at shutdown."
        )
        self.fifo_handed_back = counter(
            "sqsworker_fifo_messages_handed_back",
            "FIFO messages handed back unstarted because an earlier message of their group "
            "failed: they come back behind it.",
        )
        self.deletes_after_lease_lost = counter(
            "sqsworker_deletes_after_lease_lost",
            "Deletes SQS accepted with the receipt handle of a lease lost before: the "
            "message may have been delivered again meanwhile.",
        )
        self.empty_receives = counter(
            "sqsworker_empty_receives", "Receives that returned no message."
        )
        self.receive_failures = counter(
            "sqsworker_receive_failures", "Receives that failed after the transport's retries."
        )
        self.duplicates_suppressed = counter(
            "sqsworker_duplicates_suppressed",
            "Messages whose idempotency key was completed before: deleted without running.",
        )
        self.duplicates_deferred = counter(
            "sqsworker_duplicates_deferred",
            "Messages whose key was in progress under another claim: held, and looked at "
            "again when that claim ends.",
        )
        self.key_conflicts = counter(
            "sqsworker_key_conflicts",
            "Messages whose key was used before with another body, by outcome "
            "(reject or suppress).",
            "outcome",
        )
        self.claims_lost = counter(
            "sqsworker_idempotency_claims_lost",
            "Claims on a key that passed to another worker while the handler ran.",
        )
        self.store_errors = counter(
            "sqsworker_idempotency_store_errors",
            "Failed idempotency store calls, by operation (claim, renew, complete, release).",
            "operation",
        )
        self.loop_stalls = counter(
            "sqsworker_event_loop_stalls",
            "Times an async handler blocked the event loop for 0.5 s or more (every "
            "coroutine waited); the log line says where.",
        )
        self.duration = tally(
            "sqsworker_handler_duration_seconds",
            "Handler run time, by outcome (success, failure, retry, rejected).",
            "outcome",
            buckets=DURATION_BUCKETS,
        )
        self.age = tally(
            "sqsworker_message_age_seconds",
            "Time from SentTimestamp until the handler started.",
            buckets=AGE_BUCKETS,
        )
        self.receive_count = tally(
            "sqsworker_message_receive_count",
            "ApproximateReceiveCount of each message when its handler started.",
            buckets=RECEIVE_COUNT_BUCKETS,
        )
        self.build_info = Gauge(
            "sqsworker_info", "Always 1; its labels tell the version.", ["version"], registry=r
        )
        self.build_info.labels(version=__version__).set(1)
        self.held = _HeldCollector()
        r.register(self.held)


_FAMILIES: WeakKeyDictionary[CollectorRegistry, _Families] = WeakKeyDictionary()


class Metrics(Observer):
    """What one handler's worker does, as metrics labelled with its queue and handler.

    Several may share a registry (several handlers in one process): the first creates
    the metric families there, the others add their labels to them.
    """

    def __init__(
        self,
        queue: str,
        handler: str,
        *,
        registry: CollectorRegistry | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.registry = registry or CollectorRegistry()
        self.clock: Clock = clock or SystemClock()
        self.labels = {"queue": queue_name(queue), "handler": handler}
        if self.registry not in _FAMILIES:
            _FAMILIES[self.registry] = _Families(self.registry)
        f = self.f = _FAMILIES[self.registry]
        # Children bound once: .labels() takes a lock and a lookup, too dear per message.
        bound = self.labels
        self._received = f.messages_received.labels(**bound)
        self._succeeded = f.messages_succeeded.labels(**bound)
        self._retried = f.messages_retried.labels(**bound)
        self._retry_requested = f.messages_retry_requested.labels(**bound)
        self._skipped = f.messages_skipped.labels(**bound)
        self._deletes = f.deletes.labels(**bound)
        self._extensions = f.extensions.labels(**bound)
        self._lost = f.leases_lost.labels(**bound)
        self._near_cap = f.near_cap.labels(**bound)
        self._handed_back = f.handed_back.labels(**bound)
        self._fifo_handed_back = f.fifo_handed_back.labels(**bound)
        self._late_deletes = f.deletes_after_lease_lost.labels(**bound)
        self._empty = f.empty_receives.labels(**bound)
        self._receive_failures = f.receive_failures.labels(**bound)
        self._age = f.age.labels(**bound)
        self._receive_count = f.receive_count.labels(**bound)
        self._succeeded_duration = f.duration.labels(**bound, outcome="success")
        self._suppressed = f.duplicates_suppressed.labels(**bound)
        self._deferred = f.duplicates_deferred.labels(**bound)
        self._claims_lost = f.claims_lost.labels(**bound)

    def watch(self, worker: Worker) -> None:
        """Also report what ``worker`` holds and the SQS requests it made, at each scrape."""
        self.f.held.watch(worker, self.labels)

    # -- events ------------------------------------------------------------------------

    def received(self, messages: Sequence[Message]) -> None:
        self._received.inc(len(messages))

    def receive_empty(self) -> None:
        self._empty.inc()

    def receive_failed(self, error: TransportError, retry_in: float) -> None:
        self._receive_failures.inc()

    def handler_started(self, message: Message) -> None:
        self._receive_count.observe(message.receive_count)
        sent = message.attributes.get("SentTimestamp")  # milliseconds: no datetime per message
        if sent and sent.isascii() and sent.isdigit() and len(sent) < 20:  # or no number
            self._age.observe(max(0.0, self.clock.time() - int(sent) / 1000))

    def handler_succeeded(self, message: Message, duration: float) -> None:
        self._succeeded.inc()
        self._succeeded_duration.observe(duration)

    def handler_failed(
        self,
        message: Message,
        error: BaseException,
        duration: float,
        retry_in: float,
        last_attempt: bool,
    ) -> None:
        self.f.messages_failed.labels(**self.labels, exception=type(error).__name__).inc()
        self.f.duration.labels(**self.labels, outcome="failure").observe(duration)
        if last_attempt:
            self.f.messages_dead_lettered.labels(**self.labels, reason="max_receives").inc()
        else:
            self._retried.inc()

    def handler_retry_requested(
        self, message: Message, request: Retry, duration: float, retry_in: float, last_attempt: bool
    ) -> None:
        self._retry_requested.inc()
        self.f.duration.labels(**self.labels, outcome="retry").observe(duration)
        if last_attempt:
            self.f.messages_dead_lettered.labels(**self.labels, reason="max_receives").inc()
        else:
            self._retried.inc()

    def handler_rejected(
        self, message: Message, error: BaseException, duration: float, dead_letter: str | None
    ) -> None:
        self.f.messages_rejected.labels(**self.labels, exception=type(error).__name__).inc()
        self.f.duration.labels(**self.labels, outcome="rejected").observe(duration)
        if dead_letter:
            self.f.messages_dead_lettered.labels(**self.labels, reason="rejected").inc()

    def handler_skipped(self, message: Message, reason: str) -> None:
        self._skipped.inc()

    def rejected_copy_refused(self, message: Message, error: BaseException, reason: str) -> None:
        self.f.messages_rejected.labels(**self.labels, exception=type(error).__name__).inc()

    def step_failed_settled(self, message: Message, error: BaseException) -> None:
        self.f.worker_errors.labels(**self.labels, exception=type(error).__name__).inc()

    def step_failed(
        self, message: Message, error: BaseException, retry_in: float, last_attempt: bool
    ) -> None:
        self.f.worker_errors.labels(**self.labels, exception=type(error).__name__).inc()
        self._retried.inc()
        if last_attempt:
            self.f.messages_dead_lettered.labels(**self.labels, reason="max_receives").inc()

    def loop_blocked(self, seconds: float, where: str) -> None:
        self.f.loop_stalls.labels(**self.labels).inc()

    def deleted(self, messages: Sequence[Message]) -> None:
        self._deletes.inc(len(messages))

    def delete_failed(self, message: Message, reason: str, will_retry: bool) -> None:
        self.f.delete_failures.labels(**self.labels, will_retry=str(will_retry).lower()).inc()

    def returned(self, messages: Sequence[Message], delay: float, reason: str) -> None:
        if reason == "shutdown":
            self._handed_back.inc(len(messages))
        elif reason == HANDED_BACK_BEHIND:
            self._fifo_handed_back.inc(len(messages))

    def deleted_after_lease_lost(self, message: Message) -> None:
        self._late_deletes.inc()

    def rejected_copy_failed(
        self,
        message: Message,
        error: BaseException,
        duration: float,
        retry_in: float,
        last_attempt: bool,
    ) -> None:
        self.f.messages_rejected.labels(**self.labels, exception=type(error).__name__).inc()
        self.f.duration.labels(**self.labels, outcome="rejected").observe(duration)
        if last_attempt:
            self.f.messages_dead_lettered.labels(**self.labels, reason="max_receives").inc()

    def leases_extended(self, messages: Sequence[Message], seconds: int) -> None:
        self._extensions.inc(len(messages))

    def lease_lost(self, message: Message, reason: str) -> None:
        self._lost.inc()

    def lease_near_cap(self, message: Message, seconds_left: float) -> None:
        self._near_cap.inc()

    def duplicate_suppressed(self, message: Message) -> None:
        self._suppressed.inc()

    def duplicate_deferred(self, message: Message, retry_in: float) -> None:
        self._deferred.inc()

    def key_conflict(self, message: Message, outcome: str) -> None:
        self.f.key_conflicts.labels(**self.labels, outcome=outcome).inc()

    def claim_lost(self, message: Message, reason: str) -> None:
        self._claims_lost.inc()

    def store_failed(self, operation: str, error: BaseException) -> None:
        self.f.store_errors.labels(**self.labels, operation=operation).inc()


class _HeldCollector(Collector):
    """Gauges read from the workers at scrape time: one family each, a series per worker."""

    def __init__(self) -> None:
        self.workers: list[tuple[Worker, dict[str, str]]] = []

    def watch(self, worker: Worker, labels: dict[str, str]) -> None:
        self.workers.append((worker, labels))

    def collect(self) -> Iterator[Metric]:
        names = list(LABELS)
        held = GaugeMetricFamily(
            "sqsworker_messages_held",
            "Messages held now, by state: running, or waiting for a handler thread.",
            labels=[*names, "state"],
        )
        cap = GaugeMetricFamily(
            "sqsworker_visibility_cap_seconds_left",
            "Seconds before the 12-hour visibility cap for the oldest held message "
            "(NaN when none is held).",
            labels=names,
        )
        requests = CounterMetricFamily(
            "sqsworker_sqs_requests",
            "SQS API requests sent, by action and outcome (success or the error code); "
            "retries count as requests.",
            labels=[*names, "action", "outcome"],
        )
        unanswered = GaugeMetricFamily(
            "sqsworker_sqs_unanswered_seconds",
            "Seconds since the receives began failing in a row (0 while SQS answers): SQS "
            "unreachable, throttling or refusing; the log and /healthz say why.",
            labels=names,
        )
        for worker, labels in list(self.workers):
            values = [labels[name] for name in names]
            unanswered.add_metric(values, worker.sqs_unanswered()[0])
            keeper = worker.keeper
            if keeper is not None:
                snapshot = keeper.snapshot()
                held.add_metric([*values, "running"], snapshot.running)
                held.add_metric([*values, "waiting"], snapshot.waiting)
                left = math.nan
                if snapshot.oldest_received_at is not None:
                    elapsed = worker.clock.monotonic() - snapshot.oldest_received_at
                    left = max(0.0, MAX_VISIBILITY - elapsed)
                cap.add_metric(values, left)
            if worker.started:
                sent = dict(worker.transport.requests)
                errors = dict(worker.transport.request_errors)
                for action, count in sorted(sent.items()):
                    failed = sum(n for (a, _), n in errors.items() if a == action)
                    requests.add_metric([*values, action, "success"], count - failed)
                for (action, code), count in sorted(errors.items()):
                    requests.add_metric([*values, action, code], count)
        yield held
        yield cap
        yield requests
        yield unanswered
