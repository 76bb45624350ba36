"""Review of cc58879 (lease senders on conditions of their own) and f8e5ecc's ThreadTally."""

from __future__ import annotations

import gc
import threading
from collections.abc import Sequence
from typing import Any

from sqsworker.clock import FakeClock
from sqsworker.events import Observer
from sqsworker.lease import LeaseKeeper
from sqsworker.metrics import ThreadTally
from sqsworker.transports import send_all
from sqsworker.transports.memory import MemorySQS, MemoryTransport

from ..conftest import wait_until


class Blocking(MemoryTransport):
    """Deletes block until ``go`` is set; ``inside`` counts the calls under way."""

    go: threading.Event
    inside: list[str]

    def delete_batch(self, entries: Sequence[tuple[str, str]]) -> Any:
        self.inside.append(threading.current_thread().name)
        self.go.wait(10)
        return super().delete_batch(entries)


def _keeper(memory: MemorySQS, clock: FakeClock, senders: int) -> tuple[LeaseKeeper, Any, Any]:
    memory.create_queue("jobs")
    queue = memory.transport("jobs")
    send_all(queue, [f"m{i}" for i in range(40)])
    transport = Blocking(memory, queue.info)
    transport.go, transport.inside = threading.Event(), []
    keeper = LeaseKeeper(transport, clock, Observer(), delete_interval=0, senders=senders)
    keeper.start()
    return keeper, queue, transport


def _delete_one_batch(keeper: LeaseKeeper, queue: Any, clock: FakeClock) -> None:
    for h in keeper.add(queue.receive(1, 0, 60), clock.monotonic(), 60):
        assert keeper.begin(h)
        keeper.succeed(h, urgent=True)


def test_a_call_queued_while_every_general_sender_is_busy_is_made(
    memory: MemorySQS, clock: FakeClock
) -> None:
    """Sound: nobody idle to notify; the first sender back takes it before it waits."""
    keeper, queue, transport = _keeper(memory, clock, senders=2)
    wait_until(lambda: len(keeper._idle) == 2, what="both senders waiting")
    _delete_one_batch(keeper, queue, clock)
    wait_until(lambda: len(transport.inside) == 1, what="one sender busy")
    _delete_one_batch(keeper, queue, clock)
    wait_until(lambda: len(transport.inside) == 2, what="both senders busy")
    assert keeper._idle == []
    _delete_one_batch(keeper, queue, clock)  # queued with no sender idle
    clock.advance(0)  # FakeClock wakes every waiter: spurious wake-ups on top
    transport.go.set()
    wait_until(lambda: keeper.held_count() == 0, what="all three deleted")
    assert len(transport.inside) == 3
    wait_until(lambda: len(keeper._idle) == 2, what="both senders waiting again")
    assert len(set(map(id, keeper._idle))) == 2  # no duplicates
    assert keeper.stop(5) == 0


def test_spurious_wake_ups_leave_no_duplicate_in_idle(memory: MemorySQS, clock: FakeClock) -> None:
    keeper, queue, transport = _keeper(memory, clock, senders=3)
    transport.go.set()
    for _ in range(20):
        wait_until(lambda: len(keeper._idle) == 3, what="every sender waiting")
        clock.advance(0.001)  # wakes every sender's condition
        _delete_one_batch(keeper, queue, clock)
        wait_until(lambda: keeper.held_count() == 0, what="deleted")
    wait_until(lambda: len(keeper._idle) == 3, what="every sender waiting")
    assert len(set(map(id, keeper._idle))) == 3
    assert keeper._ready[0] not in keeper._idle
    assert keeper.stop(5) == 0


def test_stop_returns_with_senders_mid_call(memory: MemorySQS, clock: FakeClock) -> None:
    keeper, queue, transport = _keeper(memory, clock, senders=3)
    wait_until(lambda: len(keeper._idle) == 3, what="every sender waiting")
    _delete_one_batch(keeper, queue, clock)
    wait_until(lambda: len(transport.inside) == 1, what="one sender mid-call")
    result: list[int] = []
    stopper = threading.Thread(target=lambda: result.append(keeper.stop(5)), daemon=True)
    stopper.start()
    stopper.join(0.2)
    assert stopper.is_alive()  # the call under way is answered first
    transport.go.set()
    stopper.join(10)
    assert result == [0]
    assert keeper._senders_alive == 0 and keeper._idle == []


def test_a_scrape_survives_the_cyclic_gc_retiring_a_dead_threads_counts() -> None:
    """Proved (fixed since): a tally's counts of a thread gone were retired by a
    ``weakref.finalize`` on the thread's ``Thread`` object, so from the garbage
    collector, on whatever thread allocates when a collection is due, taking the tally's
    lock. If that was ``read()`` of the same tally, already holding that lock (a plain
    Lock), it waited on itself forever: the scrape hung, and every later thread's first
    count (``_own``) blocked on the lock too. A Thread object in a reference cycle (a
    worker keeps its threads, and worker and keeper reference each other) is freed only
    by the cyclic collector."""
    tally = ThreadTally((1.0,))
    done: list[int] = []
    saved = gc.get_threshold()

    def scrape() -> None:
        for offset in range(0, 8):
            gc.disable()
            holder: dict[str, Any] = {}
            thread = threading.Thread(target=tally.inc)
            holder["thread"] = thread
            thread.holder = holder  # type: ignore[attr-defined]  # a cycle: only gc frees it
            thread.start()
            thread.join()
            del thread, holder
            # A collection due within the next few allocations: one inside read()'s lock.
            gc.set_threshold(gc.get_count()[0] + offset + 1)
            gc.enable()
            tally.read()
            gc.set_threshold(*saved)
            gc.collect()
        done.append(1)

    scraper = threading.Thread(target=scrape, daemon=True)
    scraper.start()
    # A deadlock never ends; eight full collections of a suite worker's heap, on a
    # loaded machine, took over 5 s once.
    scraper.join(60)
    gc.set_threshold(*saved)
    gc.enable()
    assert done, "tally.read() deadlocked on its own lock in a gc-run finalizer"
    assert tally.read()[-1] == 8
