"""Metrics, health endpoints and JSON logs, on the in-memory SQS with a fake clock."""

from __future__ import annotations

import io
import json
import logging
import math
import re
import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
import structlog
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from sqsworker import Message, Reject, Retry
from sqsworker.clock import FakeClock
from sqsworker.errors import TransportError
from sqsworker.logs import LogObserver, UtcStamper, configure, summary
from sqsworker.metrics import Metrics
from sqsworker.process import Process
from sqsworker.telemetry import TelemetryServer
from sqsworker.transports import BatchResult, Envelope
from sqsworker.transports.memory import MemorySQS, MemoryTransport

from ..conftest import http_get, wait_until
from .conftest import LogStream, sample
from .helpers import Gate, Rig


class Stallable(MemoryTransport):
    """A memory transport whose receive or visibility calls can be made to hang."""

    def __init__(self, memory: MemorySQS) -> None:
        base = memory.transport("jobs")
        super().__init__(memory, base.info)
        self.stall: set[str] = set()
        self.stalled = threading.Event()  # a call is hanging now
        self.release = threading.Event()

    def _hang(self, action: str) -> None:
        if action in self.stall:
            self.stalled.set()
            self.release.wait(30)

    def receive(
        self, max_messages: int, wait_seconds: int, visibility_timeout: int, attempt_id: Any = None
    ) -> list[Envelope]:
        self._hang("receive")
        return super().receive(max_messages, wait_seconds, visibility_timeout, attempt_id)

    def change_visibility_batch(self, entries: Sequence[tuple[str, str, int]]) -> BatchResult:
        self._hang("visibility")
        return super().change_visibility_batch(entries)


def serve(rig: Rig, metrics: Metrics) -> TelemetryServer:
    metrics.watch(rig.worker)
    return TelemetryServer(metrics.registry, rig.worker.health, "127.0.0.1", 0).start()


def test_counters_match_what_happened(
    memory: MemorySQS, clock: FakeClock, metrics: Metrics
) -> None:
    def handler(message: Message) -> None:
        if message.body == "poison":
            raise Reject("cannot be processed")
        if message.body == "flaky" and message.receive_count == 1:
            raise ValueError("first attempt fails")

    rig = Rig(memory, clock, handler, concurrency=4, observers=[metrics])
    metrics.watch(rig.worker)
    rig.send(*["ok"] * 20, *["poison"] * 5, "flaky")
    memory.inject_fault(
        "DeleteMessageBatch", TransportError("boom", code="ServiceUnavailable", retryable=True)
    )
    rig.worker.start()
    rig.advance_until(lambda: rig.count("deleted") == 26)

    assert sample(metrics, "sqsworker_messages_received_total") == 27
    assert sample(metrics, "sqsworker_messages_succeeded_total") == 21
    assert sample(metrics, "sqsworker_messages_rejected_total", exception="Reject") == 5
    assert sample(metrics, "sqsworker_messages_failed_total", exception="Reject") == 0
    assert sample(metrics, "sqsworker_messages_failed_total", exception="ValueError") == 1
    assert sample(metrics, "sqsworker_messages_retried_total") == 1
    assert sample(metrics, "sqsworker_messages_dead_lettered_total", reason="rejected") == 5
    assert sample(metrics, "sqsworker_deletes_total") == 26
    assert sample(metrics, "sqsworker_handler_duration_seconds_count", outcome="success") == 21
    assert sample(metrics, "sqsworker_message_receive_count_sum") == 26 + 2
    deletes = memory.requests["DeleteMessageBatch"]
    assert sample(
        metrics, "sqsworker_sqs_requests_total", action="DeleteMessageBatch", outcome="success"
    ) == (deletes - 1)
    assert (
        sample(
            metrics,
            "sqsworker_sqs_requests_total",
            action="DeleteMessageBatch",
            outcome="ServiceUnavailable",
        )
        == 1
    )
    assert rig.stop() == 0


