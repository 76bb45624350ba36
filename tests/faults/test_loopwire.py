"""The lean client's connections on an event loop (transports/loopwire.py) against the same
scripted endpoint as the blocking ones (test_wire.py): the scenarios that do not look
inside a blocking socket run here again on a ``LoopWire``, with the same faults expected,
and those that do have their loop counterparts below."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest
from botocore.exceptions import ConnectTimeoutError, EndpointConnectionError, ReadTimeoutError

from sqsworker.transports.http11 import Answer
from sqsworker.transports.loopwire import LoopWire, _Connection

from ..conftest import wait_until
from .test_wire import (  # noqa: F401 (each runs here again, on a LoopWire)
    CLOSE,
    HEAD,
    Scripted,
    ok,
    test_a_body_that_ends_with_the_connection_is_read_to_its_end,
    test_a_broken_answer_is_a_retryable_fault_of_the_way_there,
    test_a_certificate_for_another_host_or_unvouched_for_is_refused,
    test_a_chunk_longer_than_its_size_is_not_read_as_a_whole_body,
    test_a_chunked_answer_is_read_whole_and_its_headers_in_lower_case,
    test_a_connection_back_from_a_request_after_close_is_closed_not_kept,
    test_a_tls_endpoint_that_does_not_answer_ends_at_the_read_timeout,
    test_an_answer_longer_than_its_length_is_not_read_as_the_next_request_s,
    test_an_answer_that_closes_its_connection_leaves_none_behind,
    test_an_endpoint_that_does_not_answer_ends_at_the_read_timeout,
    test_an_endpoint_that_trickles_its_answer_ends_at_the_read_timeout,
    test_requests_share_one_connection_while_the_endpoint_keeps_it,
    test_verify_false_checks_no_certificate,
)

T = TypeVar("T")


class OnLoop:
    """A ``LoopWire`` on an event loop of its own thread, called as a ``Wire`` is."""

    def __init__(
        self,
        port: int,
        read_timeout: float,
        context: ssl.SSLContext | None,
        new_loop: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop,
    ) -> None:
        self.loop = new_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        scheme = "https" if context is not None else "http"
        self.wire = LoopWire(
            f"{scheme}://127.0.0.1:{port}/",
            "127.0.0.1",
            port,
            context=context,
            connect_timeout=1.0,
            read_timeout=read_timeout,
            max_idle=4,
        )

    def run(self, call: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(call, self.loop).result(30)

    def post(self, head: bytes, body: bytes) -> Answer:
        return self.run(self.wire.post(head, body))

    def close(self) -> None:
        async def close() -> None:
            self.wire.close()

        self.run(close())

    @property
    def opened(self) -> int:
        return self.wire.opened

    @property
    def _idle(self) -> list[_Connection]:
        return self.wire._idle

    def stop(self) -> None:
        self.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


class LoopScripted(Scripted):
    def __init__(
        self, answers: list[bytes | None], new_loop: Callable[[], asyncio.AbstractEventLoop]
    ) -> None:
        super().__init__(answers)
        self.new_loop = new_loop
        self.made: list[OnLoop] = []

    def wire(  # type: ignore[override]
        self, read_timeout: float = 5.0, context: ssl.SSLContext | None = None
    ) -> OnLoop:
        made = OnLoop(self.port, read_timeout, context, self.new_loop)
        self.made.append(made)
        return made


Make = Callable[[list[bytes | None]], LoopScripted]


# The loops a worker's may be: asyncio's, and uvloop's (a user's policy may make it), whose
# transports (TLS too) are its own.
LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {"asyncio": asyncio.new_event_loop}
try:
    import uvloop

    LOOPS["uvloop"] = uvloop.new_event_loop
except ImportError:  # not on every platform
    pass


@pytest.fixture(params=list(LOOPS))
def endpoint(request: pytest.FixtureRequest) -> Iterator[Make]:
    servers: list[LoopScripted] = []

    def make(answers: list[bytes | None]) -> LoopScripted:
        server = LoopScripted(answers, LOOPS[request.param])
        servers.append(server)
        return server

    yield make
    for server in servers:
        for wire in server.made:
            wire.stop()
        server.close()


def test_a_connection_the_endpoint_closed_while_idle_is_not_used_again(endpoint: Make) -> None:
    # the loop reads the endpoint's end while the connection is idle: no poll before use
    server = endpoint([ok(b"1"), CLOSE, ok(b"2")])
    wire = server.wire()
    assert wire.post(HEAD, b"{}").body == b"1"
    assert server.closed.wait(5)
    [idle] = wire._idle
    wait_until(lambda: not idle.usable(), what="the loop to read the endpoint's end")
    assert wire.post(HEAD, b"{}").body == b"2"  # on a new connection, no fault
    assert wire.opened == 2 and len(server.requests) == 2


def test_bytes_no_request_asked_for_make_an_idle_connection_unusable(endpoint: Make) -> None:
    server = endpoint([ok(b"1"), ok(b"2")])
    wire = server.wire()
    assert wire.post(HEAD, b"{}").body == b"1"
    [idle] = wire._idle
    wire.loop.call_soon_threadsafe(idle.data_received, b"HTTP/1.1 200 OK\r\n")
    wait_until(lambda: not idle.usable(), what="the loop to take the stray bytes")
    assert wire.post(HEAD, b"{}").body == b"2"
    assert wire.opened == 2


def test_no_endpoint_is_a_connection_error() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
    wire = OnLoop(port, 1.0, None)
    try:
        with pytest.raises(EndpointConnectionError):
            wire.post(HEAD, b"{}")
    finally:
        wire.stop()


def test_a_connection_not_accepted_in_time_is_a_connect_timeout() -> None:
    # a listener whose backlog is full: the connection's SYN goes unanswered
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    fillers = []
    wire = OnLoop(port, 1.0, None)
    try:
        for _ in range(8):  # fill the backlog (the kernel takes a little more than asked)
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
            fillers.append(filler)
        with pytest.raises((ConnectTimeoutError, EndpointConnectionError)):
            wire.post(HEAD, b"{}")
    finally:
        wire.stop()
        for filler in fillers:
            filler.close()
        server.close()


def test_a_send_the_endpoint_never_reads_ends_at_the_read_timeout() -> None:
    # an endpoint that accepts and reads nothing: the loop holds what it could not send
    server = socket.create_server(("127.0.0.1", 0))
    wire = OnLoop(server.getsockname()[1], 0.3, None)
    try:
        with pytest.raises(ReadTimeoutError):
            wire.post(HEAD, b"x" * 64_000_000)
        assert wire._idle == []
    finally:
        wire.stop()
        server.close()


def test_a_request_cancelled_leaves_its_connection_unused(endpoint: Make) -> None:
    # a coroutine cancelled while its request is out (the shutdown's timeout): the answer
    # that comes later answers nothing, so the connection is not used again
    server = endpoint([b"stall", ok(b"2")])
    wire = server.wire()

    async def cancelled() -> None:
        request = asyncio.ensure_future(wire.wire.post(HEAD, b"{}"))
        await asyncio.sleep(0.2)
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request

    wire.run(cancelled())
    assert wire._idle == []
    assert wire.post(HEAD, b"{}").body == b"2"
    assert wire.opened == 2
