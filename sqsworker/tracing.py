"""Traces across the queue: OpenTelemetry, with the ``sqsworker[otel]`` extra.

Configured only by OpenTelemetry's own environment variables. Tracing is on when the
extra is installed and either the program set a tracer provider of the SDK itself
(``opentelemetry-instrument`` does) or ``OTEL_TRACES_EXPORTER`` or an OTLP endpoint
(``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set; then
``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``,
``OTEL_PROPAGATORS`` and the exporters' own variables apply as the SDK reads them.
``OTEL_SDK_DISABLED=true`` turns it off. Off, or without the extra, nothing here runs
but one ``None`` check a message.

The worker: one consumer span a message, ``process <queue>``, from the fetch of an
offloaded body to the handler's outcome, following OpenTelemetry's messaging semantic
conventions; its parent is the producer's context, from the ``traceparent`` message
attribute (W3C), else the ``AWSTraceHeader`` system attribute (X-Ray). The handler's
own spans nest under it, and its log lines carry ``trace_id`` and ``span_id``.

Producers (``sqsworker send``, the Spark sink, ``inject`` for your own) add
``traceparent`` (and ``tracestate``) to a message's attributes. SQS takes 10
attributes: a message that has no room for them is sent without, untraced.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .message import Message
    from .transports import OutgoingMessage

SYSTEM = "aws_sqs"
MAX_ATTRIBUTES = 10  # SQS's limit of message attributes per message
TRACE_ATTRIBUTES = ("traceparent", "tracestate")
_log = logging.getLogger("sqsworker.tracing")
_tracer: Any = None
_configured = False


def tracer() -> Any:
    """The process's tracer, set up from the environment on first call; None when off."""
    global _tracer, _configured
    if not _configured:
        _configured = True
        _tracer = _from_environment()
    return _tracer


def _from_environment() -> Any:
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    wanted = any(
        os.environ.get(name)
        for name in (
            "OTEL_TRACES_EXPORTER",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        )
    )
    if not wanted and "opentelemetry.trace" not in sys.modules:
        return None  # nothing asked for it, and no provider can have been set: no import
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
    except ImportError:
        return None
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        if not wanted:
            return None
        provider = _provider()
        if provider is None:
            return None
        trace.set_tracer_provider(provider)
    from .version import __version__

    return provider.get_tracer("sqsworker", __version__)


def _provider() -> Any:
    """A tracer provider of the SDK with the exporters OTEL_TRACES_EXPORTER names."""
    from importlib.metadata import entry_points

    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    names = [
        n.strip() for n in os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",") if n.strip()
    ]
    if names == ["none"]:
        return None
    provider = TracerProvider(resource=Resource.create())  # reads OTEL_SERVICE_NAME, ...
    found = {e.name: e for e in entry_points(group="opentelemetry_traces_exporter")}
    for name in names:
        if name == "otlp":  # the protocol picks the exporter, as the SDK's own setup does
            protocol = os.environ.get(
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
                os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            )
            name = "otlp_proto_grpc" if protocol == "grpc" else "otlp_proto_http"
        if name not in found:
            _log.warning(
                "OTEL_TRACES_EXPORTER names %r, which is not installed (installed: %s): "
                "its spans are not exported",
                name,
                ", ".join(sorted(found)) or "none",
            )
            continue
        provider.add_span_processor(BatchSpanProcessor(found[name].load()()))
    return provider


def flush() -> None:
    """Export the spans buffered so far."""
    if _tracer is None:
        return
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    if hasattr(provider, "force_flush"):
        provider.force_flush()


def shutdown() -> None:
    """Export the spans still buffered (the process is about to end)."""
    if _tracer is None:
        return
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    if hasattr(provider, "shutdown"):
        provider.shutdown()


# -- the consumer side -----------------------------------------------------------------


def parent_context(message: Message) -> Any:
    """The producer's context: the W3C ``traceparent`` attribute, else X-Ray's header."""
    from opentelemetry import propagate, trace

    carrier = {
        name: str(value["StringValue"])
        for name in TRACE_ATTRIBUTES
        if (value := message.raw_message_attributes.get(name)) and "StringValue" in value
    }
    if carrier:
        context = propagate.extract(carrier)
        if trace.get_current_span(context).get_span_context().is_valid:
            return context
    header = message.trace_header
    if header:
        from opentelemetry.propagators.aws import AwsXRayPropagator

        context = AwsXRayPropagator().extract({"X-Amzn-Trace-Id": header})
        if trace.get_current_span(context).get_span_context().is_valid:
            return context
    return None


