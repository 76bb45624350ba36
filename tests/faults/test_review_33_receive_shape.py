"""Review 33: a receive answer whose message has no handle (JSON null), on both clients
(commit 887798a: "messages without their handle fail the call as not answered,
retryable, on both clients")."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sqsworker.errors import TransportError
from sqsworker.transports import UNANSWERED, QueueInfo
from sqsworker.transports.sqs import SQSTransport

# What a proxy or a stub may answer: the message's handle (and body) null.
ANSWER = {"Messages": [{"MessageId": "m-1", "ReceiptHandle": None, "Body": None}]}


class _Fixed(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        body = json.dumps(ANSWER).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-amz-json-1.0")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    for key, value in {
        "AWS_ACCESS_KEY_ID": "local",
        "AWS_SECRET_ACCESS_KEY": "local",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Fixed)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("client", ["boto3", "lean"])
def test_a_message_with_a_null_handle_fails_the_receive_on_both_clients(
    endpoint: str, client: str
) -> None:
    info = QueueInfo(url=f"{endpoint}/123456789012/q", name="q", arn="arn:aws:sqs:::q")
    transport = SQSTransport.reopen(info, endpoint_url=endpoint, sqs_client=client)
    try:
        got = transport.receive(10, 0, 30)
    except TransportError as exc:
        assert (exc.code, exc.retryable) == (UNANSWERED, True)
        return
    finally:
        transport.close()
    pytest.fail(f"{client}: a message without its handle was received: {got}")
