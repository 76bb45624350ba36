"""``python -m bench.endpoint [--port 0] [--latency-ms MS] [--tls CERT KEY]``: endless SQS.

An HTTP/1.1 server in a process of its own that speaks SQS's JSON protocol (what botocore
sends today: ``POST /``, ``X-Amz-Target: AmazonSQS.<Action>``, a JSON body) and, for
older clients, the query protocol (``Action=<Action>`` form-encoded, XML answers). It
answers at once (or after ``--latency-ms``, without holding up other connections) and
does no bookkeeping: every ``ReceiveMessage`` returns as many fresh messages as were asked
for (a new message id and receipt handle each), every batch call reports each entry done,
every queue exists. So a consumer measured against it pays only for its own work: its
client, its threads, its handler. Signatures are not checked. A queue serves ``{"n": 1}``
until messages are sent to it; from then on, copies of the last 1,000 sent to it, in turn
(body and message attributes): a framework with an envelope of its own (Celery, dramatiq,
sqs-workers) sends some with its own producer, and is then served endless copies (a
framework that tracks its tasks by ID meets one ID again only 1,000 messages later).

With ``--tls`` it speaks HTTPS with that certificate, as SQS does (``Endpoint(tls=True)``
makes one for 127.0.0.1, and its ``ca`` is what a client trusts: ``AWS_CA_BUNDLE``).

It prints its URL (``http://127.0.0.1:PORT``) on the first line of stdout, and answers
``GET /stats`` with a JSON object: requests by action, and messages received, deleted,
made visible again (visibility 0), extended and sent. ``Endpoint`` runs it from Python.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

ACCOUNT = "000000000000"
BODY = '{"n": 1}'
BODY_MD5 = hashlib.md5(BODY.encode()).hexdigest()
# Real receipt handles are about 180 characters; a client's cost grows with their length.
HANDLE_TAIL = "A" * 160
JSON_TYPE = "application/x-amz-json-1.0"
XMLNS = "http://queue.amazonaws.com/doc/2012-11-05/"
QUEUE_ATTRIBUTES = {
    "VisibilityTimeout": "30",
    "MaximumMessageSize": "262144",
    "MessageRetentionPeriod": "345600",
    "DelaySeconds": "0",
    "ReceiveMessageWaitTimeSeconds": "0",
    "ApproximateNumberOfMessages": "1000000",
    "ApproximateNumberOfMessagesNotVisible": "0",
    "ApproximateNumberOfMessagesDelayed": "0",
    "CreatedTimestamp": "1700000000",
    "LastModifiedTimestamp": "1700000000",
    "SqsManagedSseEnabled": "true",
}


class Service:
    """The endpoint's answers, one function of (action, parameters); counts as it goes."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.requests: Counter[str] = Counter()
        self.messages: Counter[str] = Counter()
        self._next = 0
        self._served: dict[str, list[dict[str, Any]]] = {}  # queue name: the last sent
        self._turn: Counter[str] = Counter()  # queue name: the next of them to serve

    def stats(self) -> dict[str, Any]:
        return {"requests": dict(self.requests), **self.messages}

    def answer(self, action: str, params: dict[str, Any]) -> dict[str, Any]:
        self.requests[action] += 1
        handler = getattr(self, "_" + action, None)
        if handler is None:
            raise Fault("InvalidAction", f"The action {action} is not valid for this endpoint.")
        result: dict[str, Any] = handler(params)
        return result

    def _url(self, name: str) -> str:
        return f"{self.base}/{ACCOUNT}/{name}"

    def _name(self, params: dict[str, Any]) -> str:
        return str(params.get("QueueUrl", "queue")).rstrip("/").rsplit("/", 1)[-1]

    def _GetQueueUrl(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"QueueUrl": self._url(str(params.get("QueueName", "queue")))}

    _CreateQueue = _GetQueueUrl

    def _ListQueues(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"QueueUrls": [self._url("queue")]}

    def _GetQueueAttributes(self, params: dict[str, Any]) -> dict[str, Any]:
        name = self._name(params)
        attributes = dict(QUEUE_ATTRIBUTES)
        attributes["QueueArn"] = f"arn:aws:sqs:us-east-1:{ACCOUNT}:{name}"
        if name.endswith(".fifo"):
            attributes["FifoQueue"] = "true"
        return {"Attributes": attributes}

    def _SetQueueAttributes(self, params: dict[str, Any]) -> dict[str, Any]:
        return {}

    _PurgeQueue = _DeleteQueue = _SetQueueAttributes

    def _ReceiveMessage(self, params: dict[str, Any]) -> dict[str, Any]:
        count = max(1, min(10, int(params.get("MaxNumberOfMessages", 1))))
        now = str(int(time.time() * 1000))
        attributes = {
            "SenderId": ACCOUNT,
            "ApproximateReceiveCount": "1",
            "SentTimestamp": now,
            "ApproximateFirstReceiveTimestamp": now,
        }
        first, self._next = self._next, self._next + count
        self.messages["received"] += count
        name = self._name(params)
        served = self._served.get(name) or [{"Body": BODY, "MD5OfBody": BODY_MD5}]
        turn, self._turn[name] = self._turn[name], self._turn[name] + count
        return {
            "Messages": [
                {
                    "MessageId": f"00000000-0000-4000-8000-{n:012x}",
                    "ReceiptHandle": f"{n:012d}{HANDLE_TAIL}",
                    **served[(turn + i) % len(served)],
                    "Attributes": attributes,
                }
                for i, n in enumerate(range(first, first + count))
            ]
        }

    def _DeleteMessageBatch(self, params: dict[str, Any]) -> dict[str, Any]:
        entries = params.get("Entries", [])
        self.messages["deleted"] += len(entries)
        return {"Successful": [{"Id": e["Id"]} for e in entries], "Failed": []}

    def _ChangeMessageVisibilityBatch(self, params: dict[str, Any]) -> dict[str, Any]:
        entries = params.get("Entries", [])
        for entry in entries:
            zero = int(entry.get("VisibilityTimeout", 0)) == 0
            self.messages["returned" if zero else "extended"] += 1
        return {"Successful": [{"Id": e["Id"]} for e in entries], "Failed": []}

    def _DeleteMessage(self, params: dict[str, Any]) -> dict[str, Any]:
        self.messages["deleted"] += 1
        return {}

    def _ChangeMessageVisibility(self, params: dict[str, Any]) -> dict[str, Any]:
        zero = int(params.get("VisibilityTimeout", 0)) == 0
        self.messages["returned" if zero else "extended"] += 1
        return {}

    def _SendMessage(self, params: dict[str, Any]) -> dict[str, Any]:
        self.messages["sent"] += 1
        body = str(params.get("MessageBody", ""))
        digest = hashlib.md5(body.encode()).hexdigest()
        served: dict[str, Any] = {"Body": body, "MD5OfBody": digest}
        if params.get("MessageAttributes"):
            served["MessageAttributes"] = params["MessageAttributes"]
        sent = self._served.setdefault(self._name(params), [])
        sent.append(served)
        del sent[:-1000]
        return {
            "MessageId": f"00000000-0000-4000-9000-{self.messages['sent']:012x}",
            "MD5OfMessageBody": digest,
        }

    def _SendMessageBatch(self, params: dict[str, Any]) -> dict[str, Any]:
        successful = []
        for entry in params.get("Entries", []):
            sent = self._SendMessage({**entry, "QueueUrl": params.get("QueueUrl", "")})
            successful.append({"Id": entry["Id"], **sent})
        return {"Successful": successful, "Failed": []}


