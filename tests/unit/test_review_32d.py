"""Review 32d: renewals an answer did not name (717af07) and the simulator's unnamed
entries (de7bd5a). The first test failed on the reviewed commits; the rest are checks
that held, kept as such. (The review's other finding, a kept regression seed replaying
another run, is mended in tests/sim/test_simulator.py's ``as_found``.)"""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

from sqsworker.clock import FakeClock
from sqsworker.lease_machine import LeaseMachine
from sqsworker.lease_state import Entry, Extended, State
from sqsworker.transports import UNANSWERED, EntryFailure
from sqsworker.transports.memory import MemorySQS

from ..sim import world as sim
from ..sim.world import Faults, SimTransport

T0 = 1000.0
NOT_NAMED = EntryFailure("0", UNANSWERED, "not named", False)


# -- the simulator's SimTransport, on a minimal world --------------------------------------


class _Clock(FakeClock):
    def __init__(self) -> None:
        super().__init__()
        self.rng = random.Random(7)

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)


def _faults(**kw: object) -> Faults:
    base = dict(error_rate={}, latency=0.02, hang_rate=0.0, outages=[], fatal_rate=0.0)
    base.update(entry_rate=0.0)
    base.update(kw)
    return Faults(**base)  # type: ignore[arg-type]


def _world(faults: Faults) -> tuple[SimpleNamespace, SimTransport, MemorySQS]:
    clock = _Clock()
    memory = MemorySQS(clock)
    memory.create_queue("jobs")
    world = SimpleNamespace(
        schedule=SimpleNamespace(hide_redrive=False, offloaded=False),
        queue_name="jobs",
        faults=faults,
        clock=clock,
        start=clock.monotonic(),
        gone_handles=set(),
        applied_until={},
        handle_ids={},
        deleted_by={},
        stale_deletes=set(),
        last_fault_at=-math.inf,
        violations=[],
        memory=memory,
    )
    world.violation = world.violations.append
    world.sqs_state = lambda message_id: sim.World.sqs_state(world, message_id)  # type: ignore[arg-type]
    return world, SimTransport(memory.transport("jobs"), world), memory  # type: ignore[arg-type]


def _receive(world: SimpleNamespace, memory: MemorySQS, n: int) -> list[tuple[str, str]]:
    queue = memory.transport("jobs")
    from sqsworker.transports import OutgoingMessage, send_all

    send_all(queue, [OutgoingMessage(f"m{i}") for i in range(n)])
    got = queue.receive(n, 0, 30)
    world.handle_ids.update((e.receipt_handle, e.message_id) for e in got)
    return [(str(i), e.receipt_handle) for i, e in enumerate(got)]


def test_a_sim_window_page_names_no_entry_not_even_those_sqs_refused() -> None:
    """An unnamed window stands for a proxy's page botocore reads as ``{}``: it names no
    entry at all. The simulator still names the entries ``entry_rate`` failed
    (``InternalError``): an answer real SQS behind a broken proxy cannot give."""
    world, transport, memory = _world(_faults(entry_rate=1.0, unnamed_windows=[(0.0, 1e9, True)]))
    entries = _receive(world, memory, 3)
    result = transport.delete_batch(entries)
    assert result.succeeded == []
    codes = sorted({f.code for f in result.failed})
    assert codes == [UNANSWERED], f"a page that names nothing named entries failed: {codes}"


def test_holds_sim_acted_unnamed_renewal_is_recorded_in_applied_until() -> None:
    world, transport, memory = _world(_faults(unnamed_windows=[(0.0, 1e9, True)]))
    entries = _receive(world, memory, 2)
    now = world.clock.monotonic()
    result = transport.change_visibility_batch([(i, h, 300) for i, h in entries])
    assert {f.code for f in result.failed} == {UNANSWERED} and not result.succeeded
    for _, handle in entries:
        assert world.applied_until[handle] >= now + 300
        message_id = world.handle_ids[handle]
        assert memory._queues["jobs"].messages[message_id].visible_at >= now + 300


def test_holds_sim_acted_unnamed_delete_is_recorded_and_its_retry_is_not_stale() -> None:
    world, transport, memory = _world(_faults(unnamed_windows=[(0.0, 1e9, True)]))
    entries = _receive(world, memory, 2)
    first = transport.delete_batch(entries)
    assert {f.code for f in first.failed} == {UNANSWERED}
    assert not memory._queues["jobs"].messages
    assert set(world.deleted_by.values()) == {h for _, h in entries}
    world.faults.unnamed_windows.clear()
    again = transport.delete_batch(entries)  # the worker's retry
    assert sorted(again.succeeded) == ["0", "1"]
    assert not world.stale_deletes and not world.violations


