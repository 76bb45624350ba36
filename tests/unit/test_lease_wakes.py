"""A receive wakes the lease thread only when that thread waits past the new messages'
renewal: a busy worker's receives no longer wake it once each (a thread hand-off, and
the GIL's, per receive), and no renewal is late for it."""

from __future__ import annotations

from typing import Any

from sqsworker.clock import FakeClock
from sqsworker.events import Observer
from sqsworker.lease import LeaseKeeper
from sqsworker.transports import send_all
from sqsworker.transports.memory import MemorySQS

from ..conftest import wait_until


def test_a_receive_wakes_the_lease_thread_only_for_a_sooner_renewal(
    memory: MemorySQS, clock: FakeClock
) -> None:
    memory.create_queue("jobs")
    queue = memory.transport("jobs")
    send_all(queue, [f"m{i}" for i in range(30)])
    keeper = LeaseKeeper(queue, clock, Observer())
    wakes: list[int] = []
    notify_all = keeper._wake.notify_all

    def counted() -> None:
        wakes.append(1)
        notify_all()

    keeper._wake.notify_all = counted  # type: ignore[method-assign]
    keeper.start()
    start = clock.monotonic()

    def waits_until(moment: float) -> Any:
        return lambda: keeper._waiting_until == moment

    wait_until(waits_until(float("inf")), what="the lease thread waiting, nothing held")
    first = keeper.add(queue.receive(10, 0, 60), start, 60)  # nothing held: it wakes
    assert len(wakes) == 1
    wait_until(waits_until(start + 30), what="the lease thread waiting for the renewal at half")

    later = keeper.add(queue.receive(10, 0, 60), start, 60)  # renewed with the first: no wake
    assert len(wakes) == 1
    assert keeper._waiting_until == start + 30

    sooner = keeper.add(queue.receive(10, 0, 20), start, 20)  # renewed at start + 10: it wakes
    assert len(wakes) == 2
    wait_until(waits_until(start + 10), what="the lease thread waiting for the sooner renewal")

    for held in [*first, *later, *sooner]:
        assert keeper.begin(held)
    held = [*first, *later, *sooner]
    for _ in range(6):  # to start + 30, where the first ones are renewed at half their timeout
        clock.advance(5)
        wait_until(lambda: keeper._waiting_until > clock.monotonic(), what="renewals made")
    assert all(h.expires_at > start + 40 for h in held)
    assert not any(h.lost for h in held)
    for h in held:
        keeper.succeed(h, urgent=True)
    assert keeper.stop(5) == 0
