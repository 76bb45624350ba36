"""Each outcome reported once, under its own name, on paths off the main road (found by
review: a rejection whose dead-letter copy fails, a key conflict, a key function that
raises, FIFO messages handed back behind their head, a delete after a lost lease, a
handler finishing as it is handed back)."""

from __future__ import annotations

import io
import json
import logging
import threading
from pathlib import Path
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from sqsworker import Backoff, Message, Reject, Worker, WorkerConfig
from sqsworker.clock import FakeClock
from sqsworker.errors import ImportStringError, TransportError
from sqsworker.events import Observers, Tally
from sqsworker.importer import import_from_string
from sqsworker.lease import Held
from sqsworker.lease_state import State
from sqsworker.logs import LogObserver, configure
from sqsworker.metrics import Metrics
from sqsworker.stores.memory import MemoryStore
from sqsworker.transports import Envelope, OutgoingMessage, send_all
from sqsworker.transports.memory import MemorySQS

from ..conftest import wait_until
from .conftest import LogStream, sample
from .helpers import Gate, Rig


def lines(json_logs: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in json_logs.getvalue().splitlines()]


def unavailable() -> TransportError:
    return TransportError("ServiceUnavailable", code="ServiceUnavailable", retryable=True)


def test_a_rejection_whose_dead_letter_copy_fails_is_a_rejection_not_an_error(
    memory: MemorySQS, clock: FakeClock, metrics: Metrics, json_logs: io.StringIO
) -> None:
    def handler(message: Message) -> None:
        raise Reject("card declined")

    rig = Rig(memory, clock, handler, observers=[metrics, LogObserver("tests.handler")])
    rig.send("x")
    memory.inject_fault("SendMessageBatch", unavailable())
    rig.worker.start()
    rig.wait_for("rejected", 1)
    rig.advance_until(lambda: rig.dlq is not None and rig.dlq.counts().total == 1)
    assert rig.stop() == 0
    assert rig.count("failed") == 0 and rig.count("rejected") == 2  # once per attempt
    assert sample(metrics, "sqsworker_messages_failed_total", exception="Reject") == 0
    assert sample(metrics, "sqsworker_messages_rejected_total", exception="Reject") == 2
    [first] = [line for line in lines(json_logs) if "copy to the dead-letter" in line["event"]]
    assert first["error"] == "Reject: card declined" and "exception" not in first


def test_a_key_conflict_rejected_is_one_line(
    memory: MemorySQS, clock: FakeClock, json_logs: io.StringIO
) -> None:
    rig = Rig(
        memory,
        clock,
        lambda m: None,
        store=MemoryStore(),
        concurrency=1,
        on_key_conflict="reject",
        observers=[LogObserver("tests.handler")],
    )
    key = {"idempotency-key": {"DataType": "String", "StringValue": "p-1"}}
    send_all(rig.queue, [OutgoingMessage(b, message_attributes=key) for b in ("10", "99")])
    rig.worker.start()
    rig.wait_for("deleted", 2)
    rig.stop()
    errors = [
        line
        for line in lines(json_logs)
        if line.get("idempotency_key") == "p-1" and line["level"] == "error"
    ]
    assert len(errors) == 1 and "KeyConflict" in errors[0]["error"]


def order_key(message: Message) -> str:
    return str(message.json()["order"].strip())  # a bug: "order" is a number here


def test_a_key_function_that_raises_is_logged_with_its_traceback(
    memory: MemorySQS, clock: FakeClock, json_logs: io.StringIO
) -> None:
    rig = Rig(
        memory,
        clock,
        lambda m: None,
        store=MemoryStore(),
        idempotency_key=order_key,
        observers=[LogObserver("tests.handler")],
    )
    rig.send('{"order": 7}')
    rig.worker.start()
    rig.wait_for("rejected", 1)
    rig.stop()
    [line] = [line for line in lines(json_logs) if line["event"].startswith("handler rejected")]
    assert "order_key" in line["exception"]


