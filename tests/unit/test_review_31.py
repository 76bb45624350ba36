"""From the independent review of the worker's split by concept (receiving, inbox, running,
admission, settling): each test pins a behaviour of the code before the split that the
split changed, on the in-memory SQS, and fails until it is restored."""

from __future__ import annotations

from sqsworker import Message, Retry
from sqsworker.clock import FakeClock
from sqsworker.events import Observer
from sqsworker.transports.memory import MemorySQS

from .helpers import Rig


class RetryDelays(Observer):
    """The ``retry_in`` each retry request was reported with."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    def handler_retry_requested(
        self,
        message: Message,
        request: Retry,
        duration: float,
        retry_in: float,
        last_attempt: bool,
    ) -> None:
        self.delays.append(retry_in)


def test_a_retry_at_once_is_reported_with_the_delay_the_handler_gave(
    memory: MemorySQS, clock: FakeClock
) -> None:
    """``raise Retry(0)``: the report (and so the log line's ``retry_in`` and the span's
    event) carries the handler's own 0, as before the split, not 0.0 (``decide`` turned a
    falsy delay into 0.0 with ``delay or 0.0``)."""
    delays = RetryDelays()

    def handler(message: Message) -> None:
        raise Retry(0)

    rig = Rig(memory, clock, handler, observers=[delays], max_receive_count=5)
    rig.send("x")
    rig.worker.start()
    rig.wait_for("retry_requested", 1)
    assert rig.stop() == 0
    assert delays.delays and repr(delays.delays[0]) == "0"
