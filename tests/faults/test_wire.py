"""The lean client's HTTP/1.1 connections (transports/wire.py) against a scripted endpoint:
keep-alive, the ways an answer's body may end, connections the endpoint closed, and
answers that are not HTTP, each a fault botocore would raise for it."""

from __future__ import annotations

import os
import select
import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from botocore.exceptions import (
    ConnectionClosedError,
    EndpointConnectionError,
    HTTPClientError,
    ReadTimeoutError,
    SSLError,
)

from sqsworker.transports import wire as wire_module
from sqsworker.transports.sqs import translate
from sqsworker.transports.wire import Wire, tls_context

HEAD = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n"


STALL = b"stall"  # an answer: keep the connection, say nothing
CLOSE = b"close"  # after the answer before it: close the connection


class Held(bytes):
    """An answer written once the endpoint's ``go`` is set."""


class Trickle(bytes):
    """An answer written a byte at a time, ``gap`` seconds apart (an endpoint that never
    quite goes silent)."""

    gap = 0.1


class Scripted:
    """An endpoint on 127.0.0.1 that answers each request on a connection with the next
    of ``answers`` (bytes to write; None: close the connection instead of answering;
    STALL: never answer; CLOSE, after an answer: close the connection once it is sent)."""

    def __init__(self, answers: list[bytes | None], tls: ssl.SSLContext | None = None) -> None:
        self.answers = answers
        self.tls = tls
        self.requests: list[bytes] = []
        self.connections = 0
        self.closed = threading.Event()  # a connection was closed by CLOSE
        self._released = threading.Event()
        self.go = threading.Event()  # Held answers may be written
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        if self.tls is not None:
            try:
                conn = self.tls.wrap_socket(conn, server_side=True)
            except OSError:  # the client refused the handshake
                conn.close()
                return
        with conn, conn.makefile("rb") as reader:
            while self.answers:
                head = b""
                while not head.endswith(b"\r\n\r\n"):
                    line = reader.readline()
                    if not line:
                        return
                    head += line
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                self.requests.append(head + reader.read(length))
                answer = self.answers.pop(0)
                if answer is None:
                    return
                if answer == STALL:
                    self._released.wait(30)
                    return
                if isinstance(answer, Held) and not self.go.wait(30):
                    return
                if isinstance(answer, Trickle):
                    for i in range(len(answer)):
                        conn.sendall(answer[i : i + 1])
                        if self._released.wait(answer.gap):
                            return
                else:
                    conn.sendall(answer)
                if self.answers and self.answers[0] == CLOSE:
                    self.answers.pop(0)
                    conn.shutdown(socket.SHUT_RDWR)
                    self.closed.set()
                    return

    def wire(self, read_timeout: float = 5.0, context: ssl.SSLContext | None = None) -> Wire:
        return local_wire(self.port, read_timeout=read_timeout, context=context)

    def close(self) -> None:
        self._released.set()
        self._server.close()


def local_wire(
    port: int,
    *,
    read_timeout: float = 5.0,
    context: ssl.SSLContext | None = None,
    connect_timeout: float = 5.0,
    max_idle: int = 4,
) -> Wire:
    """A Wire to 127.0.0.1:``port``."""
    scheme = "https" if context is not None else "http"
    return Wire(
        f"{scheme}://127.0.0.1:{port}/",
        "127.0.0.1",
        port,
        context=context,
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        max_idle=max_idle,
    )


@pytest.fixture
def endpoint() -> Iterator[Callable[[list[bytes | None]], Scripted]]:
    made: list[Scripted] = []

    def make(answers: list[bytes | None]) -> Scripted:
        made.append(Scripted(answers))
        return made[-1]

    yield make
    for server in made:
        server.close()


Make = Callable[[list[bytes | None]], Scripted]


