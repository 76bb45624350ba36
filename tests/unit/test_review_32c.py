"""Review 32c: the answer of a batch call that names an entry neither successful nor
failed (``EntryNotAnswered``, commit 75461ab), as its consumers take it."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from sqsworker import Message
from sqsworker.clock import FakeClock
from sqsworker.idempotency import CLAIM_MARGIN
from sqsworker.lease_machine import LeaseMachine
from sqsworker.lease_state import Entry
from sqsworker.stores.memory import MemoryStore
from sqsworker.transports import BatchResult, OutgoingMessage, send_all
from sqsworker.transports.memory import MemorySQS, MemoryTransport
from sqsworker.transports.sqs import _batch_result

from ..conftest import wait_until
from .helpers import Rig

T0 = 1000.0


def keyed(body: str, key: str) -> OutgoingMessage:
    return OutgoingMessage(
        body, message_attributes={"idempotency-key": {"DataType": "String", "StringValue": key}}
    )


class Blocking:
    def __init__(self) -> None:
        self.runs: list[str] = []
        self.release = threading.Event()

    def __call__(self, message: Message) -> None:
        self.runs.append(message.body)
        self.release.wait(30)


class AppliedUnnamed(MemoryTransport):
    """A proxy that forwards each renewal to SQS (which applies it) and answers 200 with a
    body botocore reads as ``{}``: an answer naming no entry, read by the transport's own
    ``_batch_result``."""

    def change_visibility_batch(self, entries: Sequence[tuple[str, str, int]]) -> BatchResult:
        super().change_visibility_batch(entries)
        return _batch_result({}, [entry_id for entry_id, _, _ in entries])


def test_an_unnamed_renewal_counts_as_maybe_applied_like_a_lost_answer() -> None:
    """An entry the answer did not name is not known renewed (its lease still ends where
    it did: right), but SQS may have applied it, exactly as when the whole call's answer
    is lost: ``may_hold`` must reach the end SQS may have set, as ``renewal_failed``
    (retryable) makes it."""
    unnamed = _batch_result({}, ["0"])
    lost = LeaseMachine(delete_interval=0.2)
    entry_lost = Entry("h1", T0, 30)
    lost.received([entry_lost])
    lost.renewal_failed([entry_lost], 30, T0 + 15, True, T0 + 15.02)

    machine = LeaseMachine(delete_interval=0.2)
    entry = Entry("h2", T0, 30)
    machine.received([entry])
    failures = {int(f.id): f for f in unnamed.failed}
    machine.renewed([entry], 30, T0 + 15, failures, T0 + 15.02)

    later = T0 + 35  # past the lease the worker counts, short of the renewal SQS may have set
    assert entry_lost.may_hold(later) > 0  # the whole-call loss: counted
    assert entry.may_hold(later) > 0, (
        "an entry the answer did not name may have been renewed by SQS, yet the worker "
        "counts SQS as hiding the message no longer than the lease it knew"
    )


def test_a_duplicate_never_runs_while_sqs_may_hold_the_original_for_an_unnamed_renewal(
    memory: MemorySQS, clock: FakeClock
) -> None:
    """As tests/unit/test_idempotency.py's lost-answer test, with the renewals answered
    by a 200 naming no entry (SQS applied them): the worker counts its lease lost, but
    SQS still hides the original under its handle; the key's claim must last as long,
    so the copy waits instead of running beside the original (docs/delivery.md)."""
    store = MemoryStore()
    first = Blocking()
    second: list[str] = []
    memory.create_queue_with_dlq("jobs", 3)
    lossy = AppliedUnnamed(memory, memory.transport("jobs").info)
    one = Rig(
        memory, clock, first, store=store, transport=lossy, concurrency=1, visibility_timeout=120
    )
    two = Rig(MemorySQS(clock), clock, lambda m: second.append(m.body), store=store)
    try:
        send_all(one.queue, [keyed("a", "k")])
        one.worker.start()
        wait_until(lambda: first.runs == ["a"])
        one.advance_until(lambda: one.count("leases_lost") == 1, step=1)
        lost_at = clock.monotonic()
        [held] = memory._queues["jobs"].messages.values()
        assert held.visible_at > lost_at + CLAIM_MARGIN + 30  # renewals SQS applied
        send_all(two.queue, [keyed("a", "k")])
        two.worker.start()
        two.wait_for("duplicates_deferred", 1)
        one.advance_until(lambda: clock.monotonic() > lost_at + CLAIM_MARGIN + 20, step=2)
        two.advance_until(lambda: two.count("duplicates_deferred") >= 5 or bool(second), step=2)
        assert clock.monotonic() < held.visible_at
        assert second == [], "the copy ran while SQS still held the original under its lease"
    finally:
        first.release.set()
        one.stop()
        two.stop()
