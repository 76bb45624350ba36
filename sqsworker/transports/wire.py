"""A keep-alive HTTP/1.1 client for one endpoint: how the lean client reaches SQS.

SQS's JSON protocol needs little of HTTP: a POST of a body of known length, and an
answer with a ``Content-Length`` (or chunked, or until the connection closes). Through
botocore's urllib3 session a receive of 10 cost 561 µs of CPU, through ``http.client``
377, and written straight to a socket, as here, 177 (``bench.calls``): urllib3's pool,
``Retry`` and response objects and ``http.client``'s header parsing (the ``email``
package) cost more than the rest of a call.

What must stay exactly as botocore does it is botocore's: the TLS context
(``create_urllib3_context``: its ciphers and options), the certificates checked (the
client's ``verify``: its CA bundle, ``AWS_CA_BUNDLE``, or none), the host name checked,
a client certificate, the connect and read timeouts, and the exceptions a fault
raises (``EndpointConnectionError``, ``ConnectTimeoutError``, ``ReadTimeoutError``,
``ConnectionClosedError``, ``SSLError``), so ``translate()`` maps them as it maps
botocore's. One thing is stricter than botocore: the read timeout bounds a whole answer,
not each read of it, so an endpoint trickling a byte now and then cannot hold a request
past it. A proxy is not handled here: the lean client sends through botocore's
session when one applies.

**Sockets without a timeout.** A socket with a timeout makes a poll() before every send
and every recv, and each of those lets the GIL go and takes it back: under load each is
a hand-over to another thread and a wait to get it back. So the connections block, and
their time is kept by one thread for the whole process (``Deadlines``), which shuts down
the socket of a request past its deadline, so its blocked send or recv returns at once.
For the same reason an idle connection is looked at with a poll before it is used again
only once it has been idle a second (``IDLE_CHECK``); sooner, on Linux, ``TCP_INFO`` (read
without letting the GIL go) tells whether the endpoint closed it (its state) or sent it
anything since its last answer (the bytes it has received). That count is taken as an
answer ends, when the connection must hold nothing more: a plain one has read all it
received; a TLS one holds nothing unread in its socket (FIONREAD), as its TLS layer reads
a record at a time and may leave one that came with the answer.
"""

from __future__ import annotations

import array
import contextlib
import math
import os
import select
import socket
import ssl
import struct
import sys
import threading
import time
import weakref
from typing import Any

from botocore.exceptions import (
    BotoCoreError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    HTTPClientError,
    ReadTimeoutError,
    SSLError,
)
from botocore.httpsession import create_urllib3_context, get_cert_path

from .http11 import Answer, AnswerReader

if sys.platform == "linux":  # with TCP_INFO: how many bytes a socket holds unread
    import fcntl
    import termios

_READ_SIZE = 65_536  # bytes asked of the socket at a time
IDLE_CHECK = 1.0  # seconds idle after which a connection is polled before it is reused
# Linux's struct tcp_info, up to tcpi_bytes_received (Linux 4.1): its first byte is the
# TCP state, and the bytes the connection has received are a u64 at offset 128.
_TCP_INFO = getattr(socket, "TCP_INFO", None) if sys.platform == "linux" else None
_TCP_INFO_SIZE = 136
_ESTABLISHED = 1


def tls_context(verify: Any, cert_file: str | None, key_file: str | None) -> ssl.SSLContext:
    """The TLS context botocore's session would use: ``verify`` is the client's (True:
    botocore's CA bundle; a path: that bundle or folder; False: no check)."""
    context: ssl.SSLContext = create_urllib3_context()
    if verify:
        context.verify_mode = ssl.CERT_REQUIRED
        context.check_hostname = True
        where = str(get_cert_path(verify))
        if os.path.isdir(where):
            context.load_verify_locations(capath=where)
        else:
            context.load_verify_locations(cafile=where)
    else:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if cert_file:
        context.load_cert_chain(cert_file, key_file)
    return context