def test_held_gauges_and_the_cap_countdown(
    memory: MemorySQS, clock: FakeClock, metrics: Metrics
) -> None:
    gate = Gate()
    rig = Rig(memory, clock, gate, concurrency=1, prefetch=1, observers=[metrics])
    metrics.watch(rig.worker)
    rig.send("a", "b")
    rig.worker.start()
    assert gate.started.wait(10)
    wait_until(lambda: sample(metrics, "sqsworker_messages_held", state="waiting") == 1)
    assert sample(metrics, "sqsworker_messages_held", state="running") == 1
    clock.advance(4)  # within the 10 s lease: nothing is due yet
    assert sample(metrics, "sqsworker_visibility_cap_seconds_left") == 43_200 - 4
    clock.advance(2)  # past half the lease: renewed
    wait_until(lambda: sample(metrics, "sqsworker_visibility_extensions_total") == 2)
    gate.release.set()
    rig.advance_until(lambda: rig.count("deleted") == 2)
    assert sample(metrics, "sqsworker_messages_held", state="running") == 0
    assert math.isnan(sample(metrics, "sqsworker_visibility_cap_seconds_left"))  # none held
    rig.stop()


def test_healthz_fails_while_the_lease_thread_is_stuck(
    memory: MemorySQS, clock: FakeClock, metrics: Metrics
) -> None:
    memory.create_queue_with_dlq("jobs")
    transport = Stallable(memory)
    gate = Gate()
    rig = Rig(memory, clock, gate, transport=transport, stall_timeout=5, observers=[metrics])
    server = serve(rig, metrics)
    url = f"http://127.0.0.1:{server.port}"
    try:
        rig.send("long job")
        rig.worker.start()
        assert gate.started.wait(10)
        assert http_get(url + "/healthz")[0] == 200
        transport.stall.add("visibility")
        clock.advance(5)  # the renewal is due at half the 10 s lease: its call hangs
        assert transport.stalled.wait(10)
        assert http_get(url + "/healthz")[0] == 200  # within its allowance
        clock.advance(6)
        status, body = http_get(url + "/healthz")
        assert status == 503
        assert json.loads(body)["lease"].startswith("stuck")
        assert http_get(url + "/readyz")[0] == 200  # still ready: liveness is what restarts it
        transport.release.set()
        wait_until(lambda: http_get(url + "/healthz")[0] == 200, what="the lease thread recovered")
        gate.release.set()
        rig.stop()
    finally:
        gate.release.set()
        transport.release.set()
        server.stop()


def test_healthz_fails_while_a_receive_hangs(memory: MemorySQS, clock: FakeClock) -> None:
    memory.create_queue_with_dlq("jobs")
    transport = Stallable(memory)
    transport.stall.add("receive")
    rig = Rig(memory, clock, lambda m: None, transport=transport, stall_timeout=5)
    rig.worker.start()
    try:
        assert transport.stalled.wait(10)
        assert rig.worker.health().live
        clock.advance(6)
        health = rig.worker.health()
        assert not health.live
        assert health.as_dict()["receiver"].startswith("stuck")
    finally:
        transport.release.set()
    rig.stop()


def test_readyz_before_start_while_running_and_during_shutdown(
    memory: MemorySQS, clock: FakeClock, metrics: Metrics
) -> None:
    gate = Gate()
    rig = Rig(memory, clock, gate, observers=[metrics])
    server = serve(rig, metrics)
    url = f"http://127.0.0.1:{server.port}"
    try:
        assert http_get(url + "/readyz")[0] == 503
        rig.send("x")
        rig.worker.start()
        assert http_get(url + "/readyz")[0] == 200
        assert gate.started.wait(10)
        rig.worker.request_stop()
        stopping = threading.Thread(target=rig.worker.shutdown)
        stopping.start()
        assert http_get(url + "/readyz")[0] == 503
        assert http_get(url + "/healthz")[0] == 200  # finishing its message: do not kill it
        gate.release.set()
        stopping.join(10)
        assert http_get(url + "/metrics")[0] == 200
        assert http_get(url + "/nowhere")[0] == 404
    finally:
        gate.release.set()
        server.stop()


