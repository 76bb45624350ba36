"""One small HTTP server for Prometheus and Kubernetes: /metrics, /healthz, /readyz.

- ``/metrics``: the worker's ``Metrics`` registry, in Prometheus' text format.
- ``/healthz`` (liveness): 200 while the receive thread and the lease thread make
  progress; 503 when either is stuck or gone. It stays 200 during a graceful
  shutdown, so Kubernetes does not kill a worker that is finishing its messages.
- ``/readyz`` (readiness): 200 once the worker started (the queue was reachable);
  503 before that and from the moment it begins shutting down.

Each answer of the health endpoints is a small JSON document saying why.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from .health import Health, ProcessHealth

StartResponse = Callable[..., Any]


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Probes every few seconds would drown the worker's own lines."""


class TelemetryServer:
    def __init__(
        self,
        registry: CollectorRegistry,
        health: Callable[[], Health | ProcessHealth],
        host: str = "0.0.0.0",
        port: int = 9000,
    ) -> None:
        self._metrics = make_wsgi_app(registry)
        self._health = health
        self._server = make_server(
            host, port, self._app, server_class=_Server, handler_class=_QuietHandler
        )
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="sqsworker-telemetry", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> TelemetryServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def _app(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path in ("/healthz", "/readyz"):
            health = self._health()
            ok = health.live if path == "/healthz" else health.ready
            body = json.dumps(health.as_dict()).encode()
            status = "200 OK" if ok else "503 Service Unavailable"
            start_response(status, [("Content-Type", "application/json")])
            return [body]
        if path == "/metrics":
            return self._metrics(environ, start_response)  # type: ignore[no-any-return]
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"try /metrics, /healthz or /readyz\n"]
