"""OpenTelemetry: a consumer span per message, parented on the producer's context, with
the outcome recorded; producers inject the context. Spans go to the SDK's in-memory
exporter, from a tracer provider of the test's own (the process's global one is left
alone)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import sqsworker
from sqsworker import BatchResult, Message, Reject, tracing
from sqsworker.clock import FakeClock
from sqsworker.transports import Envelope, OutgoingMessage, send_all
from sqsworker.transports.memory import MemorySQS

from .helpers import Rig


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


@pytest.fixture
def traced(
    spans: tuple[TracerProvider, InMemorySpanExporter], monkeypatch: pytest.MonkeyPatch
) -> Any:
    """The module's tracer as if OTEL_* had set it up: producers inject, logs carry ids."""
    provider, _ = spans
    tracer = provider.get_tracer("test")
    monkeypatch.setattr(tracing, "_tracer", tracer)
    monkeypatch.setattr(tracing, "_configured", True)
    return tracer


def only(exporter: InMemorySpanExporter, name: str) -> ReadableSpan:
    (span,) = [s for s in exporter.get_finished_spans() if s.name == name]
    return span


def test_the_consumer_span_continues_the_producers_trace_and_holds_the_handlers_spans(
    memory: MemorySQS, clock: FakeClock, spans: Any, traced: Any
) -> None:
    provider, exporter = spans
    seen: dict[str, Any] = {}

    def charge(message: Message) -> None:
        with provider.get_tracer("app").start_as_current_span("charge card"):
            seen.update(tracing.log_fields(None, "info", {}))

    rig = Rig(memory, clock, charge, tracer=provider.get_tracer("sqsworker"))
    with tracing.producing("jobs", 1):
        send_all(rig.queue, [tracing.injected(OutgoingMessage('{"order": 1}'))])
    rig.worker.start()
    rig.wait_for("deleted", 1)
    assert rig.stop() == 0

    send = only(exporter, "send jobs")
    process = only(exporter, "process jobs")
    child = only(exporter, "charge card")
    assert send.kind is SpanKind.PRODUCER and process.kind is SpanKind.CONSUMER
    assert process.context.trace_id == send.context.trace_id
    assert process.parent is not None and process.parent.span_id == send.context.span_id
    assert child.parent is not None and child.parent.span_id == process.context.span_id
    assert process.attributes is not None
    assert process.attributes["messaging.system"] == "aws_sqs"
    assert process.attributes["messaging.destination.name"] == "jobs"
    assert process.attributes["messaging.operation.type"] == "process"
    assert process.attributes["messaging.aws_sqs.receive_count"] == 1
    assert process.attributes["sqsworker.outcome"] == "succeeded"
    # The handler's log lines carry the ids of the span current where they are logged.
    assert seen["trace_id"] == format(send.context.trace_id, "032x")
    assert seen["span_id"] == format(child.context.span_id, "016x")


def test_a_batch_has_one_span_linked_to_each_producer_holding_the_handlers_spans(
    memory: MemorySQS, clock: FakeClock, spans: Any, traced: Any
) -> None:
    provider, exporter = spans

    def ingest(messages: list[Message]) -> BatchResult:
        with provider.get_tracer("app").start_as_current_span("insert rows"):
            return BatchResult([m for m in messages if m.body == "bad"])

    rig = Rig(
        memory,
        clock,
        sqsworker.batch_handler()(ingest),
        tracer=provider.get_tracer("sqsworker"),
        batch_size=10,
        batch_window=5.0,
        concurrency=1,
    )
    sent = []
    for body in ("good", "bad"):
        with tracing.producing("jobs", 1):
            sent.append(trace.get_current_span().get_span_context())
            send_all(rig.queue, [tracing.injected(OutgoingMessage(body))])
    rig.worker.start()
    rig.advance_until(lambda: rig.count("deleted") == 1 and rig.count("failed") == 1)
    assert rig.stop() == 0

    process = only(exporter, "process jobs")
    assert process.kind is SpanKind.CONSUMER and process.parent is None
    assert process.attributes is not None
    assert process.attributes["messaging.batch.message_count"] == 2
    linked = {(link.context.trace_id, link.context.span_id) for link in process.links}
    assert linked == {(s.trace_id, s.span_id) for s in sent}  # a link to each producer
    child = only(exporter, "insert rows")
    assert child.parent is not None and child.parent.span_id == process.context.span_id
    # Each message's outcome is an event naming it, each success too.
    failed = [e for e in process.events if e.name == "failed"]
    assert len(failed) == 1 and failed[0].attributes is not None
    (bad,) = [link for link in process.links if link.context.span_id == sent[1].span_id]
    assert bad.attributes is not None
    assert failed[0].attributes["messaging.message.id"] == bad.attributes["messaging.message.id"]


