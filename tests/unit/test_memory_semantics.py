"""Real-SQS behaviours that moto does not model, pinned on the in-memory transport."""

from __future__ import annotations

import pytest

from sqsworker.clock import FakeClock
from sqsworker.errors import TransportError
from sqsworker.transports import OutgoingMessage, send_all
from sqsworker.transports.memory import MemorySQS


def test_a_stale_handle_cannot_change_visibility(memory: MemorySQS, clock: FakeClock) -> None:
    memory.create_queue("q")
    q = memory.transport("q")
    send_all(q, ["x"])
    [old] = q.receive(1, 0, 5)
    clock.advance(6)
    [new] = q.receive(1, 0, 30)
    [failure] = q.change_visibility_batch([("a", old.receipt_handle, 30)]).failed
    assert failure.lease_lost
    assert q.change_visibility_batch([("a", new.receipt_handle, 30)]).succeeded == ["a"]


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
    import threading

    memory.create_queue("q")
    q = memory.transport("q")
    got: list[str] = []
    poller = threading.Thread(target=lambda: got.extend(m.body for m in q.receive(1, 20, 30)))
    poller.start()
    send_all(q, ["late"])
    poller.join(10)
    assert got == ["late"]
