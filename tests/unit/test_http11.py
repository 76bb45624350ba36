"""The sans-IO reading of an HTTP/1.1 answer (transports/http11.py): an answer read whole
is the same however its bytes come, and a broken one fails the same way."""

from __future__ import annotations

import pytest
from botocore.exceptions import ConnectionClosedError, HTTPClientError

from sqsworker.transports.http11 import AnswerReader

URL = "http://127.0.0.1:1/"

ANSWERS = {
    "length": (
        b'HTTP/1.1 200 OK\r\nContent-Length: 8\r\nX-A: 1\r\n\r\n{"a": 1}',
        200,
        b'{"a": 1}',
        True,
    ),
    "chunked": (
        b"HTTP/1.1 400 Bad\r\nTransfer-Encoding: chunked\r\n\r\n"
        b'4;ext=1\r\n{"a"\r\n5\r\n: 1}\n\r\n0\r\nTrail: x\r\n\r\n',
        400,
        b'{"a": 1}\n',
        True,
    ),
    "lf-only": (b"HTTP/1.1 200 OK\nContent-Length: 2\n\n{}", 200, b"{}", True),
    "http-1.0": (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n{}", 200, b"{}", False),
    "close": (
        b"HTTP/1.1 200 OK\r\nConnection: Close\r\nContent-Length: 2\r\n\r\n{}",
        200,
        b"{}",
        False,
    ),
    "empty": (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", 200, b"", True),
}


def read(data: bytes, piece: int) -> AnswerReader:
    reader = AnswerReader(URL)
    whole = False
    for start in range(0, len(data), piece):
        assert not whole, "whole before its last byte"
        whole = reader.feed(data[start : start + piece])
    assert whole
    return reader


@pytest.mark.parametrize("name", list(ANSWERS))
@pytest.mark.parametrize("piece", [1, 2, 7, 1 << 20])
def test_an_answer_reads_the_same_however_its_bytes_come(name: str, piece: int) -> None:
    data, status, body, keep = ANSWERS[name]
    reader = read(data, piece)
    assert reader.answer is not None
    assert (reader.answer.status, reader.answer.body, reader.keep) == (status, body, keep)


def test_headers_are_named_in_lower_case_and_repeats_joined() -> None:
    reader = read(b"HTTP/1.1 200 OK\r\nX-Id: a\r\nx-id: b\r\nContent-Length: 0\r\n\r\n", 3)
    assert reader.answer is not None and reader.answer.headers["x-id"] == "a, b"


def test_bytes_past_the_answer_leave_the_connection_unusable() -> None:
    data = ANSWERS["length"][0]
    assert not read(data + b"HTTP/1.1", 1 << 20).keep  # came with it
    reader = read(data, 1 << 20)
    assert reader.keep
    reader.feed(b"x")  # came after it
    assert not reader.keep


def test_a_body_to_the_connection_s_end_is_whole_at_the_end() -> None:
    reader = AnswerReader(URL)
    assert not reader.feed(b'HTTP/1.1 200 OK\r\n\r\n{"x"')
    assert not reader.feed(b": 1}")
    assert reader.end() and reader.to_end and not reader.keep
    assert reader.answer is not None and reader.answer.body == b'{"x": 1}'


@pytest.mark.parametrize(
    "cut",
    [
        b"",
        b"HTTP/1.1 200 OK\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n",
    ],
    ids=["nothing", "headers", "body", "chunks"],
)
def test_an_answer_cut_short_by_the_connection_s_end_is_a_closed_connection(cut: bytes) -> None:
    reader = AnswerReader(URL)
    assert not reader.feed(cut)
    with pytest.raises(ConnectionClosedError):
        reader.end()


@pytest.mark.parametrize(
    "data",
    [
        b"SSH-2.0-OpenSSH\r\n",
        b"HTTP/1.1 2x0 OK\r\n",
        b"HTTP/1.1 100 Continue\r\n",
        b"HTTP/1.1 200 OK\r\nno colon\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}}\r\n",
        b"HTTP/1.1 200 OK\r\n" + b"X-A: 1\r\n" * 100,
        b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70_000,
    ],
    ids=[
        "not-http",
        "status",
        "interim",
        "header",
        "length",
        "chunk-size",
        "chunk",
        "many",
        "long",
    ],
)
def test_an_answer_that_is_not_http_is_an_http_client_error(data: bytes) -> None:
    with pytest.raises(HTTPClientError):
        AnswerReader(URL).feed(data)
