"""Reading an HTTP/1.1 answer from bytes as they come, without doing any I/O (sans-IO).

The lean client's connections hand an ``AnswerReader`` what they read, whether they block
on a socket (``wire.Wire``, on the worker's threads) or are told by the event loop that
bytes came (``loopwire.LoopWire``, on a coroutine worker's loop): one reading of HTTP, and
the same faults for every way an answer can go wrong, as botocore raises them (an answer
cut short: ``ConnectionClosedError``; one that is not HTTP/1.1: ``HTTPClientError``).

SQS's answers need little of HTTP: a status line, headers, and a body of a known length,
in chunks, or (HTTP/1.0) up to the connection's end. A line may end in CRLF or LF; lines
are at most 64 KiB and headers at most 100 lines, so an endpoint sending no end cannot
make the reader keep all it sends.
"""

from __future__ import annotations

from botocore.exceptions import ConnectionClosedError, HTTPClientError

LINE_MOST = 65_536  # bytes in a status or header line
HEADERS_MOST = 100  # header lines in an answer

# What the reader waits for
_STATUS, _HEADERS, _LENGTH, _CHUNK_SIZE, _CHUNK, _TRAILERS, _TO_END, _DONE = range(8)


class Answer:
    """An HTTP answer: its status, its headers (names in lower case) and its body."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body


class AnswerReader:
    """One answer, read from what ``feed`` is given, then ``end`` if the connection ends.

    ``feed(data)`` returns True once the answer is whole (``answer``, and ``keep``:
    whether the connection may carry another request; bytes past the answer answer no
    request, so then it may not). ``end()`` says the connection ended: it returns True
    if that ended an answer whose body runs to the connection's end, and raises
    ``ConnectionClosedError`` if the answer was cut short. A fault of the answer raises
    from ``feed`` or ``end``.
    """

    __slots__ = (
        "_body",
        "_buffer",
        "_headers",
        "_keep",
        "_lines",
        "_need",
        "_state",
        "_status",
        "_url",
        "answer",
        "keep",
        "to_end",
    )

    def __init__(self, url: str) -> None:
        self._url = url  # for the faults' words
        self._buffer = bytearray()
        self._state = _STATUS
        self._status = 0
        self._keep = False
        self._headers: dict[str, str] = {}
        self._lines = 0  # header or trailer lines read
        self._need = 0  # bytes of the body (or of the chunk, with its CRLF) still to come
        self._body: list[bytes] = []
        self.answer: Answer | None = None
        self.keep = False
        self.to_end = False  # the body runs to the connection's end

    def feed(self, data: bytes) -> bool:
        if self._state == _DONE:
            if data:  # past the whole answer: no request asked for it
                self.keep = False
            return True
        self._buffer += data
        while self._step():
            if self._state == _DONE:
                return True
        return False

    def end(self) -> bool:
        """The connection ended (an empty read)."""
        if self._state == _DONE:
            return True
        if self._state == _TO_END:
            self._body.append(bytes(self._buffer))
            self._buffer.clear()
            self._finish(keep=False)
            return True
        raise ConnectionClosedError(endpoint_url=self._url)

    # -- the states ----------------------------------------------------------------------

    def _step(self) -> bool:
        """Take what the buffer holds for the state; False when it needs more bytes."""
        state = self._state
        if state in (_LENGTH, _CHUNK):
            return self._take_body()
        if state == _TO_END:
            if self._buffer:
                self._body.append(bytes(self._buffer))
                self._buffer.clear()
            return False
        line = self._line()
        if line is None:
            return False
        if state == _STATUS:
            self._status_line(line)
        elif state == _HEADERS:
            self._header_line(line)
        elif state == _CHUNK_SIZE:
            self._chunk_size(line)
        else:  # _TRAILERS
            if line in (b"\r\n", b"\n"):
                self._finish(self._keep)
            else:
                self._count_line()
        return True

    def _line(self) -> bytes | None:
        """The next whole line with its end, or None until one has come."""
        buffer = self._buffer
        end = buffer.find(b"\n")
        if end < 0:
            if len(buffer) > LINE_MOST:
                raise self._garbled("a line longer than 64 KiB")
            return None
        if end >= LINE_MOST:
            raise self._garbled("a line longer than 64 KiB")
        line = bytes(buffer[: end + 1])
        del buffer[: end + 1]
        return line

    def _status_line(self, line: bytes) -> None:
        version, _, rest = line.partition(b" ")
        try:
            status = int(rest[:3])
        except ValueError:
            raise self._garbled(f"the status line {line[:100]!r}") from None
        if not version.startswith(b"HTTP/1.") or not 100 <= status <= 599:
            raise self._garbled(f"the status line {line[:100]!r}")
        if status < 200:
            raise self._garbled(f"an interim answer ({status}) to a request that asked none")
        self._status = status
        self._keep = version == b"HTTP/1.1"
        self._state = _HEADERS

    def _header_line(self, line: bytes) -> None:
        headers = self._headers
        if line not in (b"\r\n", b"\n"):
            self._count_line()
            name, colon, value = line.partition(b":")
            if not colon:
                raise self._garbled(f"a header line {line[:100]!r}")
            key = name.strip().lower().decode("latin-1")
            text = value.strip().decode("latin-1")
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
            return
        self._lines = 0
        if "close" in headers.get("connection", "").lower():
            self._keep = False
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self._state = _CHUNK_SIZE
        elif "content-length" in headers:
            text = headers["content-length"]
            if not text.isdigit():
                raise self._garbled(f"Content-Length {text!r}")
            self._need = int(text)
            self._state = _LENGTH
        else:  # the body ends where the connection does
            self._keep, self.to_end = False, True
            self._state = _TO_END

    def _count_line(self) -> None:
        self._lines += 1
        if self._lines >= HEADERS_MOST:
            raise self._garbled(f"more than {HEADERS_MOST} header lines")

    def _chunk_size(self, line: bytes) -> None:
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            size = -1
        if size < 0:
            raise self._garbled(f"a chunk size {line[:100]!r}")
        if size == 0:
            self._state = _TRAILERS
        else:
            self._need = size + 2  # its CRLF too
            self._state = _CHUNK

    def _take_body(self) -> bool:
        buffer, need = self._buffer, self._need
        if len(buffer) < need:
            return False
        data = bytes(buffer[:need])
        del buffer[:need]
        if self._state == _LENGTH:
            self._body.append(data)
            self._finish(self._keep)
            return True
        if not data.endswith(b"\r\n"):  # more (or less) than the chunk's size said
            size = need - 2
            raise self._garbled(f"a chunk of {size} bytes followed by {data[size:]!r}")
        self._body.append(data[:-2])
        self._state = _CHUNK_SIZE
        return True

    def _finish(self, keep: bool) -> None:
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self.answer = Answer(self._status, self._headers, body)
        self.keep = keep and not self._buffer
        self._state = _DONE

    def _garbled(self, what: str) -> HTTPClientError:
        return HTTPClientError(error=ValueError(f"{what} from {self._url} is not HTTP/1.1"))