def test_failures_retries_and_rejections_are_recorded_on_the_span(
    memory: MemorySQS, clock: FakeClock, spans: Any
) -> None:
    provider, exporter = spans

    def handler(message: Message) -> None:
        if message.body == "poison":
            raise Reject("cannot parse the order")
        raise RuntimeError("the card service is down")

    rig = Rig(memory, clock, handler, tracer=provider.get_tracer("sqsworker"))
    rig.send("flaky", "poison")
    rig.worker.start()
    rig.wait_for("failed", 1)
    rig.wait_for("rejected", 1)
    assert rig.stop() == 0
    by_outcome = {
        s.attributes["sqsworker.outcome"]: s
        for s in exporter.get_finished_spans()
        if s.attributes is not None
    }
    failed, rejected = by_outcome["failed"], by_outcome["rejected"]
    assert failed.status.status_code is StatusCode.ERROR
    assert "the card service is down" in str(failed.status.description)
    assert [e.name for e in failed.events] == ["exception", "failed"]
    assert failed.events[1].attributes is not None
    assert failed.events[1].attributes["retry_in"] > 0
    assert rejected.status.status_code is StatusCode.ERROR
    assert rejected.events[1].attributes == {"dead_letter_queue": "jobs-dlq"}


def test_an_x_ray_header_parents_the_span_when_there_is_no_traceparent() -> None:
    header = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
    message = Message(Envelope("m-1", "rh", "{}", {"AWSTraceHeader": header}))
    parent = trace.get_current_span(tracing.parent_context(message)).get_span_context()
    assert format(parent.trace_id, "032x") == "5759e988bd862e3fe1be46a994272793"
    assert format(parent.span_id, "016x") == "53995c3f42cd8ad8"
    # With both, the W3C attribute wins.
    w3c = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    both = Message(
        Envelope(
            "m-2",
            "rh",
            "{}",
            {"AWSTraceHeader": header},
            {"traceparent": {"DataType": "String", "StringValue": w3c}},
        )
    )
    parent = trace.get_current_span(tracing.parent_context(both)).get_span_context()
    assert format(parent.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"
    # Neither, or garbage: no parent, a new trace.
    assert tracing.parent_context(Message(Envelope("m-3", "rh", "{}"))) is None
    junk = {"traceparent": {"DataType": "String", "StringValue": "not a traceparent"}}
    assert tracing.parent_context(Message(Envelope("m-4", "rh", "{}", {}, junk))) is None


def test_inject_adds_the_context_only_where_sqs_has_room(traced: Any) -> None:
    def attributes(n: int) -> dict[str, Any]:
        return {f"a{i}": {"DataType": "String", "StringValue": "v"} for i in range(n)}

    assert tracing.inject(attributes(3)) == attributes(3)  # no span current: nothing
    with traced.start_as_current_span("send orders"):
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        with_context = tracing.inject(attributes(9))
        assert with_context["traceparent"]["StringValue"] == carrier["traceparent"]
        assert len(with_context) == 10
        assert tracing.inject(attributes(10)) == attributes(10)  # full: sent untraced


def test_without_a_tracer_the_worker_records_nothing_and_logs_carry_no_ids(
    memory: MemorySQS, clock: FakeClock
) -> None:
    seen: dict[str, Any] = {}
    rig = Rig(memory, clock, lambda m: seen.update(tracing.log_fields(None, "info", {})))
    assert rig.worker.tracer is None  # no OTEL_* variables in the test's environment
    rig.send("one")
    rig.worker.start()
    rig.wait_for("deleted", 1)
    assert rig.stop() == 0
    assert seen == {}


def test_a_retry_the_handler_asks_for_is_an_event_not_an_error(
    memory: MemorySQS, clock: FakeClock, spans: Any
) -> None:
    from sqsworker import Retry

    provider, exporter = spans

    def later(message: Message) -> None:
        raise Retry(30, "the warehouse is closed")

    rig = Rig(memory, clock, later, tracer=provider.get_tracer("sqsworker"))
    rig.send("order")
    rig.worker.start()
    rig.wait_for("retry_requested", 1)
    assert rig.stop() == 0
    (span,) = exporter.get_finished_spans()
    assert span.attributes is not None
    assert span.attributes["sqsworker.outcome"] == "retry requested"
    assert span.status.status_code is StatusCode.UNSET
    assert [e.name for e in span.events] == ["retry requested"]
    assert span.events[0].attributes == {"retry_in": 30, "reason": "the warehouse is closed"}


def test_without_otel_variables_tracing_imports_nothing() -> None:
    import subprocess
    import sys

    probe = (
        "import sys; from sqsworker import tracing; "
        "assert tracing.tracer() is None; print('opentelemetry' in sys.modules)"
    )
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert done.stdout.strip() == "False", done.stderr
