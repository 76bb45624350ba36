"""A review of the lean client's connections without a socket timeout (transports/wire.py,
``Deadlines``): every request ends by its read timeout, a connection that timed out or
holds what no request asked for is not used again, and a fault is the exception it was."""

from __future__ import annotations

import json
import select
import shutil
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, BinaryIO

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError, HTTPClientError, ReadTimeoutError

from sqsworker.transports import wire as wire_module
from sqsworker.transports.lean import LeanSQS
from sqsworker.transports.sqs import translate
from sqsworker.transports.wire import tls_context

from .test_wire import (
    HEAD,
    STALL,
    Make,
    Scripted,
    _certificate,
    _serving,
    endpoint,
    local_wire,
    needs_openssl,
    ok,
)

__all__ = ["endpoint"]  # the fixture, used by name

WAIT = 3.0  # seconds a request that should end at a read timeout of 0.3 s is given


def _request(reader: BinaryIO) -> bytes | None:
    """The next request on a connection, or None at its end."""
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        line = reader.readline()
        if not line:
            return None
        head += line
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    return head + reader.read(length)


Script = Callable[["Endpoint", socket.socket, BinaryIO], None]


class Endpoint(Scripted):
    """An endpoint on 127.0.0.1 that runs ``script`` on each connection it accepts (plain,
    or TLS with ``tls``); ``go`` and ``sent`` are for the script and the test to share."""

    def __init__(self, script: Script, tls: ssl.SSLContext | None = None) -> None:
        self.script = script
        self.sent = threading.Event()
        super().__init__([], tls)

    @property
    def released(self) -> threading.Event:
        return self._released

    def _one(self, conn: socket.socket) -> None:
        try:
            if self.tls is not None:
                conn = self.tls.wrap_socket(conn, server_side=True)
            with conn, conn.makefile("rb") as reader:
                self.script(self, conn, reader)
        except OSError:
            pass


@pytest.fixture
def serve() -> Iterator[Callable[..., Endpoint]]:
    made: list[Endpoint] = []

    def make(script: Script, tls: ssl.SSLContext | None = None) -> Endpoint:
        made.append(Endpoint(script, tls))
        return made[-1]

    yield make
    for server in made:
        server.close()


@pytest.fixture(params=["plain", "tls"])
def tls(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Any, Any]:
    """(the endpoint's TLS context, the client's), or (None, None) for plain HTTP."""
    if request.param == "plain":
        return None, None
    if shutil.which("openssl") is None:
        pytest.skip("needs openssl")
    cert, key = _certificate(tmp_path, "endpoint", "IP:127.0.0.1")
    return _serving(cert, key), tls_context(cert, None, None)


def _in_thread(call: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """``call`` in a daemon thread; what it returned or raised lands in the list."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


# --- an answer whose body ends with the connection, cut by the deadline -------------------


def _head_then_stall(head: bytes) -> Script:
    def script(ep: Endpoint, conn: socket.socket, reader: BinaryIO) -> None:
        if _request(reader) is None:
            return
        conn.sendall(head)
        ep.released.wait(30)

    return script


def test_a_body_ending_with_the_connection_cut_by_the_deadline_is_a_timeout_not_an_answer(
    serve: Callable[..., Endpoint], tls: tuple[Any, Any]
) -> None:
    """An answer without Content-Length (its body ends where the connection does) that
    stalls mid-body: the deadline's shutdown makes the next recv return b"", which is not
    the body's end but a ReadTimeoutError (after 5064d99 the cut body came back as a whole
    200 answer)."""
    head = b'HTTP/1.1 200 OK\r\nContent-Type: application/x-amz-json-1.0\r\n\r\n{"Messages": [{"'
    assert_cut_is_a_timeout(serve, tls, head)


def assert_cut_is_a_timeout(
    serve: Callable[..., Endpoint], tls: tuple[Any, Any], head: bytes
) -> None:
    """An endpoint that writes ``head`` and stalls: the request ends at its read timeout
    as a ReadTimeoutError, not as an answer, and its connection is not kept."""
    server_tls, client_tls = tls
    server = serve(_head_then_stall(head), server_tls)
    wire = server.wire(read_timeout=0.3, context=client_tls)
    thread, outcome = _in_thread(lambda: wire.post(HEAD, b"{}"))
    thread.join(WAIT)
    assert outcome, "the request did not end"
    [got] = outcome
    shown = got if isinstance(got, BaseException) else (got.status, got.body)  # type: ignore[attr-defined]
    assert isinstance(got, ReadTimeoutError), f"a cut answer was returned whole: {shown!r}"
    assert wire._idle == []


class _CutError(BaseHTTPRequestHandler):
    """botocore's first call is answered whole; the next gets a throttling error whose body
    ends with the connection, cut halfway and held."""

    released = threading.Event()
    calls = 0

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        type(self).calls += 1
        if type(self).calls == 1:
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")
            return
        self.wfile.write(
            b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n"
            b'{"__type": "com.amazonaws.sqs#ThrottlingException", "message": "Rate exc'
        )
        self.wfile.flush()
        self.released.wait(30)
        self.close_connection = True


def test_a_cut_error_answer_is_a_retryable_timeout_not_a_refusal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Through the lean client: the cut body of a 400 is a retryable ReadTimeoutError, not
    an error parsed from half a body (after 5064d99 it became ClientError '400', which
    ``translate`` makes a refusal that is not retried)."""
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(_CutError, "calls", 0)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _CutError)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        session = boto3.session.Session()
        client = session.client(
            "sqs",
            endpoint_url=endpoint,
            config=Config(read_timeout=0.3, connect_timeout=1, retries={"total_max_attempts": 1}),
        )
        lean = LeanSQS(client, session.get_credentials())
        client.receive_message(QueueUrl=f"{endpoint}/000000000000/q")  # the lean client learns
        assert lean.ready and lean.wire is not None
        thread, outcome = _in_thread(
            lambda: lean.call("ReceiveMessage", {"QueueUrl": f"{endpoint}/000000000000/q"})
        )
        thread.join(WAIT)
        assert outcome, "the request did not end"
        [got] = outcome
        assert isinstance(got, Exception)
        error = translate(got, "ReceiveMessage")
        assert isinstance(got, ReadTimeoutError) and error.retryable, (  # type: ignore[attr-defined]
            f"{type(got).__name__} {got}: {error!r} retryable={error.retryable}"  # type: ignore[attr-defined]
        )
        assert not isinstance(got, ClientError)
    finally:
        _CutError.released.set()
        server.shutdown()
        server.server_close()
        _CutError.released.clear()