def test_holds_sim_unacted_window_leaves_sqs_untouched() -> None:
    world, transport, memory = _world(_faults(unnamed_windows=[(0.0, 1e9, False)]))
    entries = _receive(world, memory, 2)
    transport.delete_batch(entries)
    transport.change_visibility_batch([(i, h, 300) for i, h in entries])
    assert len(memory._queues["jobs"].messages) == 2
    assert not world.applied_until and not world.deleted_by


def _trace(schedule: sim.Schedule) -> list[str]:
    world = sim.World(schedule)
    sim.run_world(world)
    assert not world.violations, world.violations[0]
    return list(world.trace)


def test_holds_seeds_without_unnamed_faults_replay_identically_twice() -> None:
    seed = next(
        s
        for s in range(200)
        if not sim.draw(s).faults.unnamed_rate
        and not sim.draw(s).faults.unnamed_windows
        and not sim.draw(s).faults.none
    )
    assert _trace(sim.draw(seed)) == _trace(sim.draw(seed))


# -- the lease machine ----------------------------------------------------------------------


def _held(timeout: int = 30) -> tuple[LeaseMachine, Entry]:
    machine = LeaseMachine(delete_interval=0.2)
    entry = Entry("h", T0, timeout)
    machine.received([entry])
    return machine, entry


def _renew_round(machine: LeaseMachine, now: float, failure: EntryFailure | None) -> float:
    calls = machine.due(now)
    for call in calls:
        by_seconds = machine.renewing(call, now)
        for seconds, batch in by_seconds.items():
            failures = {} if failure is None else {i: failure for i in range(len(batch))}
            machine.renewed(batch, seconds, now, failures, now + 0.02)
        machine.ended(call)
    return machine.next_deadline(now + 0.02) or math.inf


def test_holds_unnamed_renewals_raise_may_hold_by_at_most_one_lease_past_the_lapse() -> None:
    """Renewals answered unnamed until the lease lapses: may_hold ends at most one lease
    (the asked seconds) past the last one sent; no more renewals after the lapse, so it
    cannot be held forever (claims, the Spark driver's wait)."""
    machine, entry = _held(30)
    now = T0 + 15
    rounds = 0
    while entry.state is not State.LOST and now < T0 + 100:
        nxt = _renew_round(machine, now, NOT_NAMED)
        rounds += 1
        machine.expire(nxt)
        now = max(nxt, now + 0.01)
    assert entry.state is State.LOST and rounds > 5
    assert entry.expires_at == T0 + 30  # never counted renewed
    assert entry.may_hold(T0 + 31) > 0  # SQS may have applied the last one
    # every renewal went before the lapse (T0 + 30) and was answered 0.02 s later
    assert entry.may_hold(T0 + 30 + 0.02 + 30) == 0
    assert machine.due(T0 + 200) == []  # a lost lease is renewed no more


def test_holds_unnamed_renewal_leaves_an_extend_waiter_bounded_by_the_lease() -> None:
    machine, entry = _held(30)
    entry.state = State.RUNNING
    target = machine.extend(entry, 60, T0 + 1)
    assert target == 1
    _renew_round(machine, T0 + 1, NOT_NAMED)
    assert machine.extend_wait(entry, target, T0 + 2) == T0 + 30  # waits no longer than it
    assert machine.extend_wait(entry, target, T0 + 30) is None  # then returns (lost)
    assert not any(isinstance(c, Extended) for c in machine.take())


def test_holds_unnamed_delete_is_retried_never_reported_deleted() -> None:
    from sqsworker.lease_state import Deleted, DeleteFailed, Op

    machine, entry = _held(30)
    machine.settle(Op(entry, "delete", urgent=True), T0 + 1)
    [call] = machine.due(T0 + 1)
    machine.sending(call, T0 + 1)
    machine.settled(call, {0: NOT_NAMED}, T0 + 1.02)
    machine.ended(call)
    out = machine.take()
    assert not any(isinstance(c, Deleted) for c in out)
    assert [c.retrying for c in out if isinstance(c, DeleteFailed)] == [True]
    assert entry.state is State.SETTLING and not entry.disowned
    assert entry.sqs_until == T0 + 30  # a delete unnamed raises nothing