class Wire:
    """Keep-alive connections to ``url``'s host (a pool of idle ones, at most
    ``max_idle``), each used by one request at a time."""

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
        self._address = (host, port)
        self._context = context
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._max_idle = max_idle
        self._idle: list[_Connection] = []
        self._lock = threading.Lock()
        self._closed = False  # close() was called: connections back from requests close
        self.opened = 0  # connections made so far
        # a Wire nobody closed closes its idle connections when it goes (as urllib3's pools)
        weakref.finalize(self, _close_all, self._idle)

    def post(self, head: bytes, body: bytes) -> Answer:
        """POST ``body``; ``head`` is the request line and its headers, ending in a
        blank line. Raises botocore's exceptions for faults on the way."""
        connection = self._take()
        try:
            connection.send(head + body)
            answer, keep = connection.answer()
        except BaseException:
            connection.close()
            raise
        if keep:
            self._give_back(connection)
        else:
            connection.close()
        return answer

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle = self._idle[:]
            self._idle.clear()
        _close_all(idle)

    def _take(self) -> _Connection:
        while True:
            with self._lock:
                connection = self._idle.pop() if self._idle else None
            if connection is None:
                return self._open()
            if connection.usable():
                return connection
            connection.close()  # the endpoint closed it while it was idle

    def _give_back(self, connection: _Connection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._max_idle:
                self._idle.append(connection)
                return
        connection.close()

    def _open(self) -> _Connection:
        try:
            sock = socket.create_connection(self._address, timeout=self._connect_timeout)
        except TimeoutError as exc:
            raise ConnectTimeoutError(endpoint_url=self.url, error=exc) from None
        except OSError as exc:
            raise EndpointConnectionError(endpoint_url=self.url, error=exc) from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._context is not None:
                sock = self._context.wrap_socket(sock, server_hostname=self._address[0])
        except ssl.SSLError as exc:
            sock.close()
            raise SSLError(endpoint_url=self.url, error=exc) from None
        except TimeoutError as exc:
            sock.close()
            raise ConnectTimeoutError(endpoint_url=self.url, error=exc) from None
        except OSError as exc:
            sock.close()
            raise EndpointConnectionError(endpoint_url=self.url, error=exc) from None
        with self._lock:
            self.opened += 1
        return _Connection(sock, self.url, self._read_timeout)


def _readable(sock: socket.socket) -> bool:
    """Whether ``sock`` has something to read (or its end) now: poll() where there is one,
    as select() takes no descriptor past 1024 (a process with many files open)."""
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable)


def _close_all(connections: list[_Connection]) -> None:
    for connection in connections:
        connection.close()


