"""A small fault-injecting proxy between workers and moto's server.

It forwards each HTTP request to the upstream endpoint and, as the test sets it,
adds latency, stalls a share of requests, resets a share of connections (after
the upstream acted, so the answer is lost, the hardest case), or answers a share
with SQS's throttling (400 ThrottlingException) or 503 ServiceUnavailable
instead of forwarding. Faults are drawn from a seeded random generator and
counted, so a test can say what it injected. A ``watch`` callback sees every
request forwarded and its answer (the rollout test reads deliveries from it).
"""

from __future__ import annotations

import http.client
import json
import random
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit


@dataclass
class Faults:
    latency: float = 0.0  # seconds added to every request
    stall: float = 0.0  # share of requests held for stall_seconds before forwarding
    stall_seconds: float = 3.0
    reset: float = 0.0  # share of connections reset after the upstream answered
    throttle: float = 0.0  # share answered 400 ThrottlingException, not forwarded
    unavailable: float = 0.0  # share answered 503 ServiceUnavailable, not forwarded
    bad_gateway: float = 0.0  # share answered 502 with a load balancer's HTML page
    garbled: float = 0.0  # share answered 200 with an HTML page (a captive portal), not forwarded
    empty: float = 0.0  # share answered 200 with ``{}``, not forwarded: an answer naming nothing
    # Batch calls: forwarded, and the upstream's answer made odd (``_oddly``): its first
    # successful entry named twice and failed too, entries of ids the call has not; and
    # ``malformed``, entries in no shape SQS gives (no object; an Id that is no text).
    odd: bool = False
    malformed: bool = False
    # share answered 400 as SQS refuses a queue it does not know: the JSON error's
    # __type and the query protocol's code in the x-amzn-query-error header (which wins)
    query_error: float = 0.0
    # SendMessageBatch: a share of entries kept from the upstream and answered Failed with
    # InternalError (a passing fault: sent again, they go), and entries whose body holds
    # ``refuse`` answered Failed with InvalidMessageContents (the sender's fault: never go).
    fail_entries: float = 0.0
    refuse: str | None = None


# (the request's X-Amz-Target, its body, the answer's status, the answer's body)
Watch = Callable[[str, bytes, int, bytes], None]


