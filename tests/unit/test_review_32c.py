"""Review 32c: the answer of a batch call that names an entry neither successful nor
failed (``EntryNotAnswered``, commit 75461ab), as its consumers take it."""

from __future__ import annotations

from sqsworker.lease_machine import LeaseMachine
from sqsworker.lease_state import Entry
from sqsworker.transports.answers import batch_result

T0 = 1000.0


def test_an_unnamed_renewal_counts_as_maybe_applied_like_a_lost_answer() -> None:
    """An entry the answer did not name is not known renewed (its lease still ends where
    it did: right), but SQS may have applied it, exactly as when the whole call's answer
    is lost: ``may_hold`` must reach the end SQS may have set, as ``renewal_failed``
    (retryable) makes it."""
    unnamed = batch_result("ChangeMessageVisibilityBatch", {}, ["0"])
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