def consuming(tracer: Any, message: Message) -> Any:
    """The consumer span of ``message`` as the current span, while inside; a context that
    does nothing when ``tracer`` is None."""
    if tracer is None:
        return nullcontext()
    return _consuming(tracer, message)


@contextmanager
def _consuming(tracer: Any, message: Message) -> Iterator[Any]:
    from opentelemetry.trace import SpanKind

    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": message.queue,
        "messaging.message.id": message.message_id,
        "messaging.aws_sqs.receive_count": message.receive_count,
    }
    if message.group_id is not None:
        attributes["messaging.aws_sqs.message_group_id"] = message.group_id
    with tracer.start_as_current_span(
        f"process {message.queue}",
        context=parent_context(message),
        kind=SpanKind.CONSUMER,
        attributes=attributes,
        record_exception=False,  # the outcome is recorded by the worker, once
        set_status_on_exception=False,
    ) as span:
        yield span
        if message.lease.lost:
            span.add_event("lease lost", {"messaging.message.id": message.message_id})


def consuming_batch(tracer: Any, messages: Sequence[Message]) -> Any:
    """A batch's one consumer span, as the current span while inside: linked to each
    message's producer context, as OpenTelemetry's messaging conventions have it for
    batches; a context that does nothing when ``tracer`` is None."""
    if tracer is None:
        return nullcontext()
    return _consuming_batch(tracer, messages)


@contextmanager
def _consuming_batch(tracer: Any, messages: Sequence[Message]) -> Iterator[Any]:
    from opentelemetry import trace
    from opentelemetry.trace import Link, SpanKind

    links = []
    for message in messages:
        context = parent_context(message)
        if context is not None:
            span_context = trace.get_current_span(context).get_span_context()
            links.append(Link(span_context, {"messaging.message.id": message.message_id}))
    queue = messages[0].queue if messages else ""
    with tracer.start_as_current_span(
        f"process {queue}",
        context=None,
        kind=SpanKind.CONSUMER,
        links=links,
        attributes={
            "messaging.system": SYSTEM,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": queue,
            "messaging.batch.message_count": len(messages),
        },
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield span


def record(outcome: str, error: BaseException | None = None, **attributes: Any) -> None:
    """The message's outcome on the current consumer span (nothing when none records)."""
    from opentelemetry import trace
    from opentelemetry.trace import Status, StatusCode

    span = trace.get_current_span()
    if not span.is_recording():
        return
    span.set_attribute("sqsworker.outcome", outcome)
    if error is not None:
        span.record_exception(error, attributes=attributes or None)
        span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"[:200]))
    if attributes:
        span.add_event(outcome, attributes)


def log_fields(_logger: Any, _name: str, event: dict[str, Any]) -> dict[str, Any]:
    """A structlog processor: ``trace_id`` and ``span_id`` of the current span, if any."""
    if _tracer is None:
        return event
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    if context.is_valid:
        event.setdefault("trace_id", format(context.trace_id, "032x"))
        event.setdefault("span_id", format(context.span_id, "016x"))
    return event


# -- the producer side -----------------------------------------------------------------


def inject(attributes: Mapping[str, Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """``attributes`` with the current trace context added as message attributes
    (``traceparent``, and ``tracestate`` when there is one); as they are when no span is
    current, or when SQS's 10 attributes leave no room (the message goes untraced)."""
    result = dict(attributes)
    if tracer() is None:
        return result
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    added = {k: v for k, v in carrier.items() if k in TRACE_ATTRIBUTES and k not in result}
    if not added or len(result) + len(added) > MAX_ATTRIBUTES:
        return result
    for name, value in added.items():
        result[name] = {"DataType": "String", "StringValue": value}
    return result


def injected(message: OutgoingMessage) -> OutgoingMessage:
    """``message`` carrying the current trace context (see ``inject``)."""
    from dataclasses import replace

    attributes = inject(message.message_attributes)
    if len(attributes) == len(message.message_attributes):
        return message
    return replace(message, message_attributes=attributes)


@contextmanager
def producing(queue: str, count: int) -> Iterator[None]:
    """A producer span, ``send <queue>``, current while inside (nothing when off)."""
    current = tracer()
    if current is None:
        yield
        return
    from opentelemetry.trace import SpanKind

    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": queue,
    }
    if count > 1:
        attributes["messaging.batch.message_count"] = count
    with current.start_as_current_span(
        f"send {queue}", kind=SpanKind.PRODUCER, attributes=attributes
    ):
        yield
