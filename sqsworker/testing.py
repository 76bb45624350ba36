"""Testing your own handlers: the real worker over the in-memory SQS, on a fake clock.

``Harness(handler)`` runs the worker ``sqsworker run`` runs, with its leases, backoffs,
dead-letter queue, FIFO groups and idempotency keys, against ``MemorySQS``, which models
SQS's semantics (visibility, receive counts, redrive after ``maxReceiveCount``, FIFO
group locks). Time is a ``FakeClock``: ``drain()`` moves it by itself through backoffs
and visibility timeouts, so a test of a message that fails three times and lands in the
dead-letter queue takes milliseconds, not minutes. The pytest fixture
``sqsworker_harness`` (sqsworker/pytest_plugin.py) makes one and closes it.

    harness = Harness(process)
    message_id = harness.send({"id": "o-1"})
    harness.drain()
    assert harness.runs[message_id] == 1 and message_id in harness.deleted
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .clock import FakeClock
from .config import WorkerConfig
from .errors import ConfigError, MessageValidationError
from .events import Observer, Observers
from .handler import Handler, as_handler
from .logs import LogObserver
from .message import Message
from .producer import Producer
from .stores import Store
from .stores.memory import MemoryStore
from .transports.memory import MemorySQS
from .worker import Worker

QUIET = 3  # looks in a row at an unchanged worker before the clock moves on
LOOK = 0.002  # real seconds between two looks
MAX_STEP = 1.0  # fake seconds the clock moves at a time while messages are held


@dataclass(frozen=True)
class DeadLetter:
    """A message in the dead-letter queue: its original message id, its body, and why it
    is there (the worker's note for a rejected message, else its last failure)."""

    message_id: str
    body: str
    reason: str


class _Record(Observer):
    """What the worker did to each message, for the test to read."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.lock = threading.Lock()
        self.runs: Counter[str] = Counter()
        self.deleted_ids: list[str] = []
        self.failures: dict[str, str] = {}  # message id -> its last failure, as text
        self.events = 0  # changes seen: the harness waits for them to stop

    def _note(self) -> None:
        self.events += 1

    def handler_started(self, message: Message) -> None:
        with self.lock:
            self.runs[message.message_id] += 1
            self._note()

    def deleted(self, messages: Sequence[Message]) -> None:
        with self.lock:
            self.deleted_ids.extend(m.message_id for m in messages)
            self._note()

    def handler_failed(
        self, message: Message, error: BaseException, duration: float, retry_in: float, last: bool
    ) -> None:
        self._failed(message, error)

    def handler_rejected(
        self, message: Message, error: BaseException, duration: float, dead_letter: str | None
    ) -> None:
        if isinstance(error, MessageValidationError) and self.handler.typed is not None:
            with self.lock:  # refused before the handler ran: not a run
                self.runs[message.message_id] -= 1
        self._failed(message, error)

    def step_failed(
        self, message: Message, error: BaseException, retry_in: float, last_attempt: bool
    ) -> None:
        self._failed(message, error)

    def _failed(self, message: Message, error: BaseException) -> None:
        with self.lock:
            self.failures[message.message_id] = f"{type(error).__name__}: {error}"
            self._note()

    def returned(self, messages: Sequence[Message], delay: float, reason: str) -> None:
        with self.lock:
            self._note()

    def received(self, messages: Sequence[Message]) -> None:
        with self.lock:
            self._note()


class Harness:
    """``handler`` run by the real worker on the in-memory SQS, on a fake clock.

    ``max_receive_count``: receives before SQS moves a message to the dead-letter queue.
    ``visibility_timeout``: the worker's (else the handler's option, else 30 s).
    ``fifo``: a FIFO queue (give ``send`` a ``group_id``). ``idempotency_store``: a store
    object, or True for an in-memory one; the handler's ``idempotency_key`` option then
    applies. Other keyword options are the worker's (``concurrency=1``, ...).
    """

    def __init__(
        self,
        handler: Handler | Any,
        *,
        max_receive_count: int = 3,
        visibility_timeout: int | None = None,
        fifo: bool = False,
        idempotency_store: Store | bool | None = None,
        **options: Any,
    ) -> None:
        self.handler = as_handler(handler)
        self.clock = FakeClock()
        self.sqs = MemorySQS(self.clock)
        name = str(self.handler.options.get("queue") or "queue").rsplit("/", 1)[-1]
        name = name.rsplit(":", 1)[-1].removesuffix(".fifo")
        self.queue = name + (".fifo" if fifo else "")
        self.dead_letter_queue = name + "-dlq" + (".fifo" if fifo else "")
        attributes = {"FifoQueue": "true"} if fifo else {}
        self.sqs.create_queue_with_dlq(self.queue, max_receive_count, **attributes)
        settings = {**self.handler.options, **options}
        settings.update(queue=self.queue, wait_time=0, delete_interval=0.0)
        if visibility_timeout is not None:
            settings["visibility_timeout"] = visibility_timeout
        settings.pop("endpoint_url", None)
        settings.pop("idempotency_store", None)
        if "idempotency_key" in settings and not idempotency_store:
            raise ConfigError(
                f"{self.handler.name} has an idempotency_key, and without a store its keys "
                "would not be checked (sqsworker run refuses it too): pass "
                "idempotency_store=True for an in-memory one"
            )
        store = MemoryStore() if idempotency_store is True else idempotency_store or None
        self._record = _Record(self.handler)
        self.worker = Worker(
            self.handler,
            WorkerConfig(**settings),
            transport=self.sqs.transport(self.queue),
            clock=self.clock,
            # The worker's log lines as sqsworker run writes them (pytest shows them).
            observer=Observers([self._record, LogObserver(self.handler.name)]),
            idempotency_store=store,
        )
        self.producer = Producer(self.queue, transport=self.sqs.transport(self.queue))
        # While the harness is open, handler.send() (code under test sending to the
        # handler's queue, Celery's .delay) sends to this in-memory queue.
        self._saved_producer = self.handler.__dict__.get("producer")
        self.handler.__dict__["producer"] = self.producer
        self._started = False

    # -- what a test does ------------------------------------------------------------------

    def send(self, body: object, **options: Any) -> str:
        """Send ``body`` to the handler's queue (``Producer.send``'s options); its id."""
        return self.producer.send(body, **options)

    def drain(self, timeout: float = 10.0) -> None:
        """Run until nothing is visible, delayed or in flight and the worker holds nothing,
        moving the fake clock through backoffs and visibility timeouts as needed.
        ``timeout`` is in real seconds: past it, ``TimeoutError`` says what is left."""
        self._start()
        deadline = time.monotonic() + timeout
        while not self._done():
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the queue did not drain in {timeout} s: {self.sqs.counts(self.queue)}, "
                    f"{self.worker.in_hand} held by the worker (a handler that never returns?)"
                )
            self._step()

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` of fake time pass, the worker acting as they do."""
        self._start()
        end = self.clock.monotonic() + seconds
        while self.clock.monotonic() < end:
            self._quiet()
            self.clock.advance(min(MAX_STEP, end - self.clock.monotonic()))
        self._quiet()

    def deliver_again(self, message_id: str) -> None:
        """Deliver a message once more, as SQS's at-least-once may (also after it was
        deleted): what an idempotent handler must survive."""
        self.sqs.deliver_again(self.queue, message_id)

    @property
    def runs(self) -> Mapping[str, int]:
        """Message id -> how many times the handler ran on it."""
        with self._record.lock:
            return dict(self._record.runs)

    @property
    def deleted(self) -> list[str]:
        """Ids of the messages deleted after their handler succeeded (or as duplicates)."""
        with self._record.lock:
            return list(self._record.deleted_ids)

    @property
    def dead_letters(self) -> list[DeadLetter]:
        """The dead-letter queue's messages, each with the reason the worker recorded."""
        letters = []
        for envelope in self.sqs.stored(self.dead_letter_queue):
            notes = envelope.message_attributes
            source = notes.get("sqsworker-source-message-id", {}).get("StringValue")
            message_id = source or envelope.message_id
            with self._record.lock:
                reason = notes.get("sqsworker-error", {}).get("StringValue") or (
                    self._record.failures.get(message_id, "moved by SQS after maxReceiveCount")
                )
            letters.append(DeadLetter(message_id, envelope.body, reason))
        return letters

    def close(self) -> None:
        """Stop the worker (it hands back what it holds) and close its clients."""
        if self._started:
            self._started = False
            self.worker.request_stop()
            stopping = threading.Thread(target=self.worker.shutdown)
            stopping.start()
            while stopping.is_alive():
                stopping.join(LOOK)
                self.clock.advance(MAX_STEP)  # the shutdown's own waits pass in fake time
        if self.handler.__dict__.get("producer") is self.producer:
            if self._saved_producer is None:
                del self.handler.__dict__["producer"]
            else:
                self.handler.__dict__["producer"] = self._saved_producer
        self.producer.close()

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- inside ------------------------------------------------------------------------

    def _start(self) -> None:
        if not self._started:
            self.worker.start()
            self._started = True

    def _done(self) -> bool:
        keeper = self.worker.keeper
        held = keeper.held_count() if keeper is not None else 0
        return self.sqs.counts(self.queue).total == 0 and held == 0 and not self.worker.in_hand

    def _quiet(self) -> None:
        """Wait (in real time) until the worker's threads stop changing anything."""
        unchanged, last = 0, None
        while unchanged < QUIET:
            time.sleep(LOOK)
            keeper = self.worker.keeper
            now = (
                self._record.events,
                self.worker.in_hand,
                keeper.held_count() if keeper is not None else 0,
                self.sqs.counts(self.queue),
            )
            unchanged = unchanged + 1 if now == last else 0
            last = now

    def _step(self) -> None:
        """Once the worker is quiet, move the clock: to the next moment a message becomes
        visible when nothing is held (a backoff passes at once), else a second at most (a
        held message's lease is renewed as it would be)."""
        self._quiet()
        if self._done():
            return
        keeper = self.worker.keeper
        held = keeper.held_count() if keeper is not None else 0
        step = MAX_STEP
        after = self.sqs.next_visible(self.queue)
        if not held and after is not None:
            step = max(MAX_STEP, after - self.clock.monotonic())
        self.clock.advance(step)