def test_fifo_messages_handed_back_behind_their_head_are_counted(
    memory: MemorySQS, clock: FakeClock
) -> None:
    metrics = Metrics("jobs.fifo", "tests.handler", clock=clock)

    def handle(message: Message) -> None:
        if message.body == "1":
            raise RuntimeError("the head fails")

    memory.create_queue_with_dlq("jobs.fifo", 5)
    tally = Tally()
    worker = Worker(
        handle,
        WorkerConfig(queue="jobs.fifo", wait_time=0, delete_interval=0, concurrency=1),
        transport=memory.transport("jobs.fifo"),
        clock=clock,
        observer=Observers([tally, metrics]),
        backoff=Backoff(2.0, 900.0),
    )
    fifo = [OutgoingMessage(b, group_id="g", deduplication_id=b) for b in "123"]
    send_all(memory.transport("jobs.fifo"), fifo)
    worker.start()
    wait_until(lambda: tally.counts["returned"] == 3)
    worker.request_stop()
    worker.shutdown()
    assert tally.counts["fifo_handed_back"] == 2
    labels = {"queue": "jobs.fifo", "handler": "tests.handler"}
    name = "sqsworker_fifo_messages_handed_back_total"
    assert metrics.registry.get_sample_value(name, labels) == 2


def test_a_delete_after_a_lost_lease_is_counted(
    memory: MemorySQS, clock: FakeClock, metrics: Metrics
) -> None:
    release = threading.Event()
    rig = Rig(
        memory,
        clock,
        lambda m: release.wait(30),
        observers=[metrics],
        visibility_timeout=10,
        concurrency=1,
        prefetch=0,
    )
    memory.inject_fault("ChangeMessageVisibilityBatch", unavailable(), times=1000)
    rig.send("x")
    rig.worker.start()
    rig.wait_for("received", 1)
    rig.advance_until(lambda: rig.count("leases_lost") == 1)
    memory.transport("jobs").receive(1, 0, 30)  # another consumer takes it
    release.set()
    rig.wait_for("deleted_after_lease_lost", 1)
    assert sample(metrics, "sqsworker_deletes_after_lease_lost_total") == 1
    assert rig.count("deleted") == 0
    rig.stop()


def test_a_handler_finishing_as_it_is_handed_back_is_reported_deleted(
    memory: MemorySQS, clock: FakeClock
) -> None:
    gate = Gate()
    rig = Rig(memory, clock, gate, concurrency=1, prefetch=0, shutdown_timeout=1)
    rig.send("x")
    rig.worker.start()
    assert gate.started.wait(10)
    keeper = rig.worker.keeper
    assert keeper is not None
    original = keeper.release

    def release(held: Held, seconds: float, reason: str, urgent: bool = False) -> None:
        if reason == "shutdown":  # hand_back() marked it; the handler returns right now
            gate.release.set()
            wait_until(lambda: held.state in (State.SETTLING, State.DONE))
        original(held, seconds, reason, urgent)

    keeper.release = release  # type: ignore[method-assign]  # forces the interleaving
    rig.worker.request_stop()
    stopping = threading.Thread(target=rig.worker.shutdown)
    stopping.start()
    wait_until(lambda: rig.worker.inbox.closing)
    clock.advance(2)  # past --shutdown-timeout: the running message is handed back
    stopping.join(10)
    assert rig.queue.counts().total == 0  # SQS deleted it: the receipt handle was valid
    assert rig.count("deleted") == 1 and rig.count("deleted_after_lease_lost") == 0