def ok(body: bytes, *extra: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\n" + b"".join(e + b"\r\n" for e in extra)
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


def test_requests_share_one_connection_while_the_endpoint_keeps_it(endpoint: Make) -> None:
    server = endpoint([ok(b'{"a": 1}'), ok(b'{"a": 2}'), ok(b"{}")])
    wire = server.wire()
    bodies = [wire.post(HEAD, b"{}").body for _ in range(3)]
    assert bodies == [b'{"a": 1}', b'{"a": 2}', b"{}"]
    assert wire.opened == 1 and server.connections == 1
    assert server.requests[0] == HEAD + b"{}"  # sent as given
    wire.close()


def test_a_chunked_answer_is_read_whole_and_its_headers_in_lower_case(endpoint: Make) -> None:
    chunked = (
        b"HTTP/1.1 400 Bad Request\r\nX-Amzn-Query-Error: AWS.X;Sender\r\n"
        b'Transfer-Encoding: chunked\r\n\r\n4;ext=1\r\n{"a"\r\n5\r\n: 1}\n\r\n0\r\nTrail: x\r\n\r\n'
    )
    server = endpoint([chunked, ok(b"{}")])
    wire = server.wire()
    answer = wire.post(HEAD, b"{}")
    assert (answer.status, answer.body) == (400, b'{"a": 1}\n')
    assert answer.headers["x-amzn-query-error"] == "AWS.X;Sender"
    assert wire.post(HEAD, b"{}").body == b"{}"  # the connection is still good
    assert wire.opened == 1


@pytest.mark.parametrize("looked_at", ["tcp-state", "polled"])
def test_a_connection_the_endpoint_closed_while_idle_is_not_used_again(
    endpoint: Make, looked_at: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # idle under a second its TCP state is read; longer, it is polled
    if looked_at == "polled":
        monkeypatch.setattr(wire_module, "IDLE_CHECK", 0.0)
    server = endpoint([ok(b"1"), CLOSE, ok(b"2")])
    wire = server.wire()
    assert wire.post(HEAD, b"{}").body == b"1"
    assert server.closed.wait(5)
    [idle] = wire._idle
    select.select([idle._sock], [], [], 5)  # its end has reached this side
    assert wire.post(HEAD, b"{}").body == b"2"  # on a new connection, no fault
    assert wire.opened == 2 and len(server.requests) == 2


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}",
    ],
    ids=["http-1.0", "connection-close"],
)
def test_an_answer_that_closes_its_connection_leaves_none_behind(
    endpoint: Make, answer: bytes
) -> None:
    server = endpoint([answer, answer])
    wire = server.wire()
    assert wire.post(HEAD, b"{}").body == b"{}"
    assert wire.post(HEAD, b"{}").body == b"{}"
    assert wire.opened == 2 and wire._idle == []


def test_a_body_that_ends_with_the_connection_is_read_to_its_end(endpoint: Make) -> None:
    server = endpoint([b'HTTP/1.1 200 OK\r\n\r\n{"x": 1}', CLOSE])
    wire = server.wire()
    assert wire.post(HEAD, b"{}").body == b'{"x": 1}'
    assert wire._idle == []


@pytest.mark.parametrize(
    ("answer", "raised"),
    [
        (None, ConnectionClosedError),  # closed without a word
        (b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{}", ConnectionClosedError),  # cut
        (b"SSH-2.0-OpenSSH\r\n\r\n", HTTPClientError),  # not HTTP
        (b"HTTP/1.1 2x0 OK\r\n\r\n", HTTPClientError),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", HTTPClientError),
        (b"HTTP/1.1 100 Continue\r\n\r\n", HTTPClientError),
    ],
    ids=["closed", "cut-short", "not-http", "bad-status", "bad-header", "interim"],
)
def test_a_broken_answer_is_a_retryable_fault_of_the_way_there(
    endpoint: Make, answer: bytes | None, raised: type[Exception]
) -> None:
    server = endpoint([answer])
    wire = server.wire()
    with pytest.raises(raised) as caught:
        wire.post(HEAD, b"{}")
    error = translate(caught.value, "ReceiveMessage")
    assert (error.code, error.retryable) == ("ConnectionError", True)  # type: ignore[attr-defined]
    assert wire._idle == []  # a connection that failed is not used again


def test_an_endpoint_that_does_not_answer_ends_at_the_read_timeout(endpoint: Make) -> None:
    server = endpoint([STALL])
    wire = server.wire(read_timeout=0.3)
    with pytest.raises(ReadTimeoutError):
        wire.post(HEAD, b"{}")
    assert wire._idle == []


def test_no_endpoint_is_a_connection_error() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
    wire = local_wire(port, read_timeout=1.0, connect_timeout=1.0, max_idle=1)
    with pytest.raises(EndpointConnectionError):
        wire.post(HEAD, b"{}")


def test_an_answer_longer_than_its_length_is_not_read_as_the_next_request_s(
    endpoint: Make,
) -> None:
    # what follows the first answer's two bytes arrives with them; it answers no request
    server = endpoint([ok(b"{}") + ok(b'{"stale": 1}'), ok(b'{"fresh": 1}')])
    wire = server.wire()
    assert wire.post(HEAD, b"{}").body == b"{}"
    assert wire.post(HEAD, b"{}").body == b'{"fresh": 1}'
    assert wire.opened == 2  # the connection holding the leftovers was not used again


def test_a_chunk_longer_than_its_size_is_not_read_as_a_whole_body(endpoint: Make) -> None:
    server = endpoint(
        [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}}\r\n0\r\n\r\n"]
    )
    wire = server.wire()
    with pytest.raises(HTTPClientError):
        wire.post(HEAD, b"{}")
    assert wire._idle == []


