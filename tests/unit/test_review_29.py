"""From the independent review of the change "no message can stop a worker": each test
reproduced a defect of it on the in-memory SQS, and failed until the defect was fixed."""

from __future__ import annotations

import itertools
import threading
from typing import Any

import pytest

from sqsworker import Backoff, Message
from sqsworker.clock import FakeClock
from sqsworker.errors import TransportError
from sqsworker.settling import Settler
from sqsworker.stores.memory import MemoryStore
from sqsworker.transports import OutgoingMessage, send_all
from sqsworker.transports.memory import MemorySQS

from .helpers import Gate, Rig, keyed

# -- _receive_again: a FIFO receive SQS never saw, made again at the stop ------------------


def test_a_receive_that_never_reached_sqs_is_not_made_at_the_stop(
    memory: MemorySQS, clock: FakeClock
) -> None:
    """A FIFO receive fails before SQS saw it (connection refused); the stop comes during
    the pause after it. Shutdown's ``_receive_again`` sends that attempt id again, which
    SQS takes for a new receive: it hides up to ten messages this worker never asked for,
    hands them straight back, and so uses up one of each one's receives. With
    maxReceiveCount 1, SQS then moves them to the dead-letter queue never run.

    What should happen: a message no handler ran keeps its receives; the stop receives
    nothing new."""
    ran: list[str] = []
    rig = Rig(
        memory,
        clock,
        lambda m: ran.append(m.body),
        queue="jobs.fifo",
        max_receive_count=1,
    )
    memory.inject_fault(
        "ReceiveMessage",
        TransportError("ReceiveMessage: connection refused", retryable=True),
        times=1,
    )
    rig.worker.start()
    rig.wait_for("receive_failures", 1)  # paused now: the fake clock does not move
    send_all(
        rig.queue,
        [OutgoingMessage(f"m{i}", group_id="g", deduplication_id=f"m{i}") for i in range(3)],
    )
    assert rig.stop() == 0
    assert ran == []
    # The next receive (another worker's): the messages must come to run, first receive.
    again = rig.queue.receive(10, 0, 30)
    assert rig.dlq is not None
    assert rig.dlq.counts().total == 0, "moved to the dead-letter queue, never run"
    assert [e.receive_count for e in again] == [1, 1, 1]
    assert rig.count("received") == 0, "the stop received messages nothing asked for"


# -- deferred duplicates: on their last attempt they take room again ------------------------


def test_duplicates_on_their_last_attempt_do_not_starve_other_messages(
    memory: MemorySQS, clock: FakeClock
) -> None:
    """Forty copies of a message whose first delivery runs long. Past ``max_deferred`` a
    copy goes back to the queue; it comes back on its last attempt, and is then held
    whatever the bound (so that SQS does not dead-letter a healthy duplicate), taking room
    of runnable messages. The room fills with such copies, the receives stop, and none of
    twenty unrelated messages runs while the first delivery does: issue 29's defect 5
    again, one receive later.

    What should happen: held duplicates never take the room of runnable messages (the
    unrelated ones run while the first delivery still runs), and none goes to the
    dead-letter queue."""
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
        visibility_timeout=60,
        max_receive_count=2,
        idempotency_key="attribute:key",
    )
    send_all(rig.queue, [keyed("long", "k")])
    rig.worker.start()
    assert gate.started.wait(10)
    send_all(rig.queue, [keyed("long", "k")] * 40)
    # Each copy is deferred or returned; the returned ones come back on their last attempt.
    rig.advance_until(lambda: rig.count("duplicates_deferred") >= 60, step=5, limit=100)
    send_all(rig.queue, [keyed(f"m{i}", f"m{i}") for i in range(20)])
    try:
        rig.advance_until(lambda: len(ran) == 20, step=5, limit=60)
        assert sorted(ran) == sorted(f"m{i}" for i in range(20))  # while the first one ran
    finally:
        gate.release.set()
    rig.advance_until(lambda: rig.queue.counts().total == 0, step=5)
    assert rig.dlq is not None and rig.dlq.counts().total == 0  # no healthy duplicate dead
    assert rig.stop() == 0


