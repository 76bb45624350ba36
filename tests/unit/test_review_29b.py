"""From the second independent review of the change "no message can stop a worker" (after
its fixes): each test reproduces a defect on the in-memory SQS, and fails until it is fixed."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from sqsworker import Message
from sqsworker.clock import FakeClock
from sqsworker.settling import Settler
from sqsworker.stores.memory import MemoryStore
from sqsworker.transports import send_all
from sqsworker.transports.memory import MemorySQS

from ..conftest import wait_until
from .helpers import Gate, Rig, keyed

# -- _contain: a deferred message someone else took from _deferred first -------------------


def test_a_step_failing_after_a_deferral_the_shutdown_took_does_not_finish_it_twice(
    memory: MemorySQS, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A busy key's duplicate is put among the deferred; before the next step of ours
    fails (here the span's "deferred" note), the shutdown drains ``_deferred``: it counts
    the duplicate out of ``_unfinished`` and hands it back. ``_contain`` then removes
    nothing (the entry is gone), and the thread finishes the message a second time.
    ``_unfinished`` drops to 0 while the first delivery still runs: the shutdown calls it
    clean and stops the lease thread under the running handler.

    What should happen: ``_contain`` settles and finishes a deferred message only if it
    took it from ``_deferred`` itself; ``in_hand`` counts the running handler, and the
    shutdown waits for it."""
    gate = Gate()
    ran: list[str] = []

    def handler(message: Message) -> None:
        if message.body == "long":
            gate(message)
        ran.append(message.body)

    rig = Rig(
        memory,
        clock,
        handler,
        store=MemoryStore(),
        concurrency=2,
        shutdown_timeout=30,
        idempotency_key="attribute:key",
    )
    worker = rig.worker
    original = Settler.traced
    stopping: list[Any] = []

    def note(settler: Settler, message: Message, outcome: str, *args: Any, **kwargs: Any) -> None:
        if outcome == "deferred" and not stopping:
            stopping.append(rig.begin_stop())
            wait_until(lambda: worker.inbox.closing and not worker.inbox.deferred, what="drained")
            raise RuntimeError("a bug of ours after the deferral")
        original(settler, message, outcome, *args, **kwargs)

    monkeypatch.setattr(Settler, "traced", note)
    send_all(rig.queue, [keyed("long", "k")])
    worker.start()
    assert gate.started.wait(10)
    send_all(rig.queue, [keyed("long", "k")])
    try:
        rig.advance_until(lambda: rig.count("worker_errors") == 1)
        threading.Event().wait(0.2)  # the thread finishes the duplicate (a second time)
        assert worker.in_hand == 1, f"in hand {worker.in_hand}: the first delivery runs"
        assert rig._stopper.is_alive(), "the shutdown ended clean under a running handler"
    finally:
        gate.release.set()
    assert stopping[0]() == 0
    assert ran == ["long"]