def test_json_logs_carry_message_fields_and_never_the_body(
    memory: MemorySQS, clock: FakeClock, json_logs: io.StringIO
) -> None:
    def handler(message: Message) -> None:
        structlog.get_logger("app").info("charging the card")
        logging.getLogger("app.stdlib").warning("slow payment provider")
        raise Reject("card declined")

    rig = Rig(memory, clock, handler, observers=[LogObserver("tests.handler")])
    rig.send('{"card": "4111-SECRET"}')  # a body that must not reach the logs
    rig.worker.start()
    rig.wait_for("rejected", 1)
    rig.stop()
    lines = [json.loads(line) for line in json_logs.getvalue().splitlines()]
    assert "4111-SECRET" not in json_logs.getvalue()
    by_event = {line["event"]: line for line in lines}
    for event in ("charging the card", "slow payment provider"):
        line = by_event[event]
        assert line["message_id"] and line["queue"] == "jobs" and line["receive_count"] == 1
        assert line["handler"].endswith("handler")
    rejected = by_event["handler rejected the message; moved to the dead-letter queue"]
    assert rejected["level"] == "error" and rejected["error"] == "Reject: card declined"
    assert "exception" not in rejected  # the handler's decision: no traceback


def test_each_outcome_is_counted_once_under_its_own_name_and_the_summary_agrees(
    memory: MemorySQS, clock: FakeClock, metrics: Metrics, json_logs: io.StringIO
) -> None:
    def handler(message: Message) -> None:
        first = message.receive_count == 1
        if message.body == "flaky" and first:
            raise ConnectionError("gateway timed out")
        if message.body == "poison":
            raise ValueError("no line items")
        if message.body == "later" and first:
            raise Retry(0, "the ledger is closed until midnight")
        if message.body == "never":
            raise Retry(0, "still closed")
        if message.body == "reject":
            raise Reject("card declined")
        if message.body == "fault":
            raise KeyError("sku")

    rig = Rig(
        memory,
        clock,
        handler,
        concurrency=4,
        non_retryable=(KeyError,),
        observers=[metrics, LogObserver("tests.handler")],
    )
    rig.send("ok", "ok", "flaky", "poison", "later", "never", "reject", "fault")
    rig.worker.start()
    rig.advance_until(lambda: rig.dlq is not None and rig.dlq.counts().total == 4, limit=400)
    assert rig.stop() == 0
    counts = rig.tally.counts

    def total(name: str) -> float:
        return sum(
            s.value
            for family in metrics.registry.collect()
            for s in family.samples
            if s.name == name
        )

    # One count per outcome, each under its name, and each the metric's figure.
    expected = {
        "succeeded": ("sqsworker_messages_succeeded_total", 4),  # ok, ok, flaky, later
        "failed": ("sqsworker_messages_failed_total", 4),  # flaky once, poison 3 times
        "retry_requested": ("sqsworker_messages_retry_requested_total", 4),  # later, never x3
        "rejected": ("sqsworker_messages_rejected_total", 2),  # reject, fault
        "dead_lettered": ("sqsworker_messages_dead_lettered_total", 4),
    }
    for field, (metric, n) in expected.items():
        assert counts[field] == total(metric) == n, field
    lines = [json.loads(line) for line in json_logs.getvalue().splitlines()]
    events = [line["event"] for line in lines]
    assert events.count("message processed") == 4
    assert events.count("retry requested") == 3  # later once, never twice; then its last
    last = [e for e in events if e.startswith("retry requested on the message's last attempt")]
    assert len(last) == 1
    failed = [line for line in lines if line["event"].startswith("handler failed")]
    assert sorted(line["error"].split(":")[0] for line in failed) == [
        "ConnectionError",
        *["ValueError"] * 3,
    ]
    retried = [line for line in lines if line["event"].startswith("retry requested")]
    assert all("exception" not in line and "error" not in line for line in retried)
    rejected = {
        line["error"]: line for line in lines if line["event"].startswith("handler rejected")
    }
    assert "exception" not in rejected["Reject: card declined"]
    assert "KeyError" in rejected["KeyError: 'sku'"]["exception"]  # a fault: where it was
    summary(counts)  # the closing line of `sqsworker run`
    closing = json.loads(json_logs.getvalue().splitlines()[-1])
    assert closing["event"] == "summary"
    for field, (metric, _) in expected.items():
        assert closing[field] == total(metric), field
    assert closing["received"] == total("sqsworker_messages_received_total") == 14


def test_bodies_are_logged_only_when_asked(
    memory: MemorySQS, clock: FakeClock, json_logs: io.StringIO
) -> None:
    def handler(message: Message) -> None:
        raise Reject("no")

    rig = Rig(memory, clock, handler, observers=[LogObserver("h", log_bodies=True)])
    rig.send("the body")
    rig.worker.start()
    rig.wait_for("rejected", 1)
    rig.stop()
    lines = [json.loads(line) for line in json_logs.getvalue().splitlines()]
    assert [line["body"] for line in lines if "body" in line] == ["the body"]