# --- what an idle connection received, read as the next request's answer -------------------


def _stale_while_idle(ep: Endpoint, conn: socket.socket, reader: BinaryIO) -> None:
    """Answers the first request, then, once told to, sends an answer no request asked for
    (and keeps the connection open); every later request is answered "fresh"."""
    if _request(reader) is None:
        return
    conn.sendall(ok(b'{"first": 1}'))
    if not ep.go.wait(30):
        return
    conn.sendall(ok(b'{"stale": 1}'))
    ep.sent.set()
    while _request(reader) is not None:
        conn.sendall(ok(b'{"fresh": 1}'))


def test_what_an_idle_connection_received_is_not_read_as_the_next_answer(
    serve: Callable[..., Endpoint], tls: tuple[Any, Any]
) -> None:
    """Bytes that reach an idle connection after its answer (a second answer to one
    request, a body longer than its Content-Length sent in another segment) leave its TCP
    state ESTABLISHED; idle under IDLE_CHECK, TCP_INFO's count of bytes received finds
    them, and the connection is dropped, not read by the next request (as 5064d99, which
    looked at the state alone, let it be)."""
    server_tls, client_tls = tls
    server = serve(_stale_while_idle, server_tls)
    wire = server.wire(read_timeout=5.0, context=client_tls)
    assert wire.post(HEAD, b"{}").body == b'{"first": 1}'
    server.go.set()
    assert server.sent.wait(WAIT)
    [idle] = wire._idle
    assert select.select([idle._sock], [], [], WAIT)[0]  # the stale answer has arrived
    # not the stale answer: the idle connection is dropped, and a new one answers first
    assert wire.post(HEAD, b"{}").body == b'{"first": 1}'
    assert wire.opened == 2


# --- the deadline thread --------------------------------------------------------------------


@pytest.fixture
def deadlines(monkeypatch: pytest.MonkeyPatch) -> Iterator[wire_module.Deadlines]:
    """A Deadlines of the test's own in place of the process's (one that breaks here
    breaks nothing else)."""
    own = wire_module.Deadlines()
    monkeypatch.setattr(wire_module, "DEADLINES", own)
    yield own


