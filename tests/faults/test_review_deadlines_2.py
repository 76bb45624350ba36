"""A second review of the lean client's deadlines and idle checks (transports/wire.py, after
9d93c26): what reaches a TLS connection with its answer, and a chunked answer cut by the
deadline."""

from __future__ import annotations

import contextlib
import socket
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from sqsworker.transports import wire as wire_module
from sqsworker.transports.wire import tls_context

from .test_review_deadlines import (
    WAIT,
    Endpoint,
    _in_thread,
    _request,
    assert_cut_is_a_timeout,
    serve,
    tls,
)
from .test_wire import HEAD, STALL, Make, _certificate, _serving, endpoint, needs_openssl, ok

__all__ = ["endpoint", "serve", "tls"]  # the fixtures, used by name


def _corked(conn: socket.socket, *writes: Callable[[], object]) -> None:
    """``writes`` reach the other side in one TCP segment (each TLS write its own record):
    what follows the first is in the client's receive queue when it reads the first."""
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
    for write in writes:
        write()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)


def _answer_then_stale_record(ep: Endpoint, conn: socket.socket, reader: BinaryIO) -> None:
    """The first answer, and with it, in a TLS record of its own, an answer no request
    asked for; every later request is answered "fresh"."""
    if _request(reader) is None:
        return
    _corked(
        conn,
        lambda: conn.sendall(ok(b'{"first": 1}')),
        lambda: conn.sendall(ok(b'{"stale": 1}')),
    )
    while _request(reader) is not None:
        conn.sendall(ok(b'{"fresh": 1}'))


def _answer_then_close_notify(ep: Endpoint, conn: socket.socket, reader: BinaryIO) -> None:
    """On its first connection, the first answer and with it TLS's close_notify (the TCP
    connection kept open, waiting for the client's); later connections answer "first"."""
    if _request(reader) is None:
        return
    if ep.sent.is_set():
        conn.sendall(ok(b'{"first": 1}'))
        return
    ep.sent.set()
    assert isinstance(conn, ssl.SSLSocket)

    def close_notify() -> None:
        conn.setblocking(False)
        with contextlib.suppress(ssl.SSLWantReadError):
            conn.unwrap()  # sends close_notify, then would wait for the client's

    _corked(conn, lambda: conn.sendall(ok(b'{"first": 1}')), close_notify)
    ep.released.wait(30)


@needs_openssl
@pytest.mark.skipif(not hasattr(socket, "TCP_CORK"), reason="needs TCP_CORK (Linux)")
@pytest.mark.parametrize(
    "script",
    [_answer_then_stale_record, _answer_then_close_notify],
    ids=["stale-answer", "close-notify"],
)
def test_a_tls_record_that_came_with_the_answer_is_seen_before_the_connection_is_reused(
    serve: Callable[..., Endpoint], tmp_path: Path, script: Callable[..., None]
) -> None:
    """OpenSSL reads a record at a time (no read-ahead): a record that arrived with the
    answer stays in the kernel, not in ``_buffer`` nor ``pending()``, and TCP_INFO's count
    at the answer's end already includes it. The answer's end finds it unread (FIONREAD)
    and the connection is not kept: the next request does not read the stale answer as
    its own, nor the close_notify as a ConnectionClosedError after its request went out
    (9d93c26 let both through). Plain sockets: the bytes read catch it."""
    cert, key = _certificate(tmp_path, "endpoint", "IP:127.0.0.1")
    server = serve(script, _serving(cert, key))
    wire = server.wire(read_timeout=5.0, context=tls_context(cert, None, None))
    assert wire.post(HEAD, b"{}").body == b'{"first": 1}'
    thread, outcome = _in_thread(lambda: wire.post(HEAD, b"{}"))
    thread.join(WAIT)
    assert outcome, "the request did not end"
    [got] = outcome
    shown = got if isinstance(got, BaseException) else got.body  # type: ignore[attr-defined]
    assert not isinstance(got, BaseException) and got.body == b'{"first": 1}', (  # type: ignore[attr-defined]
        f"the connection was reused (opened {wire.opened}): {shown!r}"
    )
    assert wire.opened == 2


def test_a_chunked_body_cut_by_the_deadline_in_a_chunk_size_line_is_a_timeout(
    serve: Callable[..., Endpoint], tls: tuple[Any, Any]
) -> None:
    """A chunked answer whose chunk sizes have leading zeros (``1*HEXDIG``, as fixed-width
    writers send them) stalls after the "0" of "0005": the deadline's shutdown ends the
    line there, and a chunk-size line cut before its end is no last chunk but a
    ReadTimeoutError (9d93c26 took b"0" for the last chunk and returned the cut body as a
    whole 200)."""
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    head += b'000e\r\n{"Messages": [\r\n0'  # the next chunk's size, cut after its "0"
    assert_cut_is_a_timeout(serve, tls, head)


@needs_openssl
def test_tls_1_2_connections_are_kept_alive_through_tcp_info(
    endpoint: Make, tmp_path: Path
) -> None:
    """What held: TLS 1.2 (no post-handshake records, its ticket in the handshake) is kept
    alive by the TCP_INFO count as TLS 1.3 is (test_wire's test is 1.3 only)."""
    cert, key = _certificate(tmp_path, "endpoint", "IP:127.0.0.1")
    server = endpoint([ok(b"1"), ok(b"2"), ok(b"3"), STALL])  # STALL: it stays open
    server.tls = _serving(cert, key)
    server.tls.maximum_version = ssl.TLSVersion.TLSv1_2
    wire = server.wire(context=tls_context(cert, None, None))
    assert [wire.post(HEAD, b"{}").body for _ in range(3)] == [b"1", b"2", b"3"]
    assert wire.opened == 1
    [idle] = wire._idle
    assert isinstance(idle._sock, ssl.SSLSocket) and idle._sock.version() == "TLSv1.2"
    assert idle._received is not None or wire_module._TCP_INFO is None