def test_the_trace_header_joins_the_log_context() -> None:
    message = Message.build("{}", AWSTraceHeader="Root=1-5759e988-bd862e3fe1be46a994272793")
    assert message.log_context["aws_trace_header"] == "Root=1-5759e988-bd862e3fe1be46a994272793"
    assert "aws_trace_header" not in Message.build("{}").log_context


class SecondReceiveHangs(MemoryTransport):
    """A memory transport whose second receive hangs until ``release`` is set: a long
    poll under way when shutdown begins."""

    def __init__(self, memory: MemorySQS) -> None:
        super().__init__(memory, memory.transport("jobs").info)
        self.receives = 0
        self.stalled = threading.Event()
        self.release = threading.Event()

    def receive(
        self, max_messages: int, wait_seconds: int, visibility_timeout: int, attempt_id: Any = None
    ) -> list[Envelope]:
        self.receives += 1
        if self.receives == 2:
            self.stalled.set()
            self.release.wait(30)
        return super().receive(max_messages, wait_seconds, visibility_timeout, attempt_id)


def test_at_shutdown_a_waiting_message_goes_back_once_after_the_polls_under_way(
    memory: MemorySQS, clock: FakeClock, metrics: Metrics, json_logs: io.StringIO
) -> None:
    # Handed back while a poll of the worker's own is under way, a message was received
    # again by it, and handed back again: each time using up one of its receives, so a
    # rolling update moved messages to the dead-letter queue unrun (maxReceiveCount 3).
    gate = Gate()
    memory.create_queue_with_dlq("jobs", 3)
    transport = SecondReceiveHangs(memory)
    rig = Rig(
        memory,
        clock,
        gate,
        concurrency=1,
        prefetch=19,
        transport=transport,
        observers=[metrics, LogObserver("tests.handler")],
    )
    rig.send("runs", "waits")
    rig.worker.start()
    assert gate.started.wait(10) and transport.stalled.wait(10)
    rig.worker.request_stop()
    stopping = threading.Thread(target=rig.worker.shutdown)
    stopping.start()
    wait_until(lambda: "waiting for the receives under way to end" in json_logs.getvalue())
    assert rig.count("handed_back") == 0 and memory.counts("jobs").visible == 0  # held
    transport.release.set()  # the poll ends, with nothing: "waits" is still held
    wait_until(lambda: rig.count("handed_back") == 1)
    gate.release.set()
    stopping.join(10)
    assert not stopping.is_alive()
    summary(rig.tally.counts)
    lines = {line["event"]: line for line in map(json.loads, json_logs.getvalue().splitlines())}
    assert lines["stopped"]["handed_back"] == 1
    assert lines["summary"]["handed_back"] == 1
    assert sample(metrics, "sqsworker_messages_handed_back_total") == 1
    assert memory.counts("jobs").total == 1  # "waits", visible again; "runs" deleted
    [back] = rig.queue.receive(10, 0, 30)
    assert (back.body, back.receive_count) == ("waits", 2)  # one receive used, not two