class Deadlines:
    """The deadlines of the requests under way on every connection of the process, kept by
    one thread: a request past its deadline has its socket shut down, so that the send or
    recv it is blocked in returns at once, and is marked ``late`` (its caller raises
    ``ReadTimeoutError``). The thread sleeps until the soonest deadline; requests end long
    before theirs, so it wakes about once a read timeout."""

    def __init__(self) -> None:
        self._forget()
        os.register_at_fork(after_in_child=self._forget)  # the thread is not in the child

    def _forget(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._due: dict[_Connection, float] = {}
        self._until = math.inf  # when the thread wakes next of itself
        self._thread: threading.Thread | None = None

    def arm(self, connection: _Connection, deadline: float) -> None:
        """``connection``'s request must be done by ``deadline`` (replacing its last)."""
        with self._lock:
            self._due[connection] = deadline
            if self._thread is None:
                thread = threading.Thread(
                    target=self._keep, name="sqsworker-wire-deadlines", daemon=True
                )
                try:
                    thread.start()  # may fail ("can't start new thread"): the next tries again
                except BaseException:
                    del self._due[connection]
                    raise
                self._thread = thread
            elif deadline < self._until:
                self._changed.notify()

    def disarm(self, connection: _Connection) -> bool:
        """``connection``'s request is done; True if it was late (its socket is shut).
        Never called from a finalizer (the collector may run under this lock)."""
        with self._lock:
            self._due.pop(connection, None)
            return connection.late

    def _keep(self) -> None:
        with self._lock:
            while True:
                now = time.monotonic()
                self._until = math.inf
                for connection, due in list(self._due.items()):
                    if due <= now:
                        del self._due[connection]
                        connection.late = True
                        connection.shut()
                    else:
                        self._until = min(self._until, due)
                self._changed.wait(None if self._until == math.inf else self._until - now)


DEADLINES = Deadlines()


class _Connection:
    """One socket, and what was read from it beyond the line or body asked for."""

    def __init__(self, sock: socket.socket, url: str, read_timeout: float | None) -> None:
        sock.settimeout(None)  # blocking: the time is kept by DEADLINES
        self._sock = sock
        self._url = url
        self._read_timeout = read_timeout
        self._used = time.monotonic()  # when its last answer ended
        self._read = 0  # bytes read from the socket (a plain one)
        # What TCP_INFO said it had received when its last answer ended (plain: the bytes
        # read, which it should equal); None: no TCP_INFO, poll instead
        self._received: int | None = None
        self.late = False  # past a deadline: DEADLINES shut it down

    def usable(self) -> bool:
        """Nothing to read while idle: an idle connection readable was closed by the
        endpoint (or sent what no request asked for). Idle less than IDLE_CHECK, TCP_INFO
        tells: still established, and nothing received since its last answer."""
        if isinstance(self._sock, ssl.SSLSocket) and self._sock.pending():
            return False
        try:
            if time.monotonic() - self._used < IDLE_CHECK and self._received is not None:
                return self._tcp_received() == self._received
            return not _readable(self._sock)
        except (OSError, ValueError):
            return False

    def _tcp_received(self) -> int | None:
        """The bytes the connection has received, if it is established; else None."""
        if _TCP_INFO is None:
            return None
        info = self._sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, _TCP_INFO_SIZE)
        if len(info) < _TCP_INFO_SIZE or info[0] != _ESTABLISHED:
            return None
        received: int = struct.unpack_from("=Q", info, 128)[0]
        return received

    def send(self, data: bytes) -> None:
        try:
            self._arm()
            self._sock.sendall(data)
        except BaseException as exc:
            raise self._fault(exc) from None

    def answer(self) -> tuple[Answer, bool]:
        """The answer, and whether the connection may carry another request. The read
        timeout bounds the whole answer, not each read: an endpoint sending a byte now and
        then does not keep a request waiting past it."""
        try:
            self._arm()
            answer, keep = self._answer()
        except BaseException as exc:
            raise self._fault(exc) from None
        if DEADLINES.disarm(self):  # it was whole, but its socket is shut
            keep = False
        if keep:
            keep = self._nothing_past_the_answer()
        return answer, keep

    def _nothing_past_the_answer(self) -> bool:
        """Whether the connection, its answer read, holds nothing more (so it may carry
        another request), and what TCP_INFO counts as received by now, for ``usable``.
        A plain socket's bytes are all the answer's: more received than read, the endpoint
        sent past the answer. A TLS socket's TLS layer reads a record at a time: one that
        came with the answer (another answer, a close_notify) waits in the kernel, which
        says how many bytes it holds unread (FIONREAD)."""
        self._used = time.monotonic()
        try:
            self._received = self._tcp_received()
            if self._received is None:
                return True  # no TCP_INFO: ``usable`` polls
            if isinstance(self._sock, ssl.SSLSocket):
                unread = array.array("i", [0])
                fcntl.ioctl(self._sock.fileno(), termios.FIONREAD, unread, True)
                return unread[0] == 0 and not self._sock.pending()
            return self._received == self._read
        except (OSError, ValueError):
            return False

    def _arm(self) -> None:
        if self._read_timeout is not None:
            DEADLINES.arm(self, time.monotonic() + self._read_timeout)

    def _fault(self, exc: BaseException) -> BaseException:
        """What a failed send or read raises: a timeout if it was late (whatever the shut
        socket made of the answer); botocore's exception for a fault of the socket or
        TLS, or botocore's own (an answer that is not HTTP, or cut short); any other
        ``Exception`` as an ``HTTPClientError``; an interrupt as itself."""
        if DEADLINES.disarm(self) and isinstance(exc, Exception):
            return ReadTimeoutError(
                endpoint_url=self._url,
                error=TimeoutError(f"no whole answer within {self._read_timeout} s"),
            )
        if isinstance(exc, ssl.SSLError):
            return SSLError(endpoint_url=self._url, error=exc)
        if isinstance(exc, OSError):
            return ConnectionClosedError(endpoint_url=self._url, error=exc)
        if isinstance(exc, Exception) and not isinstance(exc, BotoCoreError):
            return HTTPClientError(error=exc)
        return exc

    def shut(self) -> None:
        """End the request under way: its blocked send or recv returns (DEADLINES)."""
        with contextlib.suppress(OSError, ValueError):
            socket.socket.shutdown(self._sock, socket.SHUT_RDWR)  # the descriptor's, not TLS

    def _answer(self) -> tuple[Answer, bool]:
        reader = AnswerReader(self._url)
        while True:
            data = self._sock.recv(_READ_SIZE)  # DEADLINES ends a wait past the deadline
            if not data:
                reader.end()  # raises if that cut the answer short
                if self.late:  # that end may be the deadline's shutdown: the body may be cut
                    raise TimeoutError("the answer's end was its deadline")
                break
            self._read += len(data)
            if reader.feed(data):
                break
        assert reader.answer is not None
        return reader.answer, reader.keep

    def close(self) -> None:
        # no DEADLINES.disarm here: a Wire's finalizer closes its idle connections (never
        # armed), and the collector may run it in a thread holding DEADLINES' lock
        with contextlib.suppress(OSError):
            self._sock.close()