class FaultProxy:
    def __init__(self, upstream: str, seed: int = 1, watch: Watch | None = None) -> None:
        parts = urlsplit(upstream)
        self.watch = watch
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.faults = Faults()
        self.injected: Counter[str] = Counter()
        self.forwarded = 0
        self.connections = 0  # accepted from clients: a client's pool reuses its own
        self.access_keys: Counter[str] = (
            Counter()
        )  # requests by the access key they were signed with
        self._random = random.Random(seed)
        self._lock = threading.Lock()  # guards faults, injected, forwarded and _random
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                with proxy._lock:
                    proxy.connections += 1

            def do_POST(self) -> None:
                proxy._handle(self)

            do_GET = do_POST

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.stopping = True
        self._server.shutdown()
        self._server.server_close()

    def set(self, **faults: Any) -> None:
        with self._lock:
            self.faults = Faults(**faults)

    def _draw(self) -> tuple[Faults, float]:
        with self._lock:
            return self.faults, self._random.random()

    def _count(self, fault: str) -> None:
        with self._lock:
            self.injected[fault] += 1

    def _handle(self, request: BaseHTTPRequestHandler) -> None:
        length = int(request.headers.get("Content-Length", 0))
        body = request.rfile.read(length) if length else b""
        faults, draw = self._draw()
        signed = request.headers.get("Authorization", "")
        if "Credential=" in signed:
            with self._lock:
                self.access_keys[signed.split("Credential=", 1)[1].split("/", 1)[0]] += 1
        if faults.latency:
            time.sleep(faults.latency)
        fault = _pick(faults, draw)
        if fault == "throttle":
            self._count(fault)
            return _answer(request, 400, "ThrottlingException", "Rate exceeded")
        if fault == "unavailable":
            self._count(fault)
            return _answer(request, 503, "ServiceUnavailable", "Service is unavailable")
        if fault == "query_error":
            self._count(fault)
            query = "AWS.SimpleQueueService.NonExistentQueue;Sender"
            return _answer(request, 400, "QueueDoesNotExist", "No such queue", query)
        if fault in ("bad_gateway", "garbled"):
            self._count(fault)
            page = b"<html><body><h1>502 Bad Gateway</h1></body></html>"
            request.send_response_only(502 if fault == "bad_gateway" else 200)
            request.send_header("Content-Type", "text/html")
            request.send_header("Content-Length", str(len(page)))
            request.end_headers()
            request.wfile.write(page)
            return None
        if fault == "empty":
            self._count(fault)
            request.send_response_only(200)
            request.send_header("Content-Type", "application/x-amz-json-1.0")
            request.send_header("Content-Length", "2")
            request.end_headers()
            request.wfile.write(b"{}")
            return None
        if fault == "stall":
            self._count(fault)
            time.sleep(faults.stall_seconds)
        failed: list[dict[str, Any]] = []
        if request.headers.get("X-Amz-Target", "").endswith(".SendMessageBatch") and (
            faults.fail_entries or faults.refuse
        ):
            body, failed = self._fail_entries(body, faults)
        if failed and not json.loads(body)["Entries"]:  # nothing left to forward
            status, headers, answer = 200, [("Content-Type", "application/x-amz-json-1.0")], b"{}"
        else:
            status, headers, answer = self._forward(request, body)
        if failed and status == 200:
            answer = _add_failed(answer, failed)
        batch = "Batch" in request.headers.get("X-Amz-Target", "")
        if (faults.odd or faults.malformed) and status == 200 and batch:
            self._count("malformed" if faults.malformed else "odd")
            answer = _oddly(answer, faults.malformed)
        if self.watch is not None:
            self.watch(request.headers.get("X-Amz-Target", ""), body, status, answer)
        if fault == "reset":  # the upstream acted; its answer never arrives
            self._count(fault)
            linger = struct.pack("ii", 1, 0)
            request.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
            request.close_connection = True
            request.connection.close()
            return
        request.send_response_only(status)
        for name, value in headers:
            if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                request.send_header(name, value)
        request.send_header("Content-Length", str(len(answer)))
        request.end_headers()
        request.wfile.write(answer)

    def _fail_entries(self, body: bytes, faults: Faults) -> tuple[bytes, list[dict[str, Any]]]:
        """The request without the entries chosen to fail, and their Failed answers."""
        request = json.loads(body)
        kept, failed = [], []
        for entry in request.get("Entries", []):
            if faults.refuse is not None and faults.refuse in entry.get("MessageBody", ""):
                self._count("refused entry")
                failed.append(
                    {
                        "Id": entry["Id"],
                        "SenderFault": True,
                        "Code": "InvalidMessageContents",
                        "Message": "the message contains characters outside the allowed set",
                    }
                )
            elif self._draw()[1] < faults.fail_entries:
                self._count("failed entry")
                failed.append(
                    {
                        "Id": entry["Id"],
                        "SenderFault": False,
                        "Code": "InternalError",
                        "Message": "we encountered an internal error, please try again",
                    }
                )
            else:
                kept.append(entry)
        request["Entries"] = kept
        return json.dumps(request).encode(), failed

    def _forward(
        self, request: BaseHTTPRequestHandler, body: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        connection = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            headers = {
                k: v
                for k, v in request.headers.items()
                if k.lower() not in ("connection", "content-length")
            }
            headers["Content-Length"] = str(len(body))  # the body may have lost entries
            connection.request(request.command, request.path, body, headers)
            response = connection.getresponse()
            answer = response.read()
            with self._lock:
                self.forwarded += 1
            return response.status, response.getheaders(), answer
        finally:
            connection.close()


class _Server(ThreadingHTTPServer):
    stopping = False
    # As a real endpoint's: a burst of new connections is accepted, not dropped for the
    # client to send its SYN again a second later (the default backlog is 5).
    request_queue_size = 128

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not self.stopping:  # a request cut off by the upstream or the proxy going away
            super().handle_error(request, client_address)


def _add_failed(answer: bytes, failed: list[dict[str, Any]]) -> bytes:
    result = json.loads(answer)
    result["Failed"] = [*result.get("Failed", []), *failed]
    return json.dumps(result).encode()


def _oddly(answer: bytes, malformed: bool) -> bytes:
    """A batch answer no endpoint should give, built on a real one."""
    result = json.loads(answer)
    successful = result.setdefault("Successful", [])
    if malformed:
        successful += ["not an entry", {"Id": ["0"]}]
    elif successful:
        first = successful[0]
        successful.append(dict(first))  # named twice
        failed = {"Id": first["Id"], "Code": "InternalError", "SenderFault": False}
        result.setdefault("Failed", []).append(failed)  # and failed too
    successful.append({"Id": "99", "MessageId": "m-99"})
    result.setdefault("Failed", []).append({"Id": "98", "Code": "InternalError"})
    return json.dumps(result).encode()


def _answer(
    request: BaseHTTPRequestHandler, status: int, code: str, text: str, query: str = ""
) -> None:
    body = f'{{"__type": "com.amazonaws.sqs#{code}", "message": "{text}"}}'.encode()
    request.send_response_only(status)
    request.send_header("Content-Type", "application/x-amz-json-1.0")
    if query:
        request.send_header("x-amzn-query-error", query)
    request.send_header("Content-Length", str(len(body)))
    request.end_headers()
    request.wfile.write(body)


def _pick(faults: Faults, draw: float) -> str:
    """The fault a draw in [0, 1) lands on, each taking its share of the interval."""
    edge = 0.0
    for fault in (
        "throttle",
        "unavailable",
        "stall",
        "reset",
        "bad_gateway",
        "garbled",
        "empty",
        "query_error",
    ):
        edge += getattr(faults, fault)
        if draw < edge:
            return fault
    return ""
