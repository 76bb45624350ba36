"""Batch handlers: a function of a list of messages, each message settled by its outcome.

The worker runs on the in-memory SQS with a fake clock; each test waits on state.
"""

from __future__ import annotations

import hashlib
import io
import json
import threading
from collections.abc import Callable
from typing import Any

import pytest

import sqsworker
from sqsworker import BatchFailure, BatchResult, ConfigError, Message, Reject, Retry, WorkerConfig
from sqsworker.clock import FakeClock
from sqsworker.errors import HandlerShapeError
from sqsworker.events import Observer
from sqsworker.logs import LogObserver
from sqsworker.stores.memory import MemoryStore
from sqsworker.transports import OutgoingMessage, send_all
from sqsworker.transports.memory import MemorySQS

from ..conftest import wait_until
from .helpers import Rig
from .test_idempotency import keyed


class Batches:
    """A batch handler that records each batch's bodies and answers with ``answer``."""

    def __init__(self, answer: Callable[[list[Message]], Any] = lambda batch: None) -> None:
        self.answer = answer
        self.batches: list[list[str]] = []
        self.lock = threading.Lock()

    def __call__(self, messages: list[Message]) -> Any:
        with self.lock:
            self.batches.append([m.body for m in messages])
        return self.answer(messages)

    @property
    def bodies(self) -> list[str]:
        return [body for batch in self.batches for body in batch]