class Fault(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


# -- the query protocol: form parameters in, XML out -------------------------------


def _query_params(form: dict[str, list[str]]) -> tuple[str, dict[str, Any]]:
    """``Action=...&Entries.member.1.Id=...`` (or ``DeleteMessageBatchRequestEntry.1.Id``)
    to the JSON protocol's shape, as far as this endpoint reads it."""
    flat = {key: values[-1] for key, values in form.items()}
    action = flat.pop("Action", "")
    params: dict[str, Any] = {}
    entries: dict[str, dict[str, str]] = {}
    for key, value in flat.items():
        parts = key.split(".")
        if len(parts) >= 3 and parts[-2].isdigit() and "Entry" in key:
            entries.setdefault(parts[-2], {})[parts[-1]] = value
        else:
            params[key] = value
    if entries:
        params["Entries"] = [entries[k] for k in sorted(entries, key=int)]
    return action, params


def _xml(value: Any, name: str) -> str:
    if isinstance(value, dict):
        if name == "Attributes":
            return "".join(
                f"<Attribute><Name>{escape(k)}</Name><Value>{escape(str(v))}</Value></Attribute>"
                for k, v in value.items()
            )
        return "".join(f"<{k}>{_xml(v, k)}</{k}>" for k, v in value.items())
    return escape(str(value))


def _query_answer(action: str, result: dict[str, Any]) -> str:
    inner = []
    for key, value in result.items():
        if key == "Messages":
            inner += [f"<Message>{_xml(m, 'Message')}</Message>" for m in value]
        elif key in ("Successful", "Failed"):
            tag = f"{action}Result{'Entry' if key == 'Successful' else ''}"
            tag = "BatchResultErrorEntry" if key == "Failed" else tag + ""
            inner += [f"<{tag}>{_xml(e, tag)}</{tag}>" for e in value]
        elif key == "QueueUrls":
            inner += [f"<QueueUrl>{escape(u)}</QueueUrl>" for u in value]
        else:
            inner.append(_xml({key: value}, ""))
    return (
        f'<{action}Response xmlns="{XMLNS}"><{action}Result>{"".join(inner)}</{action}Result>'
        f"<ResponseMetadata><RequestId>00000000-0000-0000-0000-000000000000</RequestId>"
        f"</ResponseMetadata></{action}Response>"
    )


# -- HTTP/1.1, keep-alive ----------------------------------------------------------------


class Connection(asyncio.Protocol):
    def __init__(self, service: Service, latency: float) -> None:
        self.service = service
        self.latency = latency
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].decode("latin-1").split("\r\n")
            headers = {}
            for line in head[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length", 0))
            if len(self.buffer) < end + 4 + length:
                return
            body = self.buffer[end + 4 : end + 4 + length]
            self.buffer = self.buffer[end + 4 + length :]
            method, path, _ = head[0].split(" ", 2)
            status, content_type, extra, payload = self.handle(method, path, headers, body)
            response = (
                f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(payload)}\r\nx-amzn-RequestId: "
                f"00000000-0000-0000-0000-000000000000\r\n{extra}\r\n"
            ).encode() + payload
            if self.latency:
                asyncio.get_running_loop().call_later(self.latency, self._write, response)
            else:
                self._write(response)

    def _write(self, response: bytes) -> None:
        if self.transport and not self.transport.is_closing():
            self.transport.write(response)

    def handle(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[str, str, str, bytes]:
        if method == "GET" and path.startswith("/stats"):
            return "200 OK", "application/json", "", json.dumps(self.service.stats()).encode()
        target = headers.get("x-amz-target", "")
        if target:
            action = target.rpartition(".")[2]
            try:
                result = self.service.answer(action, json.loads(body or b"{}"))
            except Fault as fault:
                error = {"__type": f"com.amazonaws.sqs#{fault.code}", "message": str(fault)}
                extra = f"x-amzn-query-error: {fault.code};Sender\r\n"
                return "400 Bad Request", JSON_TYPE, extra, json.dumps(error).encode()
            return "200 OK", JSON_TYPE, "", json.dumps(result).encode()
        action, params = _query_params(urllib.parse.parse_qs(body.decode()))
        try:
            result = self.service.answer(action, params)
        except Fault as fault:
            error = (
                f'<ErrorResponse xmlns="{XMLNS}"><Error><Type>Sender</Type>'
                f"<Code>{fault.code}</Code><Message>{escape(str(fault))}</Message></Error>"
                "</ErrorResponse>"
            )
            return "400 Bad Request", "text/xml", "", error.encode()
        return "200 OK", "text/xml", "", _query_answer(action, result).encode()


async def serve(host: str, port: int, latency: float, tls: tuple[str, str] | None = None) -> None:
    loop = asyncio.get_running_loop()
    holder: list[Service] = []
    context = None
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*tls)
    server = await loop.create_server(
        lambda: Connection(holder[0], latency), host, port, ssl=context
    )
    bound = server.sockets[0].getsockname()[1]
    url = f"{'https' if tls else 'http'}://{host}:{bound}"
    holder.append(Service(url))
    print(url, flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


class Endpoint:
    """The endpoint in a process of its own: ``with Endpoint(latency_ms=20) as e: e.url``."""

    def __init__(
        self, latency_ms: float = 0, pythonpath: str | None = None, tls: bool = False
    ) -> None:
        self.latency_ms = latency_ms
        self.pythonpath = pythonpath or str(Path(__file__).resolve().parents[1])
        self.process: subprocess.Popen[str] | None = None
        self.url = ""
        self.tls = tls
        self.ca = ""  # with tls: the certificate a client trusts (AWS_CA_BUNDLE)
        self._folder: tempfile.TemporaryDirectory[str] | None = None

    def __enter__(self) -> Endpoint:
        env = {**os.environ, "PYTHONPATH": self.pythonpath}
        command = [sys.executable, "-m", "bench.endpoint", "--latency-ms", str(self.latency_ms)]
        if self.tls:
            self._folder = tempfile.TemporaryDirectory()
            cert, key = certificate(Path(self._folder.name))
            self.ca = cert
            command += ["--tls", cert, key]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
        assert self.process.stdout is not None
        self.url = self.process.stdout.readline().strip()
        if not self.url:
            raise RuntimeError("the endpoint did not start")
        return self

    def stats(self) -> dict[str, Any]:
        context = ssl.create_default_context(cafile=self.ca) if self.ca else None
        with urllib.request.urlopen(f"{self.url}/stats", timeout=10, context=context) as response:
            result: dict[str, Any] = json.load(response)
        return result

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def __exit__(self, *exc: object) -> None:
        if self.process:
            self.process.terminate()
            self.process.wait(10)
        if self._folder is not None:
            self._folder.cleanup()


def certificate(folder: Path) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 and its key, made by openssl in ``folder``."""
    cert, key = folder / "endpoint.pem", folder / "endpoint.key"
    made = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
    made += ["-addext", "subjectAltName=IP:127.0.0.1", "-subj", "/CN=127.0.0.1"]
    subprocess.run([*made, "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return str(cert), str(key)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: any free port")
    parser.add_argument("--latency-ms", type=float, default=0, help="added to every answer")
    parser.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"), help="speak HTTPS")
    args = parser.parse_args()
    tls = (args.tls[0], args.tls[1]) if args.tls else None
    asyncio.run(serve(args.host, args.port, args.latency_ms / 1000, tls))


if __name__ == "__main__":
    main()
