"""Real-SQS behaviours that moto does not model, pinned on the in-memory transport."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sqsworker.clock import FakeClock, Task, spawn_thread
from sqsworker.errors import TransportError
from sqsworker.transports import Envelope, OutgoingMessage, Transport, send_all
from sqsworker.transports.memory import GONE, MemorySQS

from ..conftest import wait_until


def test_what_a_standard_queue_refuses_as_sqs_does(memory: MemorySQS) -> None:
    # moto takes both; SQS refuses a deduplication id on a standard queue, and a group id
    # (a fair queue's tenant) that is not 1 to 128 letters, digits or punctuation.
    memory.create_queue("tenants")
    queue = memory.transport("tenants")
    for outgoing, refusal in [
        (OutgoingMessage("x", deduplication_id="d"), "no MessageDeduplicationId"),
        (OutgoingMessage("x", group_id="ACME Corp"), "MessageGroupId takes 1 to 128"),
    ]:
        [failure] = queue.send_batch([outgoing]).failed
        assert failure.code == "InvalidParameterValue" and refusal in failure.message
    assert queue.counts().total == 0


def test_a_stale_handle_cannot_change_visibility(memory: MemorySQS, clock: FakeClock) -> None:
    memory.create_queue("q")
    q = memory.transport("q")
    send_all(q, ["x"])
    [old] = q.receive(1, 0, 5)
    clock.advance(6)
    [new] = q.receive(1, 0, 30)
    [failure] = q.change_visibility_batch([("a", old.receipt_handle, 30)]).failed
    assert (failure.code, GONE in failure.message) == ("InvalidParameterValue", True)
    assert failure.lease_lost and not failure.past_cap
    assert q.change_visibility_batch([("a", new.receipt_handle, 30)]).succeeded == ["a"]


def test_a_deleted_message_cannot_change_visibility(memory: MemorySQS) -> None:
    memory.create_queue("q")
    q = memory.transport("q")
    send_all(q, ["x"])
    [m] = q.receive(1, 0, 30)
    assert q.delete_batch([("d", m.receipt_handle)]).succeeded == ["d"]
    [failure] = q.change_visibility_batch([("a", m.receipt_handle, 30)]).failed
    # SQS: "Value <handle> for parameter ReceiptHandle is invalid. Reason: Message does
    # not exist or is not available for visibility timeout change."
    assert failure.code == "InvalidParameterValue"
    assert failure.message.endswith(f"Reason: {GONE}.")
    assert failure.lease_lost and not failure.past_cap
    # Deleting it again reports success, as SQS does.
    assert q.delete_batch([("d", m.receipt_handle)]).succeeded == ["d"]


def test_a_handle_this_queue_never_issued_is_invalid(memory: MemorySQS) -> None:
    memory.create_queue("q")
    memory.create_queue("other")
    q, other = memory.transport("q"), memory.transport("other")
    send_all(q, ["x"])
    send_all(other, ["y"])
    [m] = q.receive(1, 0, 30)
    [elsewhere] = other.receive(1, 0, 30)
    forged = m.receipt_handle.rsplit("#", 1)[0] + "#0000000000000000"
    for handle in ["garbage", forged, elsewhere.receipt_handle]:
        [failure] = q.change_visibility_batch([("a", handle, 30)]).failed
        assert failure.code == "ReceiptHandleIsInvalid" and failure.lease_lost
        [failure] = q.delete_batch([("a", handle)]).failed
        assert failure.code == "ReceiptHandleIsInvalid"
    assert q.counts().in_flight == 1 and other.counts().in_flight == 1


def _footprint(memory: MemorySQS) -> int:
    """How many entries the service's and its queues' containers hold."""
    objects: list[Any] = [memory, *memory._queues.values()]
    return sum(
        len(value)
        for obj in objects
        for value in vars(obj).values()
        if isinstance(value, (dict, list, set))
    )


@pytest.mark.parametrize("name", ["q", "q.fifo"])
def test_memory_stays_flat_however_many_handles_are_issued(
    memory: MemorySQS, clock: FakeClock, name: str
) -> None:
    memory.create_queue(name, {"FifoQueue": "true"} if name.endswith(".fifo") else {})
    q = memory.transport(name)
    send_all(q, [OutgoingMessage("x", group_id="g", deduplication_id="x") if q.info.fifo else "x"])
    [first] = q.receive(1, 0, 0)

    def cycles(n: int) -> None:
        for i in range(n):
            [m] = q.receive(1, 0, 1, f"attempt-{i}")
            if q.info.fifo and i % 3 == 0:  # retried, as after a lost answer: the same again
                assert q.receive(1, 0, 1, f"attempt-{i}")[0].receipt_handle == m.receipt_handle
            clock.advance(1)  # visible again: the next receive issues a new handle
        clock.advance(600)  # past the window of the FIFO attempt ids: forgotten
        q.receive(1, 0, 0)

    cycles(10)
    before = _footprint(memory)
    cycles(2_000)
    assert _footprint(memory) == before
    # The first handle is still told from a current one without a table of handles.
    [failure] = q.change_visibility_batch([("a", first.receipt_handle, 30)]).failed
    assert failure.code == "InvalidParameterValue" and failure.lease_lost


def test_an_expired_handle_is_not_in_flight(memory: MemorySQS, clock: FakeClock) -> None:
    memory.create_queue("q")
    q = memory.transport("q")
    send_all(q, ["x"])
    [m] = q.receive(1, 0, 5)
    clock.advance(6)
    [failure] = q.change_visibility_batch([("a", m.receipt_handle, 30)]).failed
    assert failure.code == "MessageNotInflight"


def test_a_stale_delete_reports_success_and_deletes_nothing(
    memory: MemorySQS, clock: FakeClock
) -> None:
    memory.create_queue("q")
    q = memory.transport("q")
    send_all(q, ["x"])
    [old] = q.receive(1, 0, 5)
    clock.advance(6)
    q.receive(1, 0, 30)
    assert q.delete_batch([("a", old.receipt_handle)]).succeeded == ["a"]
    assert q.counts().in_flight == 1


def test_fifo_refuses_an_expired_handle_on_delete(memory: MemorySQS, clock: FakeClock) -> None:
    memory.create_queue("q.fifo", {"FifoQueue": "true"})
    q = memory.transport("q.fifo")
    send_all(q, [OutgoingMessage("x", group_id="g", deduplication_id="1")])
    [m] = q.receive(1, 0, 5)
    clock.advance(6)
    [failure] = q.delete_batch([("a", m.receipt_handle)]).failed
    assert failure.code == "ReceiptHandleIsInvalid"


def test_the_cap_counts_from_the_receive_not_the_last_extension(
    memory: MemorySQS, clock: FakeClock
) -> None:
    memory.create_queue("q")
    q = memory.transport("q")
    send_all(q, ["x"])
    [m] = q.receive(1, 0, 30_000)
    clock.advance(20_000)
    assert not q.change_visibility_batch([("a", m.receipt_handle, 23_000)]).failed
    clock.advance(1_000)
    [failure] = q.change_visibility_batch([("a", m.receipt_handle, 23_000)]).failed
    assert "beyond the limit" in failure.message


def test_batch_entry_ids_must_be_distinct(memory: MemorySQS) -> None:
    memory.create_queue("q")
    with pytest.raises(TransportError) as raised:
        memory.transport("q").delete_batch([("a", "h1"), ("a", "h2")])
    assert raised.value.code == "BatchEntryIdsNotDistinct"


def test_send_refuses_bodies_sqs_refuses(memory: MemorySQS) -> None:
    memory.create_queue("q", {"MaximumMessageSize": "1024"})
    q = memory.transport("q")
    result = q.send_batch(
        [OutgoingMessage("\x00bad"), OutgoingMessage("x" * 1025), OutgoingMessage("ok")]
    )
    assert [f.code for f in result.failed] == ["InvalidMessageContents", "InvalidParameterValue"]
    assert result.succeeded == ["2"]


def test_long_poll_returns_as_soon_as_a_message_arrives(memory: MemorySQS) -> None:
    memory.create_queue("q")
    q = memory.transport("q")
    got: list[str] = []
    poller = threading.Thread(target=lambda: got.extend(m.body for m in q.receive(1, 20, 30)))
    poller.start()
    send_all(q, ["late"])
    poller.join(10)
    assert got == ["late"]


# -- a long poll and time passing -----------------------------------------------------------


class DeadlineClock:
    """A fake clock that, like real time, wakes a waiter only at its deadline or on notify.

    ``FakeClock`` wakes every waiter on every ``advance``; that hides a wait that asked
    for too late a deadline, which a ``SystemClock`` (or the simulator's) would sleep
    through.
    """

    def __init__(self, start: float = 1_000_000.0) -> None:
        self._now = start
        self._lock = threading.Lock()  # guards _now and _waiting
        self._waiting: list[tuple[threading.Condition, float | None]] = []

    def monotonic(self) -> float:
        with self._lock:
            return self._now

    def time(self) -> float:
        return self.monotonic() + 1_700_000_000.0

    def waiters(self) -> int:
        with self._lock:
            return len(self._waiting)

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds
            due = [
                c for c, deadline in self._waiting if deadline is not None and deadline <= self._now
            ]
        for cond in due:
            with cond:
                cond.notify_all()

    def wait(self, cond: threading.Condition, deadline: float | None) -> None:
        entry = (cond, deadline)
        with self._lock:  # registered and checked in one step: no wake-up is lost
            if deadline is not None and self._now >= deadline:
                return
            self._waiting.append(entry)
        try:
            cond.wait()
        finally:
            with self._lock:
                self._waiting.remove(entry)

    def spawn(self, name: str, target: Callable[[], object]) -> Task:
        return spawn_thread(name, target)


@pytest.fixture
def deadline_clock() -> Iterator[DeadlineClock]:
    clock = DeadlineClock()
    yield clock
    clock.advance(3600)  # end any poll a failing test left waiting


def _poll(q: Transport, clock: DeadlineClock, wait: int) -> list[Envelope]:
    """Start a long poll of ``wait`` s on a thread; return its result list once it waits."""
    got: list[Envelope] = []
    threading.Thread(target=lambda: got.extend(q.receive(1, wait, 30)), daemon=True).start()
    wait_until(lambda: clock.waiters() == 1, what="the long poll to wait")
    return got


def _delayed(q: Transport) -> None:
    send_all(q, [OutgoingMessage("x", delay_seconds=1)])


def _expiring(q: Transport) -> None:
    send_all(q, ["x"])
    assert len(q.receive(1, 0, 1)) == 1


def _returned(q: Transport) -> None:
    send_all(q, ["x"])
    [m] = q.receive(1, 0, 30)
    assert q.change_visibility_batch([("a", m.receipt_handle, 1)]).succeeded == ["a"]


@pytest.mark.parametrize("hide", [_delayed, _expiring, _returned], ids=lambda f: f.__name__[1:])
def test_a_long_poll_returns_when_a_hidden_message_becomes_visible(
    deadline_clock: DeadlineClock, hide: Callable[[Transport], None]
) -> None:
    memory = MemorySQS(deadline_clock)
    memory.create_queue("q")
    q = memory.transport("q")
    hide(q)  # visible again in 1 s
    got = _poll(q, deadline_clock, 5)
    deadline_clock.advance(0.5)
    assert deadline_clock.waiters() == 1 and not got
    deadline_clock.advance(0.5)  # 1 s after the poll began, 4 s before its end
    wait_until(lambda: len(got) == 1, timeout=5, what="the poll to return the message")
    assert got[0].body == "x"


def test_a_long_poll_still_ends_at_its_wait_time(deadline_clock: DeadlineClock) -> None:
    memory = MemorySQS(deadline_clock)
    memory.create_queue("q")
    q = memory.transport("q")
    send_all(q, [OutgoingMessage("x", delay_seconds=10)])
    done = threading.Event()

    def poll() -> None:
        assert q.receive(1, 5, 30) == []
        done.set()

    threading.Thread(target=poll, daemon=True).start()
    wait_until(lambda: deadline_clock.waiters() == 1, what="the long poll to wait")
    deadline_clock.advance(4.9)
    assert not done.is_set()
    deadline_clock.advance(0.1)
    wait_until(done.is_set, timeout=5, what="the poll to end empty")
    assert q.counts().delayed == 1


# -- ReceiveRequestAttemptId (FIFO) -------------------------------------------------------------


def _fifo(memory: MemorySQS, *bodies: str) -> Transport:
    memory.create_queue("q.fifo", {"FifoQueue": "true"})
    q = memory.transport("q.fifo")
    send_all(q, [OutgoingMessage(b, group_id=b[0], deduplication_id=b) for b in bodies])
    return q


def _seen(envelopes: list[Envelope]) -> list[tuple[str, str, int]]:
    return [(e.body, e.receipt_handle, e.receive_count) for e in envelopes]


def test_a_retried_receive_returns_the_same_messages_and_handles(
    memory: MemorySQS, clock: FakeClock
) -> None:
    q = _fifo(memory, "a1", "a2", "b1")
    first = q.receive(10, 0, 30, "attempt-1")
    assert [e.body for e in first] == ["a1", "a2", "b1"]
    clock.advance(20)
    assert q.receive(10, 0, 30, "attempt-2") == []  # all in flight
    again = q.receive(10, 0, 30, "attempt-1")  # the answer to the first was lost
    assert _seen(again) == _seen(first)
    clock.advance(20)  # 40 s after the first receive, 20 s after the retry
    assert q.counts().in_flight == 3  # the retry restarted the visibility timeout
    assert _seen(q.receive(10, 0, 30, "attempt-1")) == _seen(first)  # and again
    assert q.change_visibility_batch([("a", first[0].receipt_handle, 60)]).succeeded == ["a"]


@pytest.mark.parametrize("change", ["delete", "visibility"])
def test_a_retry_after_a_message_changed_receives_anew(
    memory: MemorySQS, clock: FakeClock, change: str
) -> None:
    q = _fifo(memory, "a1", "a2")
    [first] = q.receive(1, 0, 30, "attempt-1")
    if change == "delete":
        q.delete_batch([("d", first.receipt_handle)])
    else:
        q.change_visibility_batch([("v", first.receipt_handle, 0)])
    [again] = q.receive(1, 0, 30, "attempt-1")
    assert again.receipt_handle != first.receipt_handle
    if change == "delete":
        assert again.body == "a2"
    else:
        assert (again.body, again.receive_count) == ("a1", 2)


def test_an_attempt_id_is_forgotten_after_five_minutes(memory: MemorySQS, clock: FakeClock) -> None:
    q = _fifo(memory, "a1")
    [first] = q.receive(1, 0, 30, "attempt-1")
    clock.advance(301)
    [again] = q.receive(1, 0, 30, "attempt-1")
    assert (again.receive_count, again.receipt_handle != first.receipt_handle) == (2, True)


def test_an_empty_receive_is_not_replayed(memory: MemorySQS) -> None:
    memory.create_queue("q.fifo", {"FifoQueue": "true"})
    q = memory.transport("q.fifo")
    assert q.receive(10, 0, 30, "attempt-1") == []
    send_all(q, [OutgoingMessage("a1", group_id="a", deduplication_id="a1")])
    assert [e.body for e in q.receive(10, 0, 30, "attempt-1")] == ["a1"]


def test_a_standard_queue_ignores_the_attempt_id(memory: MemorySQS) -> None:
    memory.create_queue("q")
    q = memory.transport("q")
    send_all(q, ["x"])
    assert len(q.receive(1, 0, 30, "attempt-1")) == 1
    assert q.receive(1, 0, 30, "attempt-1") == []


@pytest.mark.parametrize("attempt_id", ["", "with space", "x" * 129, "é"])
def test_a_malformed_attempt_id_is_refused(memory: MemorySQS, attempt_id: str) -> None:
    q = _fifo(memory, "a1")
    with pytest.raises(TransportError) as raised:
        q.receive(1, 0, 30, attempt_id)
    assert raised.value.code == "InvalidParameterValue"
    assert len(q.receive(1, 0, 30, "!#$%&'()*+,-./:;<=>?@[]^_`{|}~" + "x" * 98)) == 1


# -- seeds ----------------------------------------------------------------------------------


def _run(seed: int | None) -> list[tuple[str, str]]:
    """Message ids and receipt handles of a fixed sequence of calls."""
    clock = FakeClock()
    memory = MemorySQS(clock, seed=seed)
    memory.create_queue("q")
    q = memory.transport("q")
    send_all(q, ["a", "b", "c"])
    seen = [(m.message_id, m.receipt_handle) for m in q.receive(10, 0, 1)]
    clock.advance(2)
    seen += [(m.message_id, m.receipt_handle) for m in q.receive(10, 0, 1)]
    return seen


def test_a_seed_makes_ids_and_handles_repeat() -> None:
    assert _run(7) == _run(7)
    assert len({handle for _, handle in _run(7)}) == 6
    assert _run(7) != _run(8)
    assert _run(None) != _run(None)
