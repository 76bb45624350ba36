"""The lease machine on its own: no threads, no transport, the time an argument.

Every state change is in ``TRANSITIONS``; the first tests pin that table and then
drive each of its moves through the machine's own events, with the commands each
one gives. The rest pin the timing decisions (when to renew, for how long, when a
queued delete goes) as the commands given at a moment.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import pytest

from sqsworker.lease_machine import DISOWNED, EXPIRED, LAPSED, RETRY_AFTER_ERROR, LeaseMachine
from sqsworker.lease_state import (
    TRANSITIONS,
    Command,
    Deleted,
    DeletedAfterLeaseLost,
    DeleteFailed,
    Entry,
    Event,
    Extended,
    IllegalTransition,
    LeaseLost,
    NearCap,
    Op,
    Returned,
    Room,
    State,
    next_state,
)
from sqsworker.transports import EntryFailure

T0 = 1000.0
W, R, S, D, L = State.WAITING, State.RUNNING, State.SETTLING, State.DONE, State.LOST
GONE = EntryFailure("0", "ReceiptHandleIsInvalid", "The receipt handle has expired")
FLAKY = EntryFailure("0", "InternalError", "try again", sender_fault=False)

# The whole table, written out: a move added, dropped or changed fails here first.
LEGAL = {
    (W, Event.BEGIN): R,
    (S, Event.BEGIN): S,
    (D, Event.BEGIN): D,
    (L, Event.BEGIN): L,
    (R, Event.DEFER): W,
    (S, Event.DEFER): S,
    (D, Event.DEFER): D,
    (L, Event.DEFER): L,
    (W, Event.SETTLE): S,
    (R, Event.SETTLE): S,
    (S, Event.SETTLE): S,
    (D, Event.SETTLE): D,
    (L, Event.SETTLE): L,
    (W, Event.EXPIRE): L,
    (R, Event.EXPIRE): L,
    (S, Event.EXPIRE): L,
    (W, Event.GONE): L,
    (R, Event.GONE): L,
    (S, Event.GONE): L,
    (L, Event.GONE): L,
    (S, Event.REFUSED): L,
    (L, Event.REFUSED): L,
    (S, Event.CONFIRM): D,
    (L, Event.CONFIRM): L,
}


@pytest.mark.parametrize("state", list(State))
@pytest.mark.parametrize("event", list(Event))
def test_next_state_follows_the_table_and_refuses_the_rest(state: State, event: Event) -> None:
    assert TRANSITIONS == LEGAL
    if (state, event) in LEGAL:
        assert next_state(state, event) is LEGAL[state, event]
    else:
        with pytest.raises(IllegalTransition, match=f"{event.value} in state {state.value}"):
            next_state(state, event)


# -- each move, through the machine's events ---------------------------------------------


def in_state(state: State, queued: bool = False) -> tuple[LeaseMachine, Entry]:
    """A machine holding one entry (30 s lease from T0) brought to ``state`` by its events;
    ``queued``: a lost one with its delete queued."""
    machine = LeaseMachine(delete_interval=0.2)
    entry = Entry("h", T0, 30)
    machine.received([entry])
    if state in (R, S, D):
        assert machine.begin(entry, T0)
    if state in (S, D):
        machine.settle(Op(entry, "delete", urgent=True), T0)
    if state is D:
        answer(machine, T0, {})
    if state is L:
        assert machine.expire(T0 + 30)
        if queued:
            machine.settle(Op(entry, "delete", urgent=True), T0 + 30, allow_lost=True)
    machine.take()
    assert entry.state is state
    return machine, entry


def answer(machine: LeaseMachine, now: float, failures: dict[int, EntryFailure]) -> None:
    """The one call due now goes out and SQS answers it with ``failures``."""
    [call] = machine.due(now)
    if call.ops:
        machine.sending(call, now)
        machine.settled(call, failures, now)
    else:
        [(seconds, batch)] = machine.renewing(call, now).items()
        machine.renewed(batch, seconds, now, failures, now)
    machine.ended(call)


def refuse(machine: LeaseMachine, now: float) -> None:
    [call] = machine.due(now)
    machine.sending(call, now)
    machine.settle_failed(call, False, "AccessDenied", now)
    machine.ended(call)


Step = Callable[[LeaseMachine, Entry], object]
MOVES: list[tuple[State, Event, Step, State, list[type]]] = [
    (W, Event.BEGIN, lambda m, e: m.begin(e, T0 + 1), R, []),
    (S, Event.BEGIN, lambda m, e: m.begin(e, T0 + 1), S, []),
    (D, Event.BEGIN, lambda m, e: m.begin(e, T0 + 1), D, []),
    (L, Event.BEGIN, lambda m, e: m.begin(e, T0 + 31), L, []),
    (R, Event.DEFER, lambda m, e: m.defer(e), W, []),
    (S, Event.DEFER, lambda m, e: m.defer(e), S, []),
    (D, Event.DEFER, lambda m, e: m.defer(e), D, []),
    (L, Event.DEFER, lambda m, e: m.defer(e), L, []),
    (W, Event.SETTLE, lambda m, e: m.settle(Op(e, "return", 5), T0 + 1), S, []),
    (R, Event.SETTLE, lambda m, e: m.settle(Op(e, "delete"), T0 + 1), S, []),
    (S, Event.SETTLE, lambda m, e: m.settle(Op(e, "return"), T0 + 1), S, []),
    (D, Event.SETTLE, lambda m, e: m.settle(Op(e, "delete"), T0 + 1), D, []),
    (L, Event.SETTLE, lambda m, e: m.settle(Op(e, "delete"), T0 + 31, True), L, []),
    (W, Event.EXPIRE, lambda m, e: m.expire(T0 + 30), L, [LeaseLost, Room]),
    (R, Event.EXPIRE, lambda m, e: m.expire(T0 + 30), L, [LeaseLost, Room]),
    (S, Event.EXPIRE, lambda m, e: m.expire(T0 + 30), L, [LeaseLost, Room]),
    (W, Event.GONE, lambda m, e: answer(m, T0 + 15, {0: GONE}), L, [LeaseLost, Room]),
    (R, Event.GONE, lambda m, e: answer(m, T0 + 15, {0: GONE}), L, [LeaseLost, Room]),
    (S, Event.GONE, lambda m, e: answer(m, T0 + 1, {0: GONE}), L, [LeaseLost, DeleteFailed, Room]),
    (L, Event.GONE, lambda m, e: answer(m, T0 + 31, {0: GONE}), L, [DeleteFailed, Room]),
    (S, Event.REFUSED, lambda m, e: refuse(m, T0 + 1), L, [LeaseLost, DeleteFailed, Room]),
    (L, Event.REFUSED, lambda m, e: refuse(m, T0 + 31), L, [DeleteFailed, Room]),
    (S, Event.CONFIRM, lambda m, e: answer(m, T0 + 1, {}), D, [Deleted, Room]),
    (L, Event.CONFIRM, lambda m, e: answer(m, T0 + 31, {}), L, [DeletedAfterLeaseLost, Room]),
]


def test_every_move_of_the_table_is_driven_below() -> None:
    assert {(state, event) for state, event, *_ in MOVES} == set(LEGAL)


@pytest.mark.parametrize(
    ("state", "event", "step", "then", "commands"),
    MOVES,
    ids=[f"{s.value}-{e.value}" for s, e, *_ in MOVES],
)
def test_each_event_moves_its_entry_as_the_table_says(
    state: State, event: Event, step: Step, then: State, commands: list[type]
) -> None:
    machine, entry = in_state(state, queued=event in (Event.GONE, Event.REFUSED, Event.CONFIRM))
    step(machine, entry)
    assert entry.state is LEGAL[state, event] is then
    assert [type(c) for c in machine.take()] == commands
    assert machine.check() == []
    assert machine.settling == (then is S)
    assert (entry.handle in machine.held) == (then in (W, R, S))


@pytest.mark.parametrize(
    ("state", "step"),
    [
        (R, lambda m, e: m.begin(e, T0 + 1)),  # two threads on one message
        (W, lambda m, e: m.defer(e)),  # set aside before it began
    ],
    ids=["begin-running", "defer-waiting"],
)
def test_an_illegal_event_raises_at_once(state: State, step: Step) -> None:
    machine, entry = in_state(state)
    with pytest.raises(IllegalTransition):
        step(machine, entry)
    assert entry.state is state  # and changed nothing


@pytest.mark.parametrize("state", [W, R, S])
def test_a_receipt_handle_held_already_or_named_twice_is_no_new_message(state: State) -> None:
    """An answer replayed, or naming a message twice, is left out: one lease, one run."""
    machine, entry = in_state(state)
    again, fresh, twice = Entry("h", T0 + 1, 30), Entry("k", T0 + 1, 30), Entry("k", T0 + 1, 30)
    assert machine.received([again, fresh, twice]) == [fresh]
    assert machine.held == {"h": entry, "k": fresh}
    assert entry.state is state and again.state is W
    assert machine.check() == []


def test_a_call_is_sent_once_answered_once_and_ends_once() -> None:
    machine, _entry = in_state(S)
    [call] = machine.due(T0 + 1)
    with pytest.raises(IllegalTransition, match="not under way"):
        machine.settled(call, {}, T0 + 1)  # before it went
    machine.sending(call, T0 + 1)
    with pytest.raises(IllegalTransition, match="sent twice"):
        machine.sending(call, T0 + 1)
    machine.settled(call, {}, T0 + 1)
    machine.ended(call)
    with pytest.raises(IllegalTransition, match="ended twice"):
        machine.ended(call)
    with pytest.raises(IllegalTransition, match="not under way"):
        machine.settled(call, {}, T0 + 1)


def test_a_message_handed_back_may_not_begin_and_its_lease_counts_as_lost() -> None:
    machine, entry = in_state(W)
    assert machine.hand_back(entry)
    assert machine.begin(entry, T0 + 1) is False
    assert entry.lost and entry.left(T0 + 1) == 0 and entry.state is W
    machine, entry = in_state(S)
    assert not machine.hand_back(entry)  # settled already: nothing to mark


# -- timing: the calls given at a moment -------------------------------------------------


def test_a_lease_is_renewed_at_half_with_those_due_within_a_quarter_riding_along() -> None:
    machine = LeaseMachine()
    a, b, c = Entry("a", T0, 30), Entry("b", T0 + 5, 30), Entry("c", T0 + 10, 30)
    machine.received([a, b, c])
    assert machine.next_deadline(T0) == T0 + 15
    assert machine.due(T0 + 14.9) == []
    [call] = machine.due(T0 + 15)
    assert call.renewals == [a, b]  # b's renewal (T0 + 20) is within 7.5 s; c's is not
    assert machine.renewing(call, T0 + 15) == {30: [a, b]}
    machine.renewed([a, b], 30, T0 + 15, {}, T0 + 15.1)
    machine.ended(call)
    assert (a.expires_at, a.renew_at, a.renewals) == (T0 + 45, T0 + 30, 1)
    assert [type(x) for x in machine.take()] == [Extended]
    assert machine.next_deadline(T0 + 15.1) == T0 + 25  # c's renewal


def test_a_delete_waits_out_the_delete_interval_to_fill_a_batch_and_ten_go_at_once() -> None:
    machine = LeaseMachine(delete_interval=0.2)
    entries = [Entry(f"h{i}", T0, 30) for i in range(11)]
    machine.received(entries)
    assert machine.settle(Op(entries[0], "delete"), T0 + 1) == T0 + 1.2
    assert machine.due(T0 + 1.1) == []
    assert machine.next_deadline(T0 + 1.1) == T0 + 1.2
    looks = [machine.settle(Op(e, "delete"), T0 + 1.1) for e in entries[1:10]]
    assert looks[-1] == -math.inf  # a full batch: the lease thread looks at once
    [call] = machine.due(T0 + 1.1)
    assert [op.entry for op in call.ops] == entries[:10]
    machine.settle(Op(entries[10], "delete"), T0 + 1.1)
    assert machine.due(T0 + 1.2) == []  # its own interval, not the first one's
    [call] = machine.due(T0 + 1.4)
    assert [op.entry for op in call.ops] == [entries[10]]


def test_a_full_batch_of_one_action_wakes_the_lease_thread_whatever_else_is_queued() -> None:
    machine = LeaseMachine(delete_interval=0.2)
    entries = [Entry(f"h{i}", T0, 30) for i in range(13)]
    machine.received(entries)
    for e in entries[:3]:  # returns with a delay: they wait for a batch of their own
        assert machine.settle(Op(e, "return", seconds=5), T0 + 1) > T0 + 1
    looks = [machine.settle(Op(e, "delete"), T0 + 1) for e in entries[3:]]
    assert looks[:-1] == [T0 + 1.2] * 9
    assert looks[-1] == -math.inf  # ten deletes fill a call, though 13 ops are queued
    [call] = machine.due(T0 + 1)
    assert [op.entry for op in call.ops] == entries[3:]
    # Nine deletes and a return fill no call: nothing to send at once.
    machine = LeaseMachine(delete_interval=0.2)
    machine.received(entries[:10])
    machine.settle(Op(entries[0], "return", seconds=5), T0 + 1)
    looks = [machine.settle(Op(e, "delete"), T0 + 1) for e in entries[1:10]]
    assert -math.inf not in looks


def test_a_renewal_asks_only_what_its_claim_covers_and_waits_once_that_gains_nothing() -> None:
    machine = LeaseMachine()
    a, b, c = Entry("a", T0, 30), Entry("b", T0, 30), Entry("c", T0, 30)
    machine.received([a, b, c])
    a.claim_until = T0 + 40  # at T0 + 15 its claim covers 25 s of the 30
    c.claim_until = T0 + 30.5  # ... and c's not a second past its lease's end
    [call] = machine.due(T0 + 15)
    assert call.renewals == [a, b]
    assert machine.renewing(call, T0 + 15) == {30: [b], 25: [a]}
    machine.renewed([b], 30, T0 + 15, {}, T0 + 15.1)
    machine.renewed([a], 25, T0 + 15, {}, T0 + 15.1)
    machine.ended(call)
    assert a.expires_at == T0 + 40  # as long as its claim, no longer
    # A renewal of a or c would gain nothing: the next look is c's end, no spinning.
    assert machine.next_deadline(T0 + 15.1) == T0 + 30
    assert machine.due(T0 + 27.5) == []  # a's renewal moment: nothing to gain
    machine.expire(T0 + 30)
    assert c.state is State.LOST
    a.claim_until = T0 + 100  # the claim moved
    [call] = machine.due(T0 + 28)
    assert call.renewals == [a, b]  # b's renewal rides along
    # Checked again as the call goes: a claim that fell behind meanwhile holds it back.
    a.claim_until = T0 + 40
    assert machine.renewing(call, T0 + 28) == {30: [b]}
    machine.ended(call)
    assert machine.due(T0 + 29) == []
    machine.expire(T0 + 40)
    assert a.state is State.LOST  # never renewed past its claim, the lease ran out


def test_a_queued_return_goes_by_the_time_its_lease_would_be_renewed() -> None:
    machine = LeaseMachine(delete_interval=10.0)
    entry = Entry("h", T0, 2)  # renewal due at T0 + 1
    machine.received([entry])
    machine.settle(Op(entry, "return", 5, "retry"), T0 + 0.9)
    assert machine.next_deadline(T0 + 0.9) == T0 + 1
    [call] = machine.due(T0 + 1)
    assert call.ops and not call.renewals  # a returning lease is not renewed
    assert [(e.handle, s) for e, s in machine.sending(call, T0 + 1)] == [("h", 5)]
    machine.settled(call, {}, T0 + 1)
    assert [(type(x), getattr(x, "reason", "")) for x in machine.take()] == [(Returned, "retry")]


def test_renewals_stop_short_of_the_twelve_hour_cap_with_one_warning() -> None:
    machine = LeaseMachine()
    entry = Entry("h", T0, 3600)
    machine.received([entry])
    asked: list[tuple[float, int]] = []
    now = T0
    while entry.renew_at < math.inf:
        now = entry.renew_at
        [call] = machine.due(now)
        for seconds, batch in machine.renewing(call, now).items():
            asked.append((now, seconds))
            machine.renewed(batch, seconds, now, {}, now)
        machine.ended(call)
    assert all(now - T0 + seconds <= 43_200 - 30 for now, seconds in asked)
    assert asked[-1][0] - T0 + asked[-1][1] == 43_200 - 30  # the last one cut to the cap
    assert [type(x) for x in machine.take()].count(NearCap) == 1
    assert not machine.expire(now)  # the pass that found the cap: nothing lapsed yet
    assert machine.next_deadline(now) == entry.expires_at  # no renewal more: it lapses then
    assert machine.expire(entry.expires_at) and entry.state is L


@pytest.mark.parametrize("timeout, retry", [(30, RETRY_AFTER_ERROR), (2, 0.25)])
def test_a_failed_renewal_is_tried_again_while_a_short_lease_still_has_time(
    timeout: int, retry: float
) -> None:
    # A 2 s lease renewed at 1 s has a second left: its retry comes within it, not at 2 s.
    machine = LeaseMachine(delete_interval=0.2)
    entry = Entry("h", T0, timeout)
    machine.received([entry])
    half = T0 + timeout / 2
    [call] = machine.due(half)
    [(seconds, batch)] = machine.renewing(call, half).items()
    machine.renewal_failed(batch, seconds, half, True, half + 0.02)
    machine.ended(call)
    assert machine.next_deadline(half + 0.02) == half + retry
    [again] = machine.due(half + retry)
    [(seconds, batch)] = machine.renewing(again, half + retry).items()
    machine.renewed(batch, seconds, half + retry, {}, half + retry + 0.02)
    assert not machine.expire(T0 + timeout) and entry.state is W


def test_a_failed_entry_is_tried_again_a_second_later_while_its_lease_lasts() -> None:
    machine, _entry = in_state(S)
    answer(machine, T0 + 1, {0: FLAKY})
    assert [(type(x), getattr(x, "retrying", None)) for x in machine.take()] == [
        (DeleteFailed, True),
        (Room, None),
    ]
    assert machine.due(T0 + 1.5) == []
    assert machine.next_deadline(T0 + 1.5) == T0 + 1 + RETRY_AFTER_ERROR
    [call] = machine.due(T0 + 30)  # past the lease: the retry is not sent as done
    machine.sending(call, T0 + 30)
    machine.settled(call, {0: FLAKY}, T0 + 30)
    commands = machine.take()
    assert [type(x) for x in commands] == [LeaseLost, DeleteFailed]
    assert [getattr(x, "reason", "") for x in commands] == [EXPIRED, "InternalError: try again"]
    machine.ended(call)
    assert machine.ops == [] and machine.due(T0 + 40) == []


def test_a_retry_found_past_the_lease_is_dropped_as_lapsed() -> None:
    machine, _entry = in_state(S)
    [call] = machine.due(T0 + 1)
    machine.sending(call, T0 + 1)
    machine.settle_failed(call, True, "", T0 + 30)  # answered as the lease ran out
    assert [(type(x), getattr(x, "reason", "")) for x in machine.take()] == [
        (LeaseLost, EXPIRED),
        (DeleteFailed, LAPSED),
    ]
    assert machine.ops == []


def test_a_lost_handle_drops_its_queued_delete() -> None:
    machine, entry = in_state(R)
    answer(machine, T0 + 15, {0: GONE})  # the renewal finds the handle gone
    machine.take()
    assert entry.disowned and machine.settle(Op(entry, "delete"), T0 + 16, True) == math.inf
    assert [(type(x), x.reason) for x in machine.take() if isinstance(x, DeleteFailed)] == [
        (DeleteFailed, DISOWNED)
    ]
    assert machine.ops == []


def test_extend_asks_for_a_renewal_now_and_waits_for_it() -> None:
    machine, entry = in_state(R)
    target = machine.extend(entry, 60, T0 + 2)
    assert target == 1 and machine.extend_wait(entry, 1, T0 + 2) == T0 + 30
    [call] = machine.due(T0 + 2)
    assert machine.renewing(call, T0 + 2) == {60: [entry]}
    machine.renewed([entry], 60, T0 + 2, {}, T0 + 2)
    machine.ended(call)
    assert machine.extend_wait(entry, 1, T0 + 2) is None
    assert (entry.expires_at, entry.renew_at) == (T0 + 62, T0 + 32)
    with pytest.raises(ValueError, match="1 to 43200"):
        machine.extend(entry, 0, T0 + 2)
    machine.expire(T0 + 62)
    assert machine.extend(entry, 60, T0 + 62) is None  # lost: the driver raises LeaseLost


def test_a_stop_sends_all_that_is_queued_then_gives_up() -> None:
    machine, entry = in_state(R)
    machine.settle(Op(entry, "delete"), T0 + 1)
    assert machine.due(T0 + 1) == []  # it may wait to fill a batch
    machine.stop(T0 + 1, give_up_after=5)
    [call] = machine.due(T0 + 1)
    assert not machine.drained()  # its call is under way
    machine.sending(call, T0 + 1)
    machine.settled(call, {}, T0 + 1)
    machine.ended(call)
    assert machine.drained() and not machine.gave_up(T0 + 5.9) and machine.gave_up(T0 + 6)


def test_every_command_names_its_entries() -> None:
    machine, entry = in_state(S)
    answer(machine, T0 + 1, {})
    commands: Sequence[Command] = machine.take()
    assert list(commands) == [Deleted([entry]), Room()]


def test_a_failed_renewal_after_extend_is_tried_again_before_the_old_lease_ends() -> None:
    # A 2 s lease extended to 60 s: until a renewal succeeds, the 2 s lease is what
    # holds the message, so the retry of a failed renewal must come within it, not a
    # second later (60 / 8 is no bound on the time left).
    machine = LeaseMachine(delete_interval=0.2)
    entry = Entry("h", T0, 2)
    machine.received([entry])
    [first] = machine.due(T0 + 1)  # throttled: tried again at T0 + 1.25
    [(seconds, batch)] = machine.renewing(first, T0 + 1).items()
    machine.renewal_failed(batch, seconds, T0 + 1, True, T0 + 1.02)
    machine.ended(first)
    assert machine.extend(entry, 60, T0 + 1.1) == 1
    [call] = machine.due(T0 + 1.1)
    [(seconds, batch)] = machine.renewing(call, T0 + 1.1).items()
    assert seconds == 60
    machine.renewal_failed(batch, seconds, T0 + 1.1, True, T0 + 1.12)
    machine.ended(call)
    retry = machine.next_deadline(T0 + 1.12)
    assert retry is not None and retry < entry.expires_at == T0 + 2
    [again] = machine.due(retry)
    [(seconds, batch)] = machine.renewing(again, retry).items()
    machine.renewed(batch, seconds, retry, {}, retry + 0.02)
    machine.ended(again)
    assert not machine.expire(T0 + 2) and entry.state is W