def test_an_endpoint_that_trickles_its_answer_ends_at_the_read_timeout(endpoint: Make) -> None:
    # a byte every 0.1 s: no single read waits 0.5 s, the whole answer takes about 4 s
    server = endpoint([Trickle(ok(b"{}"))])
    wire = server.wire(read_timeout=0.5)
    with pytest.raises(ReadTimeoutError):
        wire.post(HEAD, b"{}")
    assert wire._idle == []


def _certificate(directory: Path, name: str, names: str) -> tuple[str, str]:
    """A self-signed certificate for ``names`` (subjectAltName's words)."""
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    command = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-addext"]
    command += [f"subjectAltName={names}", "-subj", f"/CN={name}"]
    subprocess.run(
        [*command, "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    return str(cert), str(key)


def _serving(cert: str, key: str) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context


needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


@needs_openssl
def test_tls_connections_are_kept_alive_through_session_tickets(
    endpoint: Make, tmp_path: Path
) -> None:
    # TLS 1.3 endpoints send session tickets after the handshake: read with the first
    # answer, they must not leave the idle connection looking closed
    cert, key = _certificate(tmp_path, "endpoint", "IP:127.0.0.1")
    server = endpoint([ok(b"1"), ok(b"2"), ok(b"3")])
    server.tls = _serving(cert, key)
    wire = server.wire(context=tls_context(cert, None, None))
    assert [wire.post(HEAD, b"{}").body for _ in range(3)] == [b"1", b"2", b"3"]
    assert wire.opened == 1
    [idle] = wire._idle
    assert isinstance(idle._sock, ssl.SSLSocket) and idle._sock.version() == "TLSv1.3"


@needs_openssl
@pytest.mark.parametrize(
    ("names", "verify"),
    [("DNS:elsewhere.test", True), ("IP:127.0.0.1", False)],
    ids=["another-host", "unvouched"],
)
def test_a_certificate_for_another_host_or_unvouched_for_is_refused(
    endpoint: Make, tmp_path: Path, names: str, verify: bool
) -> None:
    cert, key = _certificate(tmp_path, "endpoint", names)
    bundle, _ = _certificate(tmp_path, "other", "IP:127.0.0.1")
    server = endpoint([ok(b"{}")])
    server.tls = _serving(cert, key)
    wire = server.wire(context=tls_context(cert if verify else bundle, None, None))
    with pytest.raises(SSLError) as caught:
        wire.post(HEAD, b"{}")
    assert "CERTIFICATE_VERIFY_FAILED" in str(caught.value)
    assert translate(caught.value, "ReceiveMessage").retryable  # type: ignore[attr-defined]
    assert server.requests == []  # nothing was sent


@needs_openssl
def test_verify_false_checks_no_certificate(endpoint: Make, tmp_path: Path) -> None:
    cert, key = _certificate(tmp_path, "endpoint", "DNS:elsewhere.test")
    server = endpoint([ok(b"{}")])
    server.tls = _serving(cert, key)
    assert server.wire(context=tls_context(False, None, None)).post(HEAD, b"{}").body == b"{}"


def test_a_connection_back_from_a_request_after_close_is_closed_not_kept(
    endpoint: Make,
) -> None:
    server = endpoint([Held(ok(b"{}"))])
    wire = server.wire()
    answers: list[bytes] = []
    request = threading.Thread(target=lambda: answers.append(wire.post(HEAD, b"{}").body))
    request.start()
    while not server.requests:  # the request is on its way back
        select.select([], [], [], 0.01)
    wire.close()  # as the transport closes while a receive is out
    server.go.set()
    request.join(10)
    assert answers == [b"{}"]  # the request in flight ends well
    assert wire._idle == []  # and its connection is not kept by a closed Wire


def test_a_connection_past_select_s_1024_descriptors_is_kept_alive(
    endpoint: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a process with many files open (an executor, a worker with many queues): the
    # connection's descriptor is past what select() takes; it is still polled and kept
    monkeypatch.setattr(wire_module, "IDLE_CHECK", 0.0)
    resource = pytest.importorskip("resource")
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < 1100:
        pytest.skip("needs 1100 open files")
    held = [socket.socket() for _ in range(1030)]
    try:
        server = endpoint([ok(b"1"), ok(b"2")])
        wire = server.wire()
        assert wire.post(HEAD, b"{}").body == b"1"
        assert wire._idle[0]._sock.fileno() >= 1024
        assert wire.post(HEAD, b"{}").body == b"2"
        assert wire.opened == 1
    finally:
        for sock in held:
            sock.close()


def test_a_request_on_a_connection_in_use_makes_no_poll(
    endpoint: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    # each poll (and a socket timeout's, before each send and recv) lets the GIL go: under
    # load, a hand-over to another thread and back. A connection used under IDLE_CHECK
    # ago is not polled, and its socket has no timeout.
    polls: list[float] = []
    real_poll = select.poll

    def counting_poll() -> object:
        polls.append(1.0)
        return real_poll()

    monkeypatch.setattr(select, "poll", counting_poll)
    server = endpoint([ok(b"1"), ok(b"2"), ok(b"3")])
    wire = server.wire()
    assert [wire.post(HEAD, b"{}").body for _ in range(2)] == [b"1", b"2"]
    assert polls == [] and wire._idle[0]._sock.gettimeout() is None
    monkeypatch.setattr(wire_module, "IDLE_CHECK", 0.0)  # as if idle a second
    assert wire.post(HEAD, b"{}").body == b"3"
    assert polls == [1.0] and wire.opened == 1


@needs_openssl
def test_a_tls_endpoint_that_does_not_answer_ends_at_the_read_timeout(
    endpoint: Make, tmp_path: Path
) -> None:
    # the socket blocks: the deadline shuts it down under the TLS layer's read
    cert, key = _certificate(tmp_path, "endpoint", "IP:127.0.0.1")
    server = endpoint([ok(b"1"), STALL])
    server.tls = _serving(cert, key)
    wire = server.wire(read_timeout=0.3, context=tls_context(cert, None, None))
    assert wire.post(HEAD, b"{}").body == b"1"
    with pytest.raises(ReadTimeoutError):
        wire.post(HEAD, b"{}")
    assert wire._idle == []


def test_a_send_the_endpoint_never_reads_ends_at_the_read_timeout() -> None:
    # an endpoint that accepts and reads nothing: the send blocks once the buffers fill
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    try:
        wire = local_wire(port, read_timeout=0.3)
        with pytest.raises(ReadTimeoutError):
            wire.post(HEAD, b"x" * 64_000_000)
        assert wire._idle == []
    finally:
        server.close()


def test_a_forked_child_keeps_its_requests_deadlines(endpoint: Make) -> None:
    # the thread that keeps the deadlines is not in a forked child: the child starts its own
    server = endpoint([ok(b"1"), STALL])
    wire = server.wire(read_timeout=0.3)
    assert wire.post(HEAD, b"{}").body == b"1"  # the parent's thread runs
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover (the child reports through the pipe)
        outcome = b"?"
        try:
            local_wire(server.port, read_timeout=0.3, max_idle=1).post(HEAD, b"{}")
        except ReadTimeoutError:
            outcome = b"timeout"
        except BaseException:
            outcome = b"other"
        os.write(write, outcome)
        os._exit(0)
    os.close(write)
    ready, _, _ = select.select([read], [], [], 20)
    assert ready, "the child's stalled request did not end"
    assert os.read(read, 16) == b"timeout"
    os.waitpid(child, 0)
    os.close(read)
