"""Keep-alive HTTP/1.1 connections on an event loop: the lean client's way to SQS from a
coroutine worker's loop.

``LoopWire`` is ``wire.Wire`` for code on an event loop: the same POST of a signed body,
the same reading of the answer (``http11.AnswerReader``), the same TLS context, timeouts
and faults (botocore's exceptions, so ``translate()`` maps them as it maps botocore's),
but no thread waits on a socket: the loop's selector tells a connection that bytes came,
and the coroutine awaiting its answer runs on when it is whole. On a thread, every
blocking send and recv lets the GIL go and takes it back, a hand-over to another thread
under load; here a request costs the loop's callbacks only, and many connections share
one wait (bench/README.md, ``bench.http``).

The read timeout bounds the whole answer from the request's send (a loop timer aborts the
connection); the connect timeout bounds the connection and its TLS handshake. An idle
connection is not polled before it is used again: the loop has read whatever came on it
while idle (the endpoint's close, or bytes no request asked for), and either makes it
unusable. A ``LoopWire`` belongs to the loop that first used it, and is closed on it.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import cast

from botocore.exceptions import (
    BotoCoreError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    HTTPClientError,
    ReadTimeoutError,
    SSLError,
)

from .http11 import Answer, AnswerReader


class LoopWire:
    """Keep-alive connections to ``url``'s host on the running loop (a pool of idle ones,
    at most ``max_idle``), each used by one request at a time."""

    def __init__(
        self,
        url: str,
        host: str,
        port: int,
        *,
        context: ssl.SSLContext | None,
        connect_timeout: float | None,
        read_timeout: float | None,
        max_idle: int,
    ) -> None:
        self.url = url  # for the errors' words
        self._host, self._port = host, port
        self._context = context
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._max_idle = max_idle
        self._idle: list[_Connection] = []
        self._closed = False
        self.opened = 0  # connections made so far

    async def post(self, head: bytes, body: bytes) -> Answer:
        """POST ``body``; ``head`` is the request line and its headers, ending in a blank
        line. Raises botocore's exceptions for faults on the way."""
        connection = self._take() or await self._open()
        try:
            answer, keep = await connection.exchange(head + body, self._read_timeout)
        except BaseException:  # a fault, or the caller cancelled: the connection is spent
            connection.close()
            raise
        if keep and not self._closed and len(self._idle) < self._max_idle:
            self._idle.append(connection)
        else:
            connection.close()
        return answer

    def close(self) -> None:
        """Close the idle connections; those back from requests under way close then.
        On the loop's thread."""
        self._closed = True
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    def _take(self) -> _Connection | None:
        while self._idle:
            connection = self._idle.pop()
            if connection.usable():
                return connection
            connection.close()  # the endpoint closed it, or sent what no request asked
        return None

    async def _open(self) -> _Connection:
        loop = asyncio.get_running_loop()
        context = self._context
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, connection = await loop.create_connection(
                    lambda: _Connection(self.url),
                    self._host,
                    self._port,
                    ssl=context,
                    server_hostname=self._host if context is not None else None,
                )
        except TimeoutError as exc:
            raise ConnectTimeoutError(endpoint_url=self.url, error=exc) from None
        except ssl.SSLError as exc:
            raise SSLError(endpoint_url=self.url, error=exc) from None
        except OSError as exc:
            raise EndpointConnectionError(endpoint_url=self.url, error=exc) from None
        self.opened += 1
        return connection


class _Connection(asyncio.Protocol):
    """One connection: the answer it reads for the request under way, if any."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._transport: asyncio.Transport | None = None
        self._reader: AnswerReader | None = None  # set while a request is under way
        self._waiter: asyncio.Future[tuple[Answer, bool]] | None = None
        self._read_timeout: float | None = None
        self._ended = False  # closed, or the endpoint ended it
        self._unasked = False  # bytes came that no request asked for

    # -- for the wire --------------------------------------------------------------------

    def usable(self) -> bool:
        transport = self._transport
        return not (self._ended or self._unasked or transport is None or transport.is_closing())

    async def exchange(self, request: bytes, read_timeout: float | None) -> tuple[Answer, bool]:
        """Send ``request``; its answer, and whether the connection may carry another."""
        assert self._transport is not None and self._reader is None
        loop = asyncio.get_running_loop()
        self._reader = AnswerReader(self._url)
        waiter: asyncio.Future[tuple[Answer, bool]] = loop.create_future()
        self._waiter = waiter
        self._read_timeout = read_timeout
        timer = None if read_timeout is None else loop.call_later(read_timeout, self._expire)
        try:
            self._transport.write(request)
            return await waiter
        finally:
            if timer is not None:
                timer.cancel()
            self._reader = self._waiter = None

    def close(self) -> None:
        self._ended = True
        if self._transport is not None:
            self._transport.close()

    # -- the loop's callbacks --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport: not always a subclass of asyncio.Transport (uvloop's are not)
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        if reader is None:
            self._unasked = True  # while idle: it answers no request
            return
        try:
            whole = reader.feed(data)
        except Exception as exc:  # an answer that is not HTTP/1.1
            self._fail(exc)
            return
        if whole:
            self._answered(reader)

    def eof_received(self) -> bool | None:
        self._ended = True
        reader = self._reader
        if reader is not None:
            try:
                reader.end()  # raises if the end cut the answer short
            except Exception as exc:
                self._fail(exc)
                return None
            self._answered(reader)
        return None  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._ended = True
        if self._reader is not None:
            self._fail(exc if exc is not None else ConnectionClosedError(endpoint_url=self._url))

    def _answered(self, reader: AnswerReader) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            assert reader.answer is not None
            waiter.set_result((reader.answer, reader.keep and not self._ended))
        self._reader = None

    def _expire(self) -> None:
        """The read timeout passed with the answer not whole."""
        error = TimeoutError(f"no whole answer within {self._read_timeout} s")
        self._fail(ReadTimeoutError(endpoint_url=self._url, error=error))

    def _fail(self, exc: BaseException) -> None:
        """The request under way fails with botocore's exception for ``exc``; the
        connection carries no other."""
        waiter = self._waiter
        self._reader = None
        self._ended = True
        if waiter is not None and not waiter.done():
            waiter.set_exception(_botocore_fault(exc, self._url))
        if self._transport is not None:
            self._transport.abort()


def _botocore_fault(exc: BaseException, url: str) -> BaseException:
    """botocore's exception for a fault of the socket or TLS, or botocore's own; any other
    ``Exception`` as an ``HTTPClientError``."""
    if isinstance(exc, BotoCoreError):
        return exc
    if isinstance(exc, ssl.SSLError):
        return SSLError(endpoint_url=url, error=exc)
    if isinstance(exc, OSError):
        return ConnectionClosedError(endpoint_url=url, error=exc)
    if isinstance(exc, Exception):
        return HTTPClientError(error=exc)
    return exc
