"""``settling.decide``: every rule of where a message goes, as a table of plain values."""

from __future__ import annotations

from typing import Any

import pytest

from sqsworker.batches import BatchReportError
from sqsworker.errors import MessageDecodeError, Reject, Retry
from sqsworker.settling import (
    BUSY_REASON,
    COPY_REFUSED_REASON,
    NO_DEAD_LETTER_QUEUE,
    WORKER_ERROR,
    Action,
    Decision,
    Outcome,
    decide,
    outcome_of,
)

BACKOFF_MAX = 900.0


def backoff(count: int) -> float:
    return 10.0 * count  # a distinct delay for each receive count


def failing_backoff(count: int) -> float:
    raise OverflowError("a backoff of ours with a bug")


def delete(urgent: bool = False) -> Decision:
    return Decision(Action.DELETE, urgent=urgent)


def back(delay: float, reason: str = "retry", last: bool = False) -> Decision:
    return Decision(Action.RETURN, delay, reason, last_attempt=last)


# (outcome, receive count, maxReceiveCount, dead-letter queue, delay given, blocks group)
#   -> decision
TABLE: list[tuple[Outcome, int, int | None, bool, float | None, bool, Decision]] = [
    # Handled, or a duplicate of one handled: deleted; at once when its FIFO group waits.
    (Outcome.SUCCEEDED, 1, 3, True, None, False, delete()),
    (Outcome.SUCCEEDED, 1, 3, True, None, True, delete(urgent=True)),
    (Outcome.DUPLICATE, 2, 3, True, None, False, delete()),
    (Outcome.DUPLICATE, 2, None, False, None, True, delete(urgent=True)),
    # Failed: back after its backoff; on its last attempt at once (SQS moves it next).
    (Outcome.FAILED, 1, 3, True, None, False, back(10.0)),
    (Outcome.FAILED, 2, 3, True, None, False, back(20.0)),
    (Outcome.FAILED, 3, 3, True, None, False, back(0.0, last=True)),
    (Outcome.FAILED, 7, None, False, None, False, back(70.0)),
    # The handler's Retry(delay): that delay, unless it is the last attempt.
    (Outcome.RETRY, 1, 3, True, 5.0, False, back(5.0)),
    (Outcome.RETRY, 1, 3, True, None, False, back(10.0)),
    (Outcome.RETRY, 3, 3, True, 5.0, False, back(0.0, last=True)),
    # Rejected: to the dead-letter queue; kept, retried rarely, when there is none.
    (Outcome.REJECTED, 1, 3, True, None, False, Decision(Action.DEAD_LETTER, urgent=True)),
    (Outcome.REJECTED, 1, None, False, None, False, back(BACKOFF_MAX, NO_DEAD_LETTER_QUEUE)),
    # Its copy failed, or is refused: back after its backoff, never sooner.
    (Outcome.COPY_FAILED, 1, 3, True, None, False, back(10.0)),
    (Outcome.COPY_FAILED, 3, 3, True, None, False, back(0.0, last=True)),
    (Outcome.COPY_REFUSED, 2, 3, True, None, False, back(20.0, COPY_REFUSED_REASON)),
    # A step of the worker's own failed: the message's failure, never its thread's.
    (Outcome.STEP_FAILED, 1, 3, True, None, False, back(10.0, WORKER_ERROR)),
    (Outcome.STEP_FAILED, 3, 3, True, None, False, back(0.0, WORKER_ERROR, last=True)),
    # A busy key's duplicate that may not be held: back when the key may be free.
    (Outcome.BUSY, 1, 3, True, 4.0, False, back(4.0, BUSY_REASON)),
]


@pytest.mark.parametrize(("outcome", "count", "limit", "dlq", "delay", "blocks", "expected"), TABLE)
def test_each_outcome_goes_where_the_rules_say(
    outcome: Outcome,
    count: int,
    limit: int | None,
    dlq: bool,
    delay: float | None,
    blocks: bool,
    expected: Decision,
) -> None:
    decision = decide(
        outcome,
        receive_count=count,
        max_receive_count=limit,
        dead_letter_queue=dlq,
        backoff=backoff,
        backoff_max=BACKOFF_MAX,
        delay=delay,
        blocks_its_group=blocks,
    )
    assert decision == expected


def test_every_outcome_is_in_the_table() -> None:
    assert {row[0] for row in TABLE} == set(Outcome)


def test_a_failing_backoff_is_a_step_failing_where_it_is_a_step_and_bounded() -> None:
    """The handler's failure with a backoff that raises raises (the runner contains it as
    a step failing); the containment's own return, and the copy's, fall back on the
    longest backoff instead of raising again."""
    common: dict[str, Any] = {
        "receive_count": 1,
        "max_receive_count": 3,
        "dead_letter_queue": True,
        "backoff": failing_backoff,
        "backoff_max": BACKOFF_MAX,
    }
    with pytest.raises(OverflowError):
        decide(Outcome.FAILED, **common)
    for outcome, reason in [
        (Outcome.STEP_FAILED, WORKER_ERROR),
        (Outcome.COPY_FAILED, "retry"),
        (Outcome.COPY_REFUSED, COPY_REFUSED_REASON),
    ]:
        assert decide(outcome, **common) == back(BACKOFF_MAX, reason)


class Permanent(Exception):
    pass


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (None, Outcome.SUCCEEDED),
        (Retry(5, "later"), Outcome.RETRY),
        (Reject("no"), Outcome.REJECTED),
        (MessageDecodeError("not JSON"), Outcome.REJECTED),  # a Reject
        (Permanent("listed in --non-retryable"), Outcome.REJECTED),
        (ValueError("anything else"), Outcome.FAILED),
        (KeyboardInterrupt(), Outcome.FAILED),  # never rejected: not an Exception
        # Ours, not the handler's: retried whatever --non-retryable lists.
        (BatchReportError("a batch report we cannot read"), Outcome.FAILED),
    ],
)
def test_what_a_handler_raised_means(error: BaseException | None, expected: Outcome) -> None:
    assert outcome_of(error, (Permanent, KeyboardInterrupt, BatchReportError)) is expected