class HeldBatches:
    """A batch handler that blocks until ``release`` is set, and tells when it ``started``."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self, messages: list[Message]) -> None:
        self.started.set()
        self.release.wait(30)


def batch_rig(memory: MemorySQS, clock: FakeClock, handler: Any, **options: Any) -> Rig:
    options.setdefault("batch_size", 10)
    options.setdefault("batch_window", 0.0)
    return Rig(memory, clock, sqsworker.batch_handler()(handler), **options)


def test_a_batch_fills_up_to_its_size_and_a_partial_one_waits_out_its_window(
    memory: MemorySQS, clock: FakeClock
) -> None:
    handler = Batches()
    rig = batch_rig(memory, clock, handler, batch_size=10, batch_window=5.0, concurrency=1)
    rig.send(*[f"a{i}" for i in range(3)])
    rig.worker.start()
    rig.wait_for("received", 3)
    clock.advance(4)  # within the window: the three wait for more
    assert handler.batches == []
    rig.send(*[f"b{i}" for i in range(9)])
    rig.advance_until(lambda: len(handler.bodies) == 10, step=0.5)
    assert len(handler.batches[0]) == 10  # filled up, then ran at once
    rig.advance_until(lambda: rig.count("deleted") == 12)
    assert [len(b) for b in handler.batches] == [10, 2]  # the rest, once its window passed
    assert rig.stop() == 0
    assert rig.queue.counts().total == 0


def test_concurrency_counts_batches_running_at_once(memory: MemorySQS, clock: FakeClock) -> None:
    release = threading.Event()
    running: list[int] = []

    def slow(messages: list[Message]) -> None:
        running.append(len(messages))
        release.wait(30)

    rig = batch_rig(memory, clock, slow, batch_size=5, concurrency=2, prefetch=0)
    rig.send(*[f"m{i}" for i in range(20)])
    rig.worker.start()
    wait_until(lambda: len(running) == 2)
    assert running == [5, 5] and rig.worker.in_hand == 10  # two batches, nothing more held
    release.set()
    rig.advance_until(lambda: rig.count("deleted") == 20)
    assert rig.stop() == 0


def test_each_message_takes_the_path_its_handler_reported(
    memory: MemorySQS, clock: FakeClock
) -> None:
    def answer(messages: list[Message]) -> BatchResult:
        by_body = {m.body: m for m in messages}
        return BatchResult(
            {
                by_body["reject"]: Reject("malformed"),
                by_body["retry"]: Retry(60),
                by_body["fail"]: None,  # failed, no reason: the backoff
                by_body["boom"].message_id: RuntimeError("boom"),  # by id
            }
        )

    handler = Batches(answer)
    rig = batch_rig(memory, clock, handler)
    rig.send("ok-1", "reject", "retry", "fail", "boom", "ok-2")
    rig.worker.start()
    rig.advance_until(lambda: rig.count("deleted") == 3)  # the two successes, the rejected
    assert len(handler.batches) == 1 and sorted(handler.bodies) == sorted(
        ["ok-1", "reject", "retry", "fail", "boom", "ok-2"]
    )
    assert (rig.count("succeeded"), rig.count("rejected")) == (2, 1)
    assert (rig.count("retry_requested"), rig.count("failed")) == (1, 2)
    assert rig.dlq is not None
    assert [e.body for e in rig.dlq.receive(10, 0, 30)] == ["reject"]
    assert rig.stop() == 0
    assert rig.queue.counts().total == 3  # retry, fail and boom, to come back


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        pytest.param(
            lambda batch: (_ for _ in ()).throw(ValueError("db down")),
            "ValueError: db down",
            id="raised",
        ),
        pytest.param(
            lambda batch: "done",
            "returned str, not None or a sqsworker.BatchResult",
            id="wrong-type",
        ),
        pytest.param(
            lambda batch: BatchResult(["no-such-id"]),
            "reported 'no-such-id' failed, which is not a message of its batch",
            id="unknown-id",
        ),
    ],
)
def test_an_exception_or_a_report_that_cannot_be_trusted_fails_the_whole_batch(
    memory: MemorySQS, clock: FakeClock, answer: Callable[[list[Message]], Any], why: str
) -> None:
    errors: list[str] = []

    class Failures(Observer):
        def handler_failed(self, message: Message, error: BaseException, *args: Any) -> None:
            errors.append(f"{type(error).__name__}: {error}")

    rig = batch_rig(memory, clock, Batches(answer), observers=[Failures()])
    rig.send("a", "b", "c")
    rig.worker.start()
    rig.advance_until(lambda: rig.count("failed") == 3)
    assert rig.count("deleted") == 0
    assert all(why in error for error in errors), errors
    assert rig.stop() == 0
    assert rig.queue.counts().total == 3


def test_raising_batch_failure_names_the_failed_ones_like_a_result(
    memory: MemorySQS, clock: FakeClock
) -> None:
    def answer(messages: list[Message]) -> None:
        raise BatchFailure([m for m in messages if m.body == "bad"])

    rig = batch_rig(memory, clock, Batches(answer))
    rig.send("good", "bad", "fine")
    rig.worker.start()
    rig.advance_until(lambda: rig.count("deleted") == 2 and rig.count("failed") == 1)
    assert rig.stop() == 0


def test_every_message_keeps_its_lease_while_it_waits_and_while_its_batch_runs(
    memory: MemorySQS, clock: FakeClock
) -> None:
    slow = HeldBatches()
    rig = batch_rig(
        memory, clock, slow, batch_size=10, batch_window=40.0, visibility_timeout=10, concurrency=1
    )
    rig.send("a", "b", "c")
    rig.worker.start()
    rig.wait_for("received", 3)
    rig.advance_until(slow.started.is_set, step=2.0)  # 40 s of window: 4 leases long
    for _ in range(20):  # and 40 s more running
        clock.advance(2)
        threading.Event().wait(0.002)
    assert rig.count("leases_lost") == 0 and rig.count("lease_extensions") >= 6
    assert rig.queue.counts().visible == 0  # never visible to another consumer
    slow.release.set()
    rig.advance_until(lambda: rig.count("deleted") == 3)
    assert rig.stop() == 0


def test_duplicates_are_dropped_before_the_handler_sees_the_batch(
    memory: MemorySQS, clock: FakeClock
) -> None:
    handler = Batches()
    rig = batch_rig(memory, clock, handler, store=MemoryStore(), concurrency=1)
    send_all(rig.queue, [keyed("order 1", "o-1"), keyed("order 2", "o-2")])
    rig.worker.start()
    rig.advance_until(lambda: rig.count("deleted") == 2)
    send_all(rig.queue, [keyed("order 1", "o-1"), keyed("order 3", "o-3")])
    rig.advance_until(lambda: rig.count("deleted") == 4)
    assert handler.bodies == ["order 1", "order 2", "order 3"]  # "order 1" once
    assert rig.count("duplicates_suppressed") == 1
    assert rig.stop() == 0


def fifo_messages(*bodies: str) -> list[OutgoingMessage]:
    """Each body "g:n" as message n of group g."""
    return [OutgoingMessage(b, group_id=b.split(":")[0], deduplication_id=b) for b in bodies]


def test_a_fifo_batch_holds_each_groups_messages_in_order(
    memory: MemorySQS, clock: FakeClock
) -> None:
    handler = Batches()
    rig = batch_rig(memory, clock, handler, queue="jobs.fifo", dead_letter=False, concurrency=2)
    send_all(rig.queue, fifo_messages(*[f"{g}:{n}" for n in range(6) for g in "ab"]))
    rig.worker.start()
    rig.advance_until(lambda: rig.count("deleted") == 12)
    for group in "ab":
        ran = [b for b in handler.bodies if b.startswith(group)]
        assert ran == [f"{group}:{n}" for n in range(6)]
    assert rig.stop() == 0


def test_a_fifo_failure_hands_its_groups_later_messages_back_behind_it(
    memory: MemorySQS, clock: FakeClock
) -> None:
    def answer(messages: list[Message]) -> BatchResult | None:
        first_try = [m for m in messages if m.body == "g:1" and m.receive_count == 1]
        return BatchResult(first_try) if first_try else None

    handler = Batches(answer)
    rig = batch_rig(
        memory, clock, handler, queue="jobs.fifo", dead_letter=False, store=MemoryStore()
    )
    send_all(rig.queue, fifo_messages("g:0", "g:1", "g:2", "h:0"))
    rig.worker.start()
    rig.advance_until(lambda: rig.count("deleted") == 4)
    assert handler.batches[0] == ["g:0", "g:1", "g:2", "h:0"]
    # g:2 went back behind g:1 though the handler did it: its key's claim was completed,
    # so when it comes back after g:1's retry it is a duplicate, not run again.
    assert handler.bodies[4:] == ["g:1"]
    assert rig.count("duplicates_suppressed") == 1
    assert rig.count("fifo_handed_back") == 1
    assert rig.stop() == 0


def test_shutdown_lets_a_running_batch_finish_and_hands_back_the_waiting(
    memory: MemorySQS, clock: FakeClock
) -> None:
    slow = HeldBatches()
    rig = batch_rig(memory, clock, slow, batch_size=4, concurrency=1, prefetch=6)
    rig.send(*[f"m{i}" for i in range(10)])
    rig.worker.start()
    assert slow.started.wait(10)
    wait_until(lambda: rig.worker.in_hand == 10)
    code = rig.begin_stop()
    rig.wait_for("handed_back", 6)
    slow.release.set()
    assert code() == 0 and rig.count("deleted") == 4
    assert rig.queue.counts().visible == 6


# Refused at start, each with one sentence -------------------------------------------


async def async_batch(messages: list[Message]) -> None:
    pass


def one_message(message: Message) -> None:
    pass


def many(messages: list[Message]) -> None:
    pass


@pytest.mark.parametrize(
    ("make", "sentence"),
    [
        pytest.param(
            lambda: sqsworker.batch_handler()(async_batch),
            f"batch handler {__name__}.async_batch is an async def function, and batch "
            "handlers run on threads",
            id="async-batch",
        ),
        pytest.param(
            lambda: sqsworker.batch_handler()(one_message),
            f"batch handler {__name__}.one_message takes one message (its parameter is "
            "annotated Message)",
            id="batch-of-one-message",
        ),
        pytest.param(
            lambda: sqsworker.handler()(many),
            f"handler {__name__}.many takes a list of messages (its parameter is annotated "
            "so), but is not a batch handler: decorate it with @sqsworker.batch_handler(...)",
            id="list-as-one-message",
        ),
        pytest.param(
            lambda: sqsworker.handler(batch_size=10)(one_message),
            "batch_size is an option of batch handlers: decorate",
            id="batch-option-on-a-message-handler",
        ),
    ],
)
def test_a_handler_of_the_wrong_shape_is_refused(make: Callable[[], Any], sentence: str) -> None:
    with pytest.raises((HandlerShapeError, TypeError)) as raised:
        make()
    assert str(raised.value).startswith(sentence)


def test_batch_options_from_the_command_line_on_a_message_handler_are_refused(
    memory: MemorySQS, clock: FakeClock
) -> None:
    with pytest.raises(ConfigError) as raised:
        Rig(memory, clock, one_message, batch_size=5)
    assert str(raised.value).startswith(
        "batch-size applies to batch handlers only, and tests.unit.test_batch_handlers."
        "one_message handles one message at a time"
    )


@pytest.mark.parametrize(("option", "value"), [("batch_size", 0), ("batch_window", -1.0)])
def test_a_batch_size_of_0_or_a_negative_window_is_refused(option: str, value: float) -> None:
    with pytest.raises(ConfigError) as raised:
        WorkerConfig(queue="q", **{option: value})
    assert raised.value.field == option


# Found by review: each reproduced on the in-memory SQS before it was fixed -----------


def keyed_in_group(body: str, key: str) -> OutgoingMessage:
    return OutgoingMessage(
        body,
        group_id="g",
        deduplication_id=body,
        message_attributes={"idempotency-key": {"DataType": "String", "StringValue": key}},
    )


def _held_elsewhere(clock: FakeClock, seconds: float) -> MemoryStore:
    """A store in which another worker holds g:1's key (k1) for ``seconds``: it is
    running elsewhere."""
    store = MemoryStore()
    digest = hashlib.sha256(b"g:1").hexdigest()[:32]
    now = clock.time()
    assert store.claim("jobs.fifo/k1", "elsewhere", digest, now + seconds, now) is None
    return store


def test_a_fifo_message_whose_key_is_busy_stops_its_group_there_not_before(
    memory: MemorySQS, clock: FakeClock
) -> None:
    store = _held_elsewhere(clock, 5)
    handler = Batches()
    rig = batch_rig(
        memory, clock, handler, queue="jobs.fifo", dead_letter=False, store=store, concurrency=1
    )
    send_all(rig.queue, [keyed_in_group(f"g:{n}", f"k{n}") for n in range(3)])
    rig.worker.start()
    rig.advance_until(lambda: rig.count("deleted") == 3)
    assert handler.bodies == ["g:0", "g:1", "g:2"]  # g:0 ran first, g:1 and g:2 after it
    assert handler.batches[0] == ["g:0"]
    assert rig.stop() == 0


def test_past_the_shutdown_timeout_a_batch_being_made_ready_is_handed_back_whole(
    memory: MemorySQS, clock: FakeClock
) -> None:
    class SlowFirstClaim(MemoryStore):
        entered, release = threading.Event(), threading.Event()

        def claim(self, key: str, *args: Any) -> Any:
            if key.endswith("/k0"):
                self.entered.set()
                self.release.wait(30)
            return super().claim(key, *args)

    store = SlowFirstClaim()
    handler = Batches()
    rig = batch_rig(
        memory,
        clock,
        handler,
        store=store,
        concurrency=1,
        shutdown_timeout=5,
        visibility_timeout=60,
    )
    send_all(rig.queue, [keyed(f"m{n}", f"k{n}") for n in range(3)])
    rig.worker.start()
    try:
        assert store.entered.wait(10)
        assert rig.stop_past_timeout() == 1
        assert rig.queue.counts().visible == 3  # m1 and m2 too, not invisible for 60 s
    finally:
        store.release.set()
    wait_until(lambda: rig.worker.in_hand == 0)
    assert handler.batches == []  # nothing ran after the shutdown


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # by design
def test_a_worker_fault_after_a_deferral_finishes_each_message_once(
    memory: MemorySQS, clock: FakeClock
) -> None:
    class Faulty(MemoryStore):
        raised = False

        def claim(self, key: str, *args: Any) -> Any:
            if key.endswith("/k2") and not self.raised:
                self.raised = True
                raise RuntimeError("a store's bug, not a StoreError")
            return super().claim(key, *args)

    store = Faulty()
    digest = hashlib.sha256(b"m1").hexdigest()[:32]
    store.claim("jobs/k1", "elsewhere", digest, clock.time() + 3, clock.time())  # m1: busy
    rig = batch_rig(memory, clock, Batches(), store=store, concurrency=2)
    send_all(rig.queue, [keyed("m1", "k1"), keyed("m2", "k2")])
    seen = []
    rig.worker.start()
    for _ in range(40):
        clock.advance(0.5)
        threading.Event().wait(0.005)
        seen.append(rig.worker.in_hand)
    assert min(seen) >= 0  # went to -1: the deferred one was finished twice
    rig.stop()


def test_a_report_that_cannot_be_trusted_is_retried_whatever_non_retryable_says(
    memory: MemorySQS, clock: FakeClock
) -> None:
    rig = batch_rig(
        memory,
        clock,
        Batches(lambda batch: BatchResult(["no-such-id"])),
        non_retryable=(ValueError, TypeError),
    )
    rig.send("a", "b")
    rig.worker.start()
    rig.advance_until(lambda: rig.count("failed") == 2)
    assert rig.count("rejected") == 0 and rig.dlq is not None and rig.dlq.counts().total == 0
    assert rig.stop() == 0


def test_a_busy_fifo_message_is_not_run_beside_its_groups_earlier_one(
    memory: MemorySQS, clock: FakeClock
) -> None:
    store = _held_elsewhere(clock, 2)
    release = threading.Event()

    def answer(messages: list[Message]) -> None:
        if any(m.body == "g:0" for m in messages):
            release.wait(30)  # g:0 runs long

    handler = Batches(answer)
    rig = batch_rig(
        memory, clock, handler, queue="jobs.fifo", dead_letter=False, store=store, concurrency=2
    )
    send_all(rig.queue, [keyed_in_group(f"g:{n}", f"k{n}") for n in range(2)])
    rig.worker.start()
    try:
        wait_until(lambda: handler.batches == [["g:0"]])
        for _ in range(20):  # g:1's key is free again, g:0 still runs
            clock.advance(1)
            threading.Event().wait(0.005)
        assert handler.batches == [["g:0"]]  # g:1 waits for g:0, as its group must
    finally:
        release.set()
    rig.advance_until(lambda: rig.count("deleted") == 2)
    assert handler.bodies == ["g:0", "g:1"]
    assert rig.stop() == 0


def test_a_batch_that_raises_shows_its_traceback_once_not_once_a_message(
    memory: MemorySQS, clock: FakeClock, json_logs: io.StringIO
) -> None:
    def fails(messages: list[Message]) -> None:
        raise RuntimeError(f"bulk insert of {len(messages)} failed")

    observers = [LogObserver("tests.batch")]
    rig = batch_rig(
        memory, clock, fails, batch_size=3, concurrency=1, max_receive_count=1, observers=observers
    )
    rig.send(*[f"m{i}" for i in range(6)])
    rig.worker.start()
    rig.advance_until(lambda: rig.count("failed") == 6)
    assert rig.stop() == 0
    lines = [json.loads(line) for line in json_logs.getvalue().splitlines()]
    last = [line for line in lines if line["event"].startswith("handler failed on its last")]
    assert len(last) == 6 and all("bulk insert of 3 failed" in line["error"] for line in last)
    traced = [line for line in last if "exception" in line]
    assert len(traced) == 2  # one a batch, on its first message's line
    assert all("RuntimeError: bulk insert of 3 failed" in line["exception"] for line in traced)