def test_a_syntax_error_names_the_users_file_not_the_importer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "broken_syntax.py").write_text("def process(message)\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImportStringError) as raised:
        import_from_string("broken_syntax:process")
    assert "broken_syntax.py, line 1" in str(raised.value)
    assert "importer.py" not in str(raised.value)


def test_console_tracebacks_show_no_local_variables(
    memory: MemorySQS, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = LogStream()
    monkeypatch.setattr("sys.stderr", stream)
    configure("info", "console")
    try:

        def handler(message: Message) -> None:
            card = message.json()["card"]  # a local holding the body's secret
            raise ValueError(f"declined ({len(card)} digits)")

        rig = Rig(memory, clock, handler, max_receive_count=1, observers=[LogObserver("h")])
        rig.send(json.dumps({"card": "-".join(["4111", "SECRET"])}))  # not in this source
        rig.worker.start()
        rig.wait_for("failed", 1)  # its last attempt: logged with the traceback
        rig.stop()
    finally:
        structlog.reset_defaults()
        logging.getLogger().handlers = []
    assert "Traceback" in stream.getvalue() and "declined (11 digits)" in stream.getvalue()
    assert "4111-SECRET" not in stream.getvalue()


def test_each_error_shows_its_traceback_though_its_id_is_a_freed_errors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A traceback is shown once an error. The observer kept the last shown error's id and
    its traceback's, and an error allocated where a freed one had been would match them,
    its traceback unshown (likely what failed the console test below, once in six runs).
    Every id the observer could read is made to match here."""
    monkeypatch.setattr("sqsworker.logs.id", lambda obj: 1, raising=False)
    observer = LogObserver("h")
    message = Message(Envelope("m-1", "handle-1", "7"), "jobs")
    errors = []
    for body in ("7", "8"):
        try:
            raise ValueError(f"order {body} has no line items")
        except ValueError as exc:
            errors.append(exc)
    with capture_logs() as lines:
        for error in (*errors, errors[1]):  # the last one again, as a batch's messages share it
            observer.handler_failed(message, error, 0.1, 0.0, last_attempt=True)
    assert [line.get("exc_info") for line in lines] == [errors[0], errors[1], None]


def test_a_console_shows_a_failure_in_one_line_and_only_the_handlers_frames_at_the_last(
    memory: MemorySQS, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make demo` read two 40-line tracebacks, most of them the worker's own frames, and
    an idempotency_key= on every line that only repeated the message id."""
    stream = LogStream()
    monkeypatch.setattr("sys.stderr", stream)
    configure("info", "console")
    try:

        def handler(message: Message) -> None:
            raise ValueError(f"order {message.body} has no line items")

        rig = Rig(
            memory,
            clock,
            handler,
            max_receive_count=2,
            observers=[LogObserver("h")],
            store=MemoryStore(),
        )
        key = {"DataType": "String", "StringValue": "order-7-attempt-1"}
        send_all(rig.queue, [OutgoingMessage("7", {"idempotency-key": key}), "8"])
        rig.worker.start()
        rig.advance_until(lambda: rig.count("failed") == 4)
        rig.stop()
    finally:
        structlog.reset_defaults()
        logging.getLogger().handlers = []
    shown = stream.getvalue()
    lines = shown.splitlines()
    retried = [n for n, line in enumerate(lines) if "message will be retried" in line]
    last = [n for n, line in enumerate(lines) if "failed on its last attempt" in line]
    assert len(retried) == 2 and len(last) == 2
    for n in retried:  # one line: the next is a line of its own, not a traceback
        assert not lines[n + 1].startswith((" ", "Traceback")), shown
    for n in last:  # Python's traceback, of the handler's frame alone
        assert lines[n + 1 : n + 5] == [
            "Traceback (most recent call last):",
            f'  File "{__file__}", line {handler.__code__.co_firstlineno + 1}, in handler',
            '    raise ValueError(f"order {message.body} has no line items")',
            lines[n + 4],
        ]
        assert lines[n + 4] in (
            "ValueError: order 7 has no line items",
            "ValueError: order 8 has no line items",
        )
    assert "worker.py" not in shown and "╭" not in shown
    assert shown.count("idempotency_key=order-7-attempt-1") == 2  # a key of its own: shown
    assert "idempotency_key=" not in "\n".join(line for line in lines if "order-7" not in line)


def test_a_rejection_whose_copy_fails_on_its_last_receive_is_reported_dead_lettered(
    memory: MemorySQS, clock: FakeClock, metrics: Metrics, json_logs: io.StringIO
) -> None:
    def handler(message: Message) -> None:
        raise Reject("card declined")

    rig = Rig(
        memory,
        clock,
        handler,
        max_receive_count=2,
        observers=[metrics, LogObserver("tests.handler")],
    )
    rig.send("x")
    memory.inject_fault("SendMessageBatch", unavailable(), times=1000)
    rig.worker.start()
    rig.advance_until(lambda: rig.dlq is not None and rig.dlq.counts().total == 1)
    assert rig.stop() == 0
    assert rig.queue.counts().total == 0  # SQS moved it on the receive after its last
    assert rig.count("rejected") == 2 and rig.count("dead_lettered") == 1
    name = "sqsworker_messages_dead_lettered_total"
    assert sample(metrics, name, reason="max_receives") == 1
    last = [line for line in lines(json_logs) if "copy to the dead-letter" in line["event"]][-1]
    assert "on its next receive" in last["event"] and last["retry_in"] == 0
