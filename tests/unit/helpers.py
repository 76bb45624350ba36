from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence
from typing import Any

from sqsworker import Backoff, Message, Worker, WorkerConfig
from sqsworker.clock import FakeClock
from sqsworker.events import Observer, Observers, Tally
from sqsworker.payloads import Payloads
from sqsworker.stores import Store
from sqsworker.transports import OutgoingMessage, Transport, send_all
from sqsworker.transports.memory import MemorySQS

from ..conftest import wait_until


def keyed(body: str, key: str) -> OutgoingMessage:
    """A message whose attribute "key" carries ``key`` (read by idempotency_key="attribute:key")."""
    return OutgoingMessage(body, {"key": {"DataType": "String", "StringValue": key}})


class Gate:
    """A handler that blocks until ``release`` is set, and tells when it ``started``."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self, message: Message) -> None:
        self.started.set()
        self.release.wait(60)


class Rig:
    """A worker on the in-memory SQS with a fake clock, and what a test needs around it."""

    def __init__(
        self,
        memory: MemorySQS,
        clock: FakeClock,
        handler: Callable[[Message], Any],
        *,
        dead_letter: bool = True,
        max_receive_count: int = 3,
        transport: Transport | None = None,
        observers: Sequence[Observer] = (),
        store: Store | None = None,
        payloads: Payloads | None = None,
        tracer: Any = None,
        queue: str = "jobs",
        queue_attributes: dict[str, str] | None = None,
        **options: Any,
    ) -> None:
        self.memory, self.clock = memory, clock
        self._stopper = threading.Thread()  # shutdown's thread, once begin_stop made it
        if dead_letter:
            memory.create_queue_with_dlq(queue, max_receive_count, **(queue_attributes or {}))
        else:
            memory.create_queue(queue)
        self.queue = memory.transport(queue)
        suffix = ".fifo" if queue.endswith(".fifo") else ""
        dlq = queue.removesuffix(".fifo") + "-dlq" + suffix
        self.dlq = memory.transport(dlq) if dead_letter else None
        self.tally = Tally()
        settings: dict[str, Any] = {
            "queue": queue,
            "wait_time": 0,
            "delete_interval": 0,
            "visibility_timeout": 10,
            "concurrency": 2,
        }
        self.worker = Worker(
            handler,
            WorkerConfig(**{**settings, **options}),
            transport=transport or memory.transport(queue),
            clock=clock,
            observer=Observers([self.tally, *observers]),
            backoff=Backoff(2.0, 900.0, random.Random(7)),
            idempotency_store=store,
            payloads=payloads,
            tracer=tracer,
        )

    def send(self, *bodies: str) -> None:
        send_all(self.queue, list(bodies))

    def count(self, key: str) -> int:
        return self.tally.counts[key]

    def wait_for(self, key: str, n: int) -> None:
        wait_until(
            lambda: self.count(key) >= n,
            what=lambda: f"{key} >= {n} (have {dict(self.tally.counts)})",  # at the failure
        )

    def advance_until(
        self, predicate: Callable[[], bool], step: float = 1.0, limit: int = 200
    ) -> None:
        """Move the fake clock a step at a time until ``predicate`` holds."""
        for _ in range(limit):
            if predicate():
                return
            self.clock.advance(step)
            threading.Event().wait(0.002)
        wait_until(predicate, timeout=2)

    def begin_stop(self) -> Callable[[], int]:
        """Request a stop and shut down on a thread of its own; the call returned waits
        for shutdown's exit code."""
        self.worker.request_stop()
        result: list[int] = []
        stopper = threading.Thread(target=lambda: result.append(self.worker.shutdown()))
        stopper.start()

        def code() -> int:
            stopper.join(10)
            assert result, "shutdown did not finish"
            return result[0]

        self._stopper = stopper
        return code

    def stop_past_timeout(self) -> int:
        """Stop, moving the fake clock a second at a time past --shutdown-timeout."""
        code = self.begin_stop()
        while self._stopper.is_alive():
            self.clock.advance(1)
            self._stopper.join(0.02)
        return code()

    def stop(self) -> int:
        self.worker.request_stop()
        result: list[int] = []
        thread = threading.Thread(target=lambda: result.append(self.worker.shutdown()))
        thread.start()
        thread.join(10)
        assert result, "shutdown did not finish"
        return result[0]