# -- containment of a message already deferred ----------------------------------------------


def test_a_step_that_fails_after_a_duplicate_was_deferred_settles_it_once(
    memory: MemorySQS, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step of ours raises after ``_admit`` put a busy key's duplicate among the
    deferred (here the span's "deferred" note; any step after the append is the same).
    ``_contain`` returns the message and the thread finishes it, but it stays in
    ``_deferred``: when its time comes it is taken again, cannot begin, and is finished a
    second time. ``_unfinished`` drops below what is held: the first delivery still runs,
    yet the worker counts nothing in hand, and a shutdown then stops at once "clean",
    stopping the lease thread under the running handler.

    What should happen: a contained message leaves ``_deferred`` (as the batch path
    does), and is finished once; ``in_hand`` counts the running handler."""
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
        idempotency_key="attribute:key",
    )
    worker = rig.worker
    original = Settler.traced
    failed: list[str] = []

    def note(settler: Settler, message: Message, outcome: str, *args: Any, **kwargs: Any) -> None:
        if outcome == "deferred" and not failed:
            failed.append(message.message_id)
            raise RuntimeError("a bug of ours after the deferral")
        original(settler, message, outcome, *args, **kwargs)

    monkeypatch.setattr(Settler, "traced", note)
    send_all(rig.queue, [keyed("long", "k")])
    worker.start()
    assert gate.started.wait(10)
    send_all(rig.queue, [keyed("long", "k")])
    rig.advance_until(lambda: rig.count("worker_errors") == 1)
    try:
        # The duplicate's time among the deferred comes (and it came back meanwhile).
        start = clock.monotonic()
        rig.advance_until(lambda: rig.count("skipped") >= 1 or clock.monotonic() > start + 30)
        assert worker.keeper is not None
        unsettled = len(worker.keeper.unsettled())  # the first delivery, and the copy again
        assert worker.in_hand == unsettled, f"in hand {worker.in_hand}, held {unsettled}"
        assert rig.count("skipped") == 0, "a returned message was taken from the deferred"
    finally:
        gate.release.set()
    rig.advance_until(lambda: rig.queue.counts().total == 0, step=5)
    assert ran == ["long"]
    assert rig.stop() == 0


# -- batch handlers: a fault of a batch contains a message another thread runs ------------


def test_a_batch_fault_does_not_return_its_deferred_message_running_elsewhere(
    memory: MemorySQS, clock: FakeClock, monkeypatch: Any
) -> None:
    """A batch [dup, x]: ``dup``'s key is busy, so it is deferred while ``x`` runs. The
    key frees, ``dup``'s time comes, and the other handler thread takes it and runs it.
    Then a step of ours fails in the first batch after its handler (here the reading of
    its report). ``_work_batches`` contains every message of that batch with no outcome,
    ``dup`` included, though the other thread runs it: its claim is released under the
    running handler and it is returned; it comes back after the backoff and runs again
    while the first run still holds it (and both threads finish it).

    What should happen: a fault of a batch settles only the messages that batch still
    holds; ``dup`` is run once, by the thread that took it, and deleted."""
    import sqsworker
    from sqsworker import batches

    first, x_gate, dup_gate = threading.Event(), threading.Event(), threading.Event()
    x_started, dup_started = threading.Event(), threading.Event()
    runs: list[str] = []

    def role(message: Message) -> str:
        return str(message.message_attributes["role"])

    def handler(messages: list[Message]) -> None:
        bodies = [role(m) for m in messages]
        runs.extend(bodies)
        if "first" in bodies:
            first.wait(30)
            raise sqsworker.Retry(3600, "the first delivery fails: its key is free again")
        if "x" in bodies:
            x_started.set()
            x_gate.wait(30)
        if bodies == ["dup"] and runs.count("dup") == 1:
            dup_started.set()
            dup_gate.wait(30)

    outcomes = batches.outcomes

    def buggy(messages: Any, returned: object, raised: BaseException | None) -> Any:
        if any(role(m) == "x" for m in messages):
            raise RuntimeError("a bug of ours reading the batch's report")
        return outcomes(messages, returned, raised)

    monkeypatch.setattr(batches, "outcomes", buggy)
    rig = Rig(
        memory,
        clock,
        sqsworker.batch_handler()(handler),
        store=MemoryStore(),
        concurrency=2,
        batch_size=2,
        batch_window=0.0,
        idempotency_key="attribute:key",
    )

    def sent(role: str, key: str) -> OutgoingMessage:
        attributes = keyed("job", key).message_attributes
        return OutgoingMessage(
            "job", {**attributes, "role": {"DataType": "String", "StringValue": role}}
        )

    send_all(rig.queue, [sent("first", "k")])
    rig.worker.start()
    rig.advance_until(lambda: "first" in runs)
    send_all(rig.queue, [sent("dup", "k"), sent("x", "x")])
    rig.advance_until(x_started.is_set)  # dup deferred: its key is busy
    assert rig.count("duplicates_deferred") == 1, (runs, dict(rig.tally.counts))
    first.set()  # the key is free; dup's time among the deferred comes
    rig.advance_until(dup_started.is_set)
    x_gate.set()  # the first batch's fault: dup is running on the other thread
    rig.wait_for("worker_errors", 1)
    try:
        for _ in range(10):  # past the backoff a return would have had
            clock.advance(1)
            threading.Event().wait(0.005)
        assert runs.count("dup") == 1, "returned and run again while its first run holds it"
    finally:
        dup_gate.set()
    rig.advance_until(lambda: rig.count("deleted") >= 1)
    assert rig.stop() == 0


# -- a rejected message no copy of which the dead-letter queue takes -------------------------


def test_a_message_whose_copy_is_refused_does_not_circle_without_a_backoff(
    memory: MemorySQS, clock: FakeClock
) -> None:
    """The dead-letter queue takes less than the source queue, so no copy of a rejected
    message fits. The worker remembers its id and returns it "unrun" with no delay each
    time it comes, until SQS's redrive moves it: with maxReceiveCount 10 it is received
    ten times at one instant (with 1,000, SQS's largest, a thousand), each a receive and
    a visibility change, and a handler thread's turn. "No message can circle without a
    backoff" does not hold for it.

    What should happen: each return of it waits at least a backoff."""
    from collections.abc import Sequence

    from sqsworker import Reject
    from sqsworker.events import Observer

    seen: list[float] = []

    class Receives(Observer):
        def received(self, messages: Sequence[Message]) -> None:
            seen.extend(clock.monotonic() for m in messages if m.body.startswith("z"))

    def refuse(message: Message) -> None:
        raise Reject("never")

    rig = Rig(memory, clock, refuse, observers=[Receives()], max_receive_count=10, wait_time=8)
    rig.worker.backoff = Backoff(2.0, 60.0)  # ten receives within the test's steps
    memory.create_queue("jobs-dlq", {"MaximumMessageSize": "1024"})  # smaller than the source
    rig.dlq = memory.transport("jobs-dlq")
    rig.send("z" * 2000)
    rig.worker.start()
    rig.advance_until(
        lambda: rig.dlq is not None and rig.dlq.counts().total == 1, step=5, limit=400
    )
    gaps = [b - a for a, b in itertools.pairwise(seen)]
    assert len(seen) == 10
    assert min(gaps) >= 1.0, f"received {len(seen)} times, at {[round(g) for g in gaps]} s apart"
    assert rig.stop_past_timeout() == 0  # its long poll under way passes on the fake clock


# -- a key the store cannot hold ----------------------------------------------------------


def test_a_json_key_no_store_can_hold_is_rejected_with_its_reason(
    memory: MemorySQS, clock: FakeClock, tmp_path: Any
) -> None:
    """``{"order": {"id": "\\ud800"}}`` is ASCII, so SQS takes it, and valid JSON; the key
    it yields holds a lone surrogate, which SQLite cannot encode: the claim raises
    UnicodeEncodeError, not a StoreError. Contained, it is a "worker error" returned after
    a backoff, again on every receive: it never goes to the dead-letter queue with its
    reason (on a queue with no redrive policy it circles for ever), and each time it
    counts as a bug of the worker's.

    What should happen: a key the store cannot take is an ``IdempotencyKeyError`` (a
    ``Reject``): dead-lettered at once with the reason, as issue 29's defect 3 has it for
    every key that cannot be had."""
    from sqsworker.stores import open_store

    ran: list[str] = []
    rig = Rig(
        memory,
        clock,
        lambda m: ran.append(m.body),
        store=open_store(f"sqlite:///{tmp_path / 'keys.db'}"),
        idempotency_key="json:order.id",
    )
    hostile = '{"order": {"id": "\\ud800"}}'
    rig.send(hostile, '{"order": {"id": 1}}')
    rig.worker.start()
    rig.advance_until(
        lambda: (
            rig.count("succeeded") == 1 and rig.count("worker_errors") + rig.count("rejected") >= 1
        )
    )
    assert rig.count("worker_errors") == 0, "counted as a bug of the worker's, and returned"
    assert rig.dlq is not None
    dead = rig.dlq.receive(10, 0, 30)
    assert [m.body for m in dead] == [hostile]
    assert "sqsworker-error" in dead[0].message_attributes
    assert rig.stop() == 0


def test_a_stop_does_not_send_healthy_duplicates_to_the_dead_letter_queue(
    memory: MemorySQS, clock: FakeClock
) -> None:
    """Past ``max_deferred`` a busy key's duplicate is returned, which uses up one of its
    receives each time; held on its last attempt, it is handed back at the stop (the
    deferred ones are), and the next receive moves it to the dead-letter queue. Before
    the change duplicates were held with their first receive, and a restart cost them
    one: a rolling restart now dead-letters healthy duplicates.

    What should happen: a healthy duplicate never reaches the dead-letter queue (issue
    13's rule): returning one must not use up the receives a stop then needs."""
    gate = Gate()
    rig = Rig(
        memory,
        clock,
        gate,
        store=MemoryStore(),
        concurrency=2,
        visibility_timeout=60,
        max_receive_count=2,
        idempotency_key="attribute:key",
        shutdown_timeout=5,
    )
    send_all(rig.queue, [keyed("long", "k")])
    rig.worker.start()
    assert gate.started.wait(10)
    send_all(rig.queue, [keyed("long", "k")] * 20)
    # Each is held (none goes back to use up a receive).
    rig.advance_until(lambda: rig.count("duplicates_deferred") >= 20, step=5, limit=100)
    try:
        rig.stop_past_timeout()  # a rolling restart: the first delivery is handed back too
    finally:
        gate.release.set()
    # The next worker receives them.
    assert rig.dlq is not None
    while rig.queue.receive(10, 0, 30):
        pass
    assert rig.dlq.counts().total == 0, f"{rig.dlq.counts().total} healthy duplicates dead"


# -- containment after the message was settled ------------------------------------------------


def test_a_step_failing_after_the_delete_was_queued_does_not_count_it_dead_lettered(
    memory: MemorySQS, clock: FakeClock, monkeypatch: Any
) -> None:
    """A step of ours raises after the handler succeeded and its delete was queued (here
    the end of the message's span). ``_contain`` sees the delete queued and does not
    return it, but still reports ``step_failed`` as if it had: on the message's last
    attempt the summary counts it dead-lettered (and the metric, and the log line "SQS
    moves it to the dead-letter queue on its next receive"), though it was processed and
    deleted.

    What should happen: a message already on its way out is reported as what it is
    (processed and deleted), not as a failure returned or dead-lettered."""
    from contextlib import contextmanager

    from sqsworker import running

    @contextmanager
    def consuming(tracer: Any, message: Message) -> Any:
        yield None
        raise RuntimeError("a bug of ours closing the message's span")

    monkeypatch.setattr(running.tracing, "consuming", consuming)
    rig = Rig(memory, clock, lambda m: None, max_receive_count=1)
    rig.send("x")
    rig.worker.start()
    rig.wait_for("deleted", 1)
    rig.wait_for("worker_errors", 1)
    assert rig.count("succeeded") == 1
    assert rig.dlq is not None and rig.dlq.counts().total == 0
    assert rig.count("dead_lettered") == 0, "processed and deleted, yet counted dead-lettered"
    assert rig.stop() == 0