def test_a_step_failing_after_a_deferral_another_thread_took_leaves_its_run_alone(
    memory: MemorySQS, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, but it is another handler thread that takes the duplicate from
    ``_deferred`` before the failing step: its key is free by then (the first delivery
    asked for a retry), so that thread claims the key and runs the handler on it.
    ``_contain`` in the first thread, finding no entry to remove, goes on all the same:
    it releases the key's claim under the running handler and returns the message: the
    running handler loses its lease, the message is received again (one of its receives
    used up) while it runs, and both threads finish it, so ``in_hand`` drops below what
    runs.

    What should happen: a message another thread took from the deferred is that thread's;
    the failing step is reported, nothing more; the duplicate runs once."""
    import sqsworker

    gate, dup_gate, dup_started = Gate(), threading.Event(), threading.Event()
    runs: list[str] = []
    first: list[str] = []

    def handler(message: Message) -> None:
        runs.append(message.message_id)
        if not first:
            first.append(message.message_id)
            gate(message)
            raise sqsworker.Retry(3600, "the first delivery comes back much later")
        if message.message_id != first[0]:
            dup_started.set()
            dup_gate.wait(30)

    rig = Rig(
        memory,
        clock,
        handler,
        store=MemoryStore(),
        concurrency=3,
        idempotency_key="attribute:key",
    )
    worker = rig.worker
    original = Settler.traced
    failed: list[str] = []

    def note(settler: Settler, message: Message, outcome: str, *args: Any, **kwargs: Any) -> None:
        if outcome == "deferred" and not failed:
            failed.append(message.message_id)
            gate.release.set()  # the first delivery ends: its key is free
            wait_until(lambda: rig.count("retry_requested") == 1, what="key released")
            for _ in range(11):  # the duplicate's time among the deferred comes (a second
                clock.advance(1)  # at a time: the lease thread renews as it would)
                threading.Event().wait(0.005)
            wait_until(dup_started.is_set, what="the duplicate runs on another thread")
            raise RuntimeError("a bug of ours after the deferral")
        original(settler, message, outcome, *args, **kwargs)

    monkeypatch.setattr(Settler, "traced", note)
    send_all(rig.queue, [keyed("long", "k")])
    worker.start()
    assert gate.started.wait(10)
    send_all(rig.queue, [keyed("long", "k")])
    try:
        rig.advance_until(lambda: rig.count("worker_errors") == 1)
        for _ in range(10):  # past the backoff a return would have had
            clock.advance(1)
            threading.Event().wait(0.005)
        dup = failed[0]
        assert runs.count(dup) == 1, "returned and run again while its first run holds it"
        counts = dict(rig.tally.counts)
        assert rig.count("leases_lost") == 0, f"returned under its running handler: {counts}"
        assert rig.count("received") == 2, f"received again while it ran: {counts}"
        assert worker.in_hand == 1, f"in hand {worker.in_hand}: the duplicate runs"
    finally:
        dup_gate.set()
    rig.advance_until(lambda: rig.count("deleted") >= 1)
    assert rig.stop() == 0


class Abort(BaseException):
    """Not an Exception: a step of ours that raises one ends the thread (a fault)."""


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # by design
def test_a_fault_after_a_deferral_on_the_one_message_path_leaves_it_in_the_deferred(
    memory: MemorySQS, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step of ours raises a BaseException after ``_admit`` put a busy key's duplicate
    among the deferred. ``_work`` returns it at once and finishes it, and its thread ends,
    as designed, but the entry stays in ``_deferred`` (the batch path removes it; this one
    does not): when its time comes another thread takes it, cannot begin it, and finishes
    it a second time. ``in_hand`` drops below what the worker holds.

    What should happen: a message returned for a fault leaves ``_deferred`` and is finished
    once."""
    gate = Gate()

    rig = Rig(
        memory,
        clock,
        gate,
        store=MemoryStore(),
        concurrency=3,
        idempotency_key="attribute:key",
    )
    worker = rig.worker
    original = Settler.traced
    failed: list[str] = []

    def note(settler: Settler, message: Message, outcome: str, *args: Any, **kwargs: Any) -> None:
        if outcome == "deferred" and not failed:
            failed.append(message.message_id)
            raise Abort("a fault of ours after the deferral")
        original(settler, message, outcome, *args, **kwargs)

    monkeypatch.setattr(Settler, "traced", note)
    send_all(rig.queue, [keyed("long", "k")])
    worker.start()
    assert gate.started.wait(10)
    send_all(rig.queue, [keyed("long", "k")])
    try:
        rig.advance_until(lambda: bool(failed) and worker.health().handlers_alive == 2)
        start = clock.monotonic()
        rig.advance_until(lambda: rig.count("skipped") >= 1 or clock.monotonic() > start + 30)
        assert rig.count("skipped") == 0, "a returned message was taken from the deferred"
        assert worker.keeper is not None
        unsettled = len(worker.keeper.unsettled())
        assert worker.in_hand == unsettled, f"in hand {worker.in_hand}, held {unsettled}"
    finally:
        gate.release.set()
    rig.advance_until(lambda: rig.queue.counts().total == 0, step=5)
    rig.stop()


def test_a_batch_step_failing_after_a_deferral_the_shutdown_took_does_not_finish_it_twice(
    memory: MemorySQS, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first test's defect on the batch path: ``_prepare`` contains the duplicate whose
    entry the shutdown already drained, returns DONE, and ``_work_batches`` finishes it a
    second time; the shutdown then ends "clean" under the running batch.

    What should happen: as there, the duplicate is finished once; the shutdown waits."""
    import sqsworker

    gate = Gate()
    ran: list[str] = []

    def handler(messages: list[Message]) -> None:
        for message in messages:
            gate(message)
            ran.append(message.body)

    rig = Rig(
        memory,
        clock,
        sqsworker.batch_handler()(handler),
        store=MemoryStore(),
        concurrency=2,
        batch_size=1,
        batch_window=0.0,
        shutdown_timeout=30,
        idempotency_key="attribute:key",
    )
    worker = rig.worker
    original = Settler.traced
    stopping: list[Any] = []

    def note(settler: Settler, message: Message, outcome: str, *args: Any, **kwargs: Any) -> None:
        if outcome == "deferred" and not stopping:
            stopping.append(rig.begin_stop())
            wait_until(lambda: worker.inbox.closing and not worker.inbox.deferred, what="drained")
            raise RuntimeError("a bug of ours after the deferral")
        original(settler, message, outcome, *args, **kwargs)

    monkeypatch.setattr(Settler, "traced", note)
    send_all(rig.queue, [keyed("long", "k")])
    worker.start()
    assert gate.started.wait(10)
    send_all(rig.queue, [keyed("long", "k")])
    try:
        rig.advance_until(lambda: rig.count("worker_errors") == 1)
        threading.Event().wait(0.2)  # the thread finishes the duplicate (a second time)
        assert worker.in_hand == 1, f"in hand {worker.in_hand}: the first batch runs"
        assert rig._stopper.is_alive(), "the shutdown ended clean under a running handler"
    finally:
        gate.release.set()
    assert stopping[0]() == 0
    assert ran == ["long"]