def test_a_deadline_thread_that_failed_to_start_is_started_by_the_next_request(
    endpoint: Make, deadlines: wire_module.Deadlines, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the deadline thread fails to start (a process at its thread limit), that
    request fails as a retryable fault of the way, and the next request starts the thread:
    a stalled request still ends at its read timeout (it waited forever when ``_thread``
    was set before ``start()``)."""
    real_start = threading.Thread.start
    refused: list[threading.Thread] = []

    def start(self: threading.Thread) -> None:
        if self.name == "sqsworker-wire-deadlines" and not refused:
            refused.append(self)
            raise RuntimeError("can't start new thread")
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    server = endpoint([STALL, STALL])
    wire = server.wire(read_timeout=0.3)
    with pytest.raises(HTTPClientError) as caught:  # the first request: nothing was sent
        wire.post(HEAD, b"{}")
    assert translate(caught.value, "ReceiveMessage").retryable  # type: ignore[attr-defined]
    assert refused and server.requests == []
    thread, outcome = _in_thread(lambda: wire.post(HEAD, b"{}"))
    thread.join(WAIT)
    stuck = thread.is_alive()
    monkeypatch.undo()  # the process's DEADLINES again, for the stuck request's end
    server.close()  # ends the stuck request (the endpoint closes its connection)
    thread.join(WAIT)
    assert not stuck, "a stalled request did not end at its read timeout"
    assert outcome and isinstance(outcome[0], ReadTimeoutError)


_DEADLOCK = """
import faulthandler, gc, sys, threading
from sqsworker.transports import wire as wire_module
from tests.faults.test_wire import HEAD, STALL, Scripted, ok

class CollectingDict(dict):
    # _due, whose items() runs the cyclic collector once armed: as CPython 3.11 does when
    # the list _keep makes of it (under the lock) crosses the collector's threshold
    armed = False

    def items(self):
        if self.armed:
            self.armed = False
            gc.collect()
        return super().items()

due = wire_module.DEADLINES._due = CollectingDict()
server = Scripted([ok(b"1"), STALL])
dropped = server.wire(read_timeout=5.0)
assert dropped.post(HEAD, b"{}").body == b"1" and len(dropped._idle) == 1
dropped.cycle = dropped  # as LeanSQS and its botocore client: it goes only by the collector
del dropped
due.armed = True
stalled = Scripted([STALL]).wire(read_timeout=0.3)
faulthandler.dump_traceback_later(4, exit=True)  # a hang: every thread's stack, and out
try:
    stalled.post(HEAD, b"{}")
except Exception as exc:
    print("ended:", type(exc).__name__, flush=True)
"""


def test_a_wire_collected_while_the_deadlines_lock_is_held_does_not_deadlock() -> None:
    """A Wire nobody closed closes its idle connections from a ``weakref.finalize``. The
    lean client's Wire goes only with a cycle (LeanSQS registers its bound ``_learn`` on
    its own botocore client), so the cyclic collector runs that finalizer in whichever
    thread it runs, the deadline thread inside ``_keep`` (holding the Deadlines lock)
    among them: closing a connection takes no lock, so nothing blocks (after 5064d99,
    ``_Connection.close`` took it, and that thread and every request after it hung). Run
    in a child process, which is killed if it hangs."""
    root = Path(__file__).resolve().parents[2]
    child = subprocess.run(
        [sys.executable, "-c", _DEADLOCK], cwd=root, capture_output=True, text=True, timeout=60
    )
    stacks = "\n\n".join(b for b in child.stderr.split("\n\n") if "_keep" in b)
    assert child.stdout.strip() == "ended: ReadTimeoutError", (
        f"the stalled request did not end; the deadline thread blocked on its own lock:\n{stacks}"
    )


# --- what held: regression tests for what the existing ones do not try ----------------------


@needs_openssl
def test_a_tls_send_the_endpoint_never_reads_ends_at_the_read_timeout(tmp_path: Path) -> None:
    """The send blocks under the TLS layer (SSL_write) once the buffers fill; the deadline
    shuts the descriptor, and the request is a ReadTimeoutError, not an SSLError."""
    cert, key = _certificate(tmp_path, "endpoint", "IP:127.0.0.1")
    handshaken = threading.Event()
    released = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def accept() -> None:
        conn, _ = listener.accept()
        with _serving(cert, key).wrap_socket(conn, server_side=True):
            handshaken.set()
            released.wait(30)  # reads nothing

    threading.Thread(target=accept, daemon=True).start()
    try:
        wire = local_wire(port, read_timeout=0.3, context=tls_context(cert, None, None))
        with pytest.raises(ReadTimeoutError):
            wire.post(HEAD, b"x" * 64_000_000)
        assert handshaken.is_set() and wire._idle == []
    finally:
        released.set()
        listener.close()


def _echo_after(ep: Endpoint, conn: socket.socket, reader: BinaryIO) -> None:
    """Answers each request with its own id after the delay it names (None: never)."""
    while (request := _request(reader)) is not None:
        asked = json.loads(request.split(b"\r\n\r\n", 1)[1])
        if asked["delay"] is None:
            ep.released.wait(30)
            return
        if ep.released.wait(asked["delay"]):
            return
        conn.sendall(ok(b'{"id": %d}' % asked["id"]))


def test_many_requests_at_once_each_get_their_own_answer_or_a_timeout(
    serve: Callable[..., Endpoint],
) -> None:
    """Threads sharing one Wire, some answers prompt, some stalled, some landing on the
    read timeout (the deadline firing as the answer completes): each request ends, with
    its own answer or a ReadTimeoutError, never another request's answer."""
    server = serve(_echo_after)
    wire = server.wire(read_timeout=0.2)
    delays = [0.0, 0.0, 0.19, 0.2, 0.21, None, 0.0, 0.1]
    wrong: list[str] = []
    timeouts = [0]

    def worker(n: int) -> None:
        for i in range(8):
            ident = n * 100 + i
            delay = delays[(n + i) % len(delays)]
            body = json.dumps({"id": ident, "delay": delay}).encode()
            head = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
            try:
                got = wire.post(head, body).body
            except ReadTimeoutError:
                timeouts[0] += 1
                continue
            if json.loads(got) != {"id": ident}:
                wrong.append(f"{ident}: {got!r}")

    threads = [threading.Thread(target=worker, args=(n,), daemon=True) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not any(thread.is_alive() for thread in threads), "a request did not end"
    assert wrong == []
    assert timeouts[0] >= 6  # the stalled ones, at least
    assert all(not c.late for c in wire._idle)