def test_two_handlers_in_one_process_share_one_metrics_page_and_one_health(
    memory: MemorySQS, clock: FakeClock
) -> None:
    registry = CollectorRegistry()
    orders = Metrics("orders", "app.orders", registry=registry, clock=clock)
    refunds = Metrics("refunds", "app.refunds", registry=registry, clock=clock)
    gate = Gate()
    fast = Rig(memory, clock, lambda message: None, queue="orders", observers=[orders])
    slow = Rig(memory, clock, gate, queue="refunds", observers=[refunds])
    orders.watch(fast.worker)
    refunds.watch(slow.worker)
    process = Process({"orders": fast.worker, "refunds": slow.worker})
    server = TelemetryServer(registry, process.health, "127.0.0.1", 0).start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        fast.send(*["o"] * 5)
        slow.send("r")
        process.start()
        fast.advance_until(lambda: fast.count("deleted") == 5)
        assert gate.started.wait(10)  # the slow queue's handler holds its message meanwhile

        status, page = http_get(base + "/metrics")
        assert status == 200
        # One family per name, a series per handler: a second HELP line would break scrapes.
        assert page.count("# HELP sqsworker_messages_received_total ") == 1
        assert page.count("# HELP sqsworker_messages_held ") == 1
        received = "sqsworker_messages_received_total"
        assert (
            registry.get_sample_value(received, {"queue": "orders", "handler": "app.orders"}) == 5
        )
        assert (
            registry.get_sample_value(received, {"queue": "refunds", "handler": "app.refunds"}) == 1
        )
        held = {"queue": "refunds", "handler": "app.refunds", "state": "running"}
        assert registry.get_sample_value("sqsworker_messages_held", held) == 1

        status, body = http_get(base + "/healthz")
        report = json.loads(body)
        names = {fast.worker.handler.name, slow.worker.handler.name}
        assert status == 200 and report["live"] and set(report["workers"]) == names
        assert report["workers"][slow.worker.handler.name]["receiver"] == "ok"
        assert http_get(base + "/readyz")[0] == 200

        process.request_stop()
        assert http_get(base + "/readyz")[0] == 503  # stopping: neither takes new work
        gate.release.set()
        assert process.shutdown() == 0
    finally:
        gate.release.set()
        server.stop()
    assert slow.count("deleted") == 1


def test_the_line_of_every_message_follows_structlog_configured_anew(
    json_logs: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The observer keeps its assembled logger (a proxy assembles one per line) only while
    structlog's configuration is the one it was assembled from."""
    observer = LogObserver("h")
    message = Message.build("{}")
    observer.handler_succeeded(message, 0.25)
    with capture_logs() as captured:
        observer.handler_succeeded(message, 0.5)
    assert [(c["event"], c["duration"]) for c in captured] == [("message processed", 0.5)]
    monkeypatch.setattr("sys.stderr", json_logs)  # pytest sets its own for the test's body
    configure("warning", "json")
    observer.handler_succeeded(message, 0.75)  # below the level now: not written
    configure("info", "json")
    observer.handler_succeeded(message, 1.0)
    # the level alone raised, the processors kept: not written either
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    observer.handler_succeeded(message, 1.25)
    lines = [json.loads(line) for line in json_logs.getvalue().splitlines()]
    assert [(line["handler"], line["duration"]) for line in lines] == [("h", 0.25), ("h", 1.0)]


@pytest.mark.parametrize("fmt", ["json", "console"])
def test_the_line_of_every_message_is_the_line_a_bound_logger_writes(
    fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every message's line goes through ``configure``'s processors without a bound logger;
    it is the line structlog's logger writes, field for field and in its order, with what
    the handler bound to the context, the group, the trace header and the key."""
    stream = LogStream()
    monkeypatch.setattr("sys.stderr", stream)
    configure("info", fmt)
    message = Message.build(
        "{}", MessageGroupId="g-1", AWSTraceHeader="Root=1-5759e988-bd862e3fe1be46a994272793"
    )
    message.queue = "orders.fifo"
    message.idempotency_key = "order-7"
    direct = LogObserver("app:handle")
    bound = LogObserver("app:handle", logger=structlog.get_logger("sqsworker"))
    try:
        with structlog.contextvars.bound_contextvars(tenant="acme"):
            direct.handler_succeeded(message, 0.0123)
            bound.handler_succeeded(message, 0.0123)
        lines = stream.getvalue().splitlines()
    finally:
        structlog.reset_defaults()
        logging.getLogger().handlers = []
    assert len(lines) == 2
    if fmt == "json":
        first, second = (json.loads(line) for line in lines)
        assert first.pop("timestamp") <= second.pop("timestamp")
        assert list(first.items()) == list(second.items())
        assert first["tenant"] == "acme" and first["group_id"] == "g-1"
        assert first["idempotency_key"] == "order-7" and first["duration"] == 0.012
    else:
        first, second = (line.split(" ", 1)[1] for line in lines)  # after the time
        assert first == second
        assert "message processed" in first and "tenant=acme" in first


def test_json_lines_carry_an_iso_utc_time_of_microseconds() -> None:
    stamper = UtcStamper()
    before = datetime.now(UTC)
    stamps = [stamper(None, "info", {})["timestamp"] for _ in range(3)]
    after = datetime.now(UTC)
    for stamp in stamps:
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", stamp), stamp
        assert before <= datetime.fromisoformat(stamp) <= after
    assert stamps == sorted(stamps)
