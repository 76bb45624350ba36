"""Threads that must never die: an unexpected error is reported and the work goes on."""

from __future__ import annotations

import functools

import pytest

from sqsworker import Message, Observer
from sqsworker.clock import FakeClock
from sqsworker.transports.memory import MemorySQS

from .helpers import Rig


def test_an_unexpected_receive_error_does_not_kill_the_receive_loop(
    memory: MemorySQS, clock: FakeClock
) -> None:
    memory.inject_fault("ReceiveMessage", RuntimeError("a bug in a transport"), times=2)
    rig = Rig(memory, clock, lambda m: None)
    rig.send("x")
    rig.worker.start()
    rig.advance_until(lambda: rig.count("deleted") == 1)
    assert rig.count("receive_failures") == 2
    rig.stop()


def test_an_unexpected_delete_error_does_not_kill_the_lease_thread(
    memory: MemorySQS, clock: FakeClock
) -> None:
    memory.inject_fault("DeleteMessageBatch", RuntimeError("a bug in a transport"), times=1)
    rig = Rig(memory, clock, lambda m: None)
    rig.send("x")
    rig.worker.start()
    rig.advance_until(lambda: rig.count("deleted") == 1)
    assert rig.queue.counts().total == 0
    rig.stop()


def test_an_observer_that_raises_breaks_nothing(
    memory: MemorySQS, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken(Observer):
        def handler_succeeded(self, message: Message, duration: float) -> None:
            raise ValueError("observer bug")

    rig = Rig(memory, clock, lambda m: None, observers=[Broken()])
    rig.send("x")
    rig.worker.start()
    rig.wait_for("deleted", 1)
    rig.stop()
    assert "observer Broken.handler_succeeded raised" in caplog.text


def test_an_observer_event_of_any_callable_that_raises_breaks_nothing(
    memory: MemorySQS, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """An event set on the instance to a callable without a name (a partial): its error
    is logged by the event's name (found by review: naming it raised in the thread)."""

    def boom(*args: object) -> None:
        raise ValueError("observer bug")

    partial = Observer()
    partial.handler_succeeded = functools.partial(boom)  # type: ignore[method-assign]
    partial.received = functools.partial(boom)  # type: ignore[method-assign]
    rig = Rig(memory, clock, lambda m: None, observers=[partial])
    rig.send("x", "y")
    rig.worker.start()
    rig.wait_for("deleted", 2)
    assert rig.worker.health().live
    rig.stop()
    assert "observer Observer.handler_succeeded raised" in caplog.text
    assert "observer Observer.received raised" in caplog.text


def test_message_build_takes_a_dict_as_its_json_body() -> None:
    from sqsworker import Message

    message = Message.build({"order": 7, "items": ["a"]})
    assert message.body == '{"order": 7, "items": ["a"]}'
    assert message.json() == {"order": 7, "items": ["a"]}
    with pytest.raises(TypeError, match=r"Message\.build takes a str, or a dict or list as JSON"):
        Message.build({"when": object()})
