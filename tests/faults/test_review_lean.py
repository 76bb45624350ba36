"""A review of the lean client (transports/lean.py): what it must do exactly as botocore
does, tried where the two could part."""

from __future__ import annotations

import datetime
import shutil
import ssl
import subprocess
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Event, Thread
from types import MappingProxyType

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError, ReadTimeoutError

from sqsworker.errors import TransportError
from sqsworker.local import LocalSQS
from sqsworker.transports import Envelope, OutgoingMessage, QueueInfo
from sqsworker.transports.lean import LeanSQS
from sqsworker.transports.sqs import SQSTransport

from ..conftest import unique

pytestmark = pytest.mark.integration


def test_a_modeled_error_is_raised_as_botocores_own_class(
    local_sqs: LocalSQS, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQS names its errors twice (the JSON ``__type`` and the query-era code in
    ``x-amzn-query-error``); botocore picks the exception class by the first, so a gone
    queue is ``QueueDoesNotExist``, not a bare ``ClientError``, on both clients."""
    for key, value in local_sqs.env().items():
        monkeypatch.setenv(key, value)
    queue = unique("review-class")
    local_sqs.create_queue(queue, max_receive_count=None)
    transport = SQSTransport.connect(queue, endpoint_url=local_sqs.endpoint_url)
    assert transport.lean is not None and transport.lean.ready
    transport.request("DeleteQueue", QueueUrl=transport.info.url)
    params = {"QueueUrl": transport.info.url, "MaxNumberOfMessages": 1}
    raised: dict[str, type[Exception]] = {}
    for client, call in (
        ("boto3", lambda: transport.client.receive_message(**params)),
        ("lean", lambda: transport.lean.call("ReceiveMessage", params)),  # type: ignore[union-attr]
    ):
        with pytest.raises(ClientError) as caught:
            call()
        raised[client] = type(caught.value)
    assert raised["lean"] is raised["boto3"] is transport.client.exceptions.QueueDoesNotExist


_ANSWER = b'{"Messages":[{"MessageId":"m1","ReceiptHandle":"h1","Body":"a\\ud800b"}]}'


class _Endpoint(BaseHTTPRequestHandler):
    """An SQS endpoint whose answer holds a lone surrogate (JSON allows the escape; Python's
    json reads it, as botocore does); ``answer`` changes it."""

    answer = _ANSWER
    stall: Event | None = None  # set: hold each answer until it is set

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        if self.stall is not None:
            self.stall.wait(30)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-amz-json-1.0")
        self.send_header("Content-Length", str(len(self.answer)))
        self.end_headers()
        self.wfile.write(self.answer)


@pytest.fixture
def endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Endpoint)
    thread = Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


def test_an_answer_python_json_reads_is_read_alike_by_both_clients(endpoint: str) -> None:
    """orjson refuses a lone surrogate that Python's json (botocore's) reads: a receive
    whose answer holds one must not be called a garbled answer (a retryable fault that
    leaves the batch's messages in flight, received again and refused again until the
    dead-letter queue takes all ten)."""
    info = QueueInfo(url=f"{endpoint}/000000000000/q", name="q", arn="")
    transport = SQSTransport.reopen(info, endpoint_url=endpoint)
    assert transport.lean is not None
    plain = [m.body for m in transport.receive(10, 0, 30)]  # botocore's; the lean one learns
    assert transport.lean.ready
    lean = [m.body for m in transport.receive(10, 0, 30)]
    assert lean == plain == ["a\ud800b"]


@pytest.mark.parametrize("answer", [b"null", b"[]", b'"ok"'])
def test_json_that_is_not_an_object_is_a_retryable_fault(
    endpoint: str, monkeypatch: pytest.MonkeyPatch, answer: bytes
) -> None:
    """JSON that is no object (a proxy's ``null``) is a garbled answer, not a crash of the
    caller's thread with an AttributeError that no retry or translation sees."""
    info = QueueInfo(url=f"{endpoint}/000000000000/q", name="q", arn="")
    transport = SQSTransport.reopen(info, endpoint_url=endpoint)
    assert transport.lean is not None
    transport.receive(10, 0, 30)  # botocore's, from which the lean client learns
    monkeypatch.setattr(_Endpoint, "answer", answer)
    with pytest.raises(TransportError) as caught:
        transport.receive(10, 0, 30)
    assert (caught.value.code, caught.value.retryable) == ("ConnectionError", True)


def test_binary_and_unicode_travel_alike_on_both_clients(
    local_sqs: LocalSQS, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sent by one client and received by the other, both ways: binary attributes (single
    and list), text beyond the BMP and a body near the 1 MiB cap arrive as they left."""
    for key, value in local_sqs.env().items():
        monkeypatch.setenv(key, value)
    queue = unique("review-binary")
    local_sqs.create_queue(queue, max_receive_count=None)
    clients = {
        c: SQSTransport.connect(queue, endpoint_url=local_sqs.endpoint_url, sqs_client=c)
        for c in ("boto3", "lean")
    }
    attributes = {
        "blob": {"DataType": "Binary", "BinaryValue": bytes(range(256))},
        "text": {"DataType": "String", "StringValue": "é\U0001f600\u2028"},
    }
    big = "\U0001f600" * (1_048_576 // 4 - 64)  # 4 bytes each in UTF-8
    for sender, receiver in (("lean", "boto3"), ("boto3", "lean")):
        sent = clients[sender].send_batch(
            [OutgoingMessage("x\U0001f600", message_attributes=attributes), OutgoingMessage(big)]
        )
        assert sent.failed == [] and len(sent.succeeded) == 2, sender
        got: list[Envelope] = []
        while len(got) < 2:
            got += clients[receiver].receive(10, 1, 30)
        by_body = {m.body[:2]: m for m in got}
        assert by_body["x\U0001f600"].message_attributes["blob"]["BinaryValue"] == bytes(range(256))
        assert (
            by_body["x\U0001f600"].message_attributes["text"]["StringValue"] == "é\U0001f600\u2028"
        )
        assert by_body[big[:2]].body == big
        clients[receiver].delete_batch([(str(i), m.receipt_handle) for i, m in enumerate(got)])


def _certificate(directory: Path, name: str) -> tuple[Path, Path]:
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    command = (
        "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -addext subjectAltName=IP:127.0.0.1"
    )
    subprocess.run(
        [*command.split(), "-keyout", str(key), "-out", str(cert), "-subj", f"/CN={name}"],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_the_lean_client_verifies_tls_with_the_ca_bundle_the_environment_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An https endpoint whose certificate only AWS_CA_BUNDLE vouches for: the lean client
    reads its answers; once the endpoint shows a certificate nobody vouches for, the lean
    request is refused (a retryable connection fault), not sent."""
    trusted, trusted_key = _certificate(tmp_path, "trusted")
    stranger, stranger_key = _certificate(tmp_path, "stranger")
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CA_BUNDLE": str(trusted),
    }.items():
        monkeypatch.setenv(name, value)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(trusted, trusted_key)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Endpoint)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        endpoint = f"https://127.0.0.1:{server.server_address[1]}"
        info = QueueInfo(url=f"{endpoint}/000000000000/q", name="q", arn="")
        transport = SQSTransport.reopen(info, endpoint_url=endpoint)
        assert transport.lean is not None
        transport.receive(10, 0, 30)  # botocore's, from which the lean client learns
        assert transport.lean.ready and transport.lean.url == f"{endpoint}/"
        assert [m.body for m in transport.receive(10, 0, 30)] == ["a\ud800b"]
        context.load_cert_chain(stranger, stranger_key)  # new handshakes show the stranger
        with pytest.raises(TransportError) as caught:
            transport.receive(10, 0, 30)
        assert (caught.value.code, caught.value.retryable) == ("ConnectionError", True)
        assert "CERTIFICATE_VERIFY_FAILED" in str(caught.value)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.parametrize(
    "value",
    [
        MappingProxyType({"DataType": "String", "StringValue": "x"}),
        {"DataType": "String", "StringValue": datetime.datetime(2026, 11, 27)},
        {"DataType": "Number", "StringValue": 5},
        {"DataType": "String.Array", "StringListValues": {"x"}},
    ],
    ids=["mappingproxy", "datetime", "int", "set"],
)
def test_an_attribute_botocore_refuses_is_refused_alike_by_the_lean_client(
    local_sqs: LocalSQS, monkeypatch: pytest.MonkeyPatch, value: object
) -> None:
    """A message attribute of a type SQS's model does not take: botocore refuses it before
    sending; the lean client must not send it as orjson writes it (a datetime as text, an
    int as a number the endpoint refuses with a 500 that is retried) nor raise a TypeError
    that no caller expects."""
    for key, env in local_sqs.env().items():
        monkeypatch.setenv(key, env)
    queue = unique("review-params")
    local_sqs.create_queue(queue, max_receive_count=None)
    seen = {}
    for client in ("boto3", "lean"):
        transport = SQSTransport.connect(
            queue, endpoint_url=local_sqs.endpoint_url, attempts=1, sqs_client=client
        )
        with pytest.raises(TransportError) as caught:
            transport.send_batch([OutgoingMessage("b", message_attributes={"a": value})])
        seen[client] = (caught.value.code, caught.value.retryable)
    assert seen["lean"] == seen["boto3"] == ("ParamValidationError", False)
    assert (
        local_sqs.client().get_queue_attributes(
            QueueUrl=transport.info.url, AttributeNames=["ApproximateNumberOfMessages"]
        )["Attributes"]["ApproximateNumberOfMessages"]
        == "0"
    )


def test_a_stalled_lean_request_ends_at_the_clients_read_timeout(endpoint: str) -> None:
    """An endpoint that takes the request and never answers: the lean request ends with
    botocore's ReadTimeoutError (the client's read timeout, here 1 s), not never."""
    session = boto3.session.Session()
    client = session.client(
        "sqs",
        endpoint_url=endpoint,
        config=Config(read_timeout=1, connect_timeout=1, retries={"total_max_attempts": 1}),
    )
    lean = LeanSQS(client, session.get_credentials())
    client.receive_message(QueueUrl=f"{endpoint}/000000000000/q")  # the lean client learns
    assert lean.ready
    released = Event()
    _Endpoint.stall = released
    try:
        with pytest.raises(ReadTimeoutError):
            lean.call("ReceiveMessage", {"QueueUrl": f"{endpoint}/000000000000/q"})
    finally:
        released.set()
        _Endpoint.stall = None
