"""One trace across the queue: `sqsworker send` and a real `sqsworker run`, each in its
own process with only OTEL_* variables set, export over OTLP (HTTP) to a collector
this test runs; the worker's consumer span continues the producer's trace."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from sqsworker.local import LocalSQS

from ..conftest import unique, wait_until
from .conftest import BIN
from .scenario import ROOT, command

pytestmark = pytest.mark.integration


class Collector:
    """An OTLP/HTTP trace endpoint: every span posted to /v1/traces, by name."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        collector = self

        class Receive(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                request = ExportTraceServiceRequest()
                request.ParseFromString(self.rfile.read(int(self.headers["Content-Length"])))
                for resource in request.resource_spans:
                    service = next(
                        a.value.string_value
                        for a in resource.resource.attributes
                        if a.key == "service.name"
                    )
                    for scope in resource.scope_spans:
                        for span in scope.spans:
                            collector.spans.append(
                                {
                                    "service": service,
                                    "name": span.name,
                                    "trace_id": span.trace_id.hex(),
                                    "span_id": span.span_id.hex(),
                                    "parent_id": span.parent_span_id.hex(),
                                    "attributes": {
                                        a.key: a.value.string_value or a.value.int_value
                                        for a in span.attributes
                                    },
                                }
                            )
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Receive)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"

    def named(self, name: str) -> dict[str, Any]:
        (span,) = [s for s in self.spans if s["name"] == name]
        return span


@pytest.fixture
def collector() -> Iterator[Collector]:
    made = Collector()
    yield made
    made.server.shutdown()
    made.server.server_close()


def otel_env(local_sqs: LocalSQS, collector: Collector, service: str) -> dict[str, str]:
    return {
        **os.environ,
        **local_sqs.env(),
        "OTEL_SERVICE_NAME": service,
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": collector.endpoint,
    }


def test_a_trace_runs_from_sqsworker_send_through_a_real_worker(
    local_sqs: LocalSQS, collector: Collector
) -> None:
    queue = unique("orders")
    local_sqs.create_queue(queue)
    sent = subprocess.run(
        [str(BIN / "sqsworker"), "send", queue, json.dumps({"order": 7})],
        env=otel_env(local_sqs, collector, "checkout"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert sent.returncode == 0, sent.stderr
    worker = subprocess.run(
        command(queue, "--burst", "--metrics-port", "off", "--wait-time", "1", handler="traced"),
        env={**otel_env(local_sqs, collector, "orders-worker"), "SQSWORKER_LOG_FORMAT": "json"},
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert worker.returncode == 0, worker.stderr
    wait_until(lambda: len(collector.spans) >= 3, what="three spans exported")

    send = collector.named(f"send {queue}")
    process = collector.named(f"process {queue}")
    charge = collector.named("charge card")
    assert (send["service"], process["service"]) == ("checkout", "orders-worker")
    assert send["trace_id"] == process["trace_id"] == charge["trace_id"]
    assert process["parent_id"] == send["span_id"]
    assert charge["parent_id"] == process["span_id"]
    assert process["attributes"]["messaging.system"] == "aws_sqs"
    assert process["attributes"]["messaging.destination.name"] == queue
    assert process["attributes"]["sqsworker.outcome"] == "succeeded"
    # The handler's log line carries the trace.
    line = next(json.loads(raw) for raw in worker.stderr.splitlines() if "charging the card" in raw)
    assert (line["trace_id"], line["span_id"]) == (charge["trace_id"], charge["span_id"])
