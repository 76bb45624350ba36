"""``python -m bench.calls [--calls N] [--rounds R]``: the CPU of one SQS call, client by client.

One thread makes N receives of 10 and N delete batches of 10 against ``bench.endpoint``
(another process, answering at once), and reports this process's CPU per call. Each
client runs in a process of its own, rounds alternating the order; medians:

- ``botocore``: the client as sqsworker configures it (``SQSTransport``'s ``boto3`` client);
- ``botocore, no validation``: the same with ``parameter_validation=False``;
- ``botocore, no CRT``: ``BOTO_DISABLE_CRT=true`` (botocore signs in Python; with awscrt
  installed, it signs with awscrt's signer);
- ``lean``: ``transports/lean.py``: orjson, SigV4 with a cached key, sent over keep-alive
  connections of its own (``transports/wire.py``);
- ``lean, botocore's session``: the same requests sent through botocore's own urllib3
  session (as the lean client does where a proxy applies, and did before ``wire.py``);
- ``awscrt``: awscrt's HTTP connection and SigV4 signer (a connection of its own, signing
  and waiting on awscrt's futures), orjson: what the C client would cost;
- ``SQSTransport lean`` and ``SQSTransport boto3``: the transport's own calls (retry wrapper,
  request counts, the envelopes) on each client.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from io import BytesIO
from typing import Any
from urllib.parse import urlsplit

from .endpoint import Endpoint

CLIENTS = [
    "botocore",
    "botocore, no validation",
    "botocore, no CRT",
    "lean",
    "lean, botocore's session",
    "awscrt",
    "SQSTransport boto3",
    "SQSTransport lean",
]


def _botocore(url: str, validation: bool = True) -> tuple[Any, Any]:
    import boto3
    from botocore.config import Config

    client = boto3.session.Session().client(
        "sqs",
        endpoint_url=url,
        config=Config(
            retries={"total_max_attempts": 1, "mode": "standard"},
            parameter_validation=validation,
        ),
    )
    queue = client.get_queue_url(QueueName="bench")["QueueUrl"]

    def receive() -> list[dict[str, Any]]:
        return list(
            client.receive_message(
                QueueUrl=queue,
                MaxNumberOfMessages=10,
                WaitTimeSeconds=0,
                MessageSystemAttributeNames=["All"],
                MessageAttributeNames=["All"],
            )["Messages"]
        )

    def delete(handles: list[str]) -> None:
        entries = [{"Id": str(i), "ReceiptHandle": h} for i, h in enumerate(handles)]
        client.delete_message_batch(QueueUrl=queue, Entries=entries)

    return receive, delete


def _lean(url: str, session: bool = False) -> tuple[Any, Any]:
    from sqsworker.transports.sqs import SQSTransport

    transport = SQSTransport.connect("bench", endpoint_url=url, sqs_client="lean")
    lean, queue = transport.lean, transport.info.url
    assert lean is not None and lean.ready and lean.wire is not None
    if session:
        lean.wire = None

    def receive() -> list[dict[str, Any]]:
        params = {
            "QueueUrl": queue,
            "MaxNumberOfMessages": 10,
            "WaitTimeSeconds": 0,
            "MessageSystemAttributeNames": ["All"],
            "MessageAttributeNames": ["All"],
        }
        return list(lean.call("ReceiveMessage", params)["Messages"])

    def delete(handles: list[str]) -> None:
        entries = [{"Id": str(i), "ReceiptHandle": h} for i, h in enumerate(handles)]
        lean.call("DeleteMessageBatch", {"QueueUrl": queue, "Entries": entries})

    return receive, delete


def _transport(url: str, kind: str) -> tuple[Any, Any]:
    from sqsworker.transports.sqs import SQSTransport

    transport = SQSTransport.connect("bench", endpoint_url=url, sqs_client=kind)

    def receive() -> list[Any]:
        return [{"ReceiptHandle": e.receipt_handle} for e in transport.receive(10, 0, 30)]

    def delete(handles: list[str]) -> None:
        transport.delete_batch([(str(i), h) for i, h in enumerate(handles)])

    return receive, delete


def _awscrt(url: str) -> tuple[Any, Any]:
    import orjson
    from awscrt import auth, http, io

    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or 80
    loop = io.EventLoopGroup(1)
    bootstrap = io.ClientBootstrap(loop, io.DefaultHostResolver(loop))
    connection = http.HttpClientConnection.new(host_name=host, port=port, bootstrap=bootstrap)
    connection = connection.result(10)
    queue = f"{url}/000000000000/bench"

    def call(action: str, params: dict[str, Any]) -> dict[str, Any]:
        body = orjson.dumps(params)
        headers = http.HttpHeaders(
            [
                ("Host", parts.netloc),
                ("Content-Type", "application/x-amz-json-1.0"),
                ("X-Amz-Target", f"AmazonSQS.{action}"),
                ("Content-Length", str(len(body))),
            ]
        )
        request = http.HttpRequest("POST", "/", headers, BytesIO(body))
        credentials = auth.AwsCredentialsProvider.new_static(  # per call: frozen afresh
            os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]
        )
        config = auth.AwsSigningConfig(
            algorithm=auth.AwsSigningAlgorithm.V4,
            signature_type=auth.AwsSignatureType.HTTP_REQUEST_HEADERS,
            credentials_provider=credentials,
            region="us-east-1",
            service="sqs",
        )
        auth.aws_sign_request(request, config).result(10)
        chunks: list[bytes] = []
        stream = connection.request(request, on_body=lambda chunk, **_: chunks.append(chunk))
        stream.activate()
        stream.completion_future.result(30)
        result: dict[str, Any] = orjson.loads(b"".join(chunks))
        return result

    def receive() -> list[dict[str, Any]]:
        params = {
            "QueueUrl": queue,
            "MaxNumberOfMessages": 10,
            "WaitTimeSeconds": 0,
            "MessageSystemAttributeNames": ["All"],
            "MessageAttributeNames": ["All"],
        }
        return list(call("ReceiveMessage", params)["Messages"])

    def delete(handles: list[str]) -> None:
        entries = [{"Id": str(i), "ReceiptHandle": h} for i, h in enumerate(handles)]
        call("DeleteMessageBatch", {"QueueUrl": queue, "Entries": entries})

    return receive, delete


def one(client: str, url: str, calls: int) -> dict[str, float]:
    """In this process: CPU µs per receive and per delete batch with ``client``."""
    if client == "botocore":
        receive, delete = _botocore(url)
    elif client == "botocore, no validation":
        receive, delete = _botocore(url, validation=False)
    elif client == "botocore, no CRT":
        receive, delete = _botocore(url)
    elif client == "lean":
        receive, delete = _lean(url)
    elif client == "lean, botocore's session":
        receive, delete = _lean(url, session=True)
    elif client == "awscrt":
        receive, delete = _awscrt(url)
    else:
        receive, delete = _transport(url, client.rsplit(" ", 1)[1])
    for _ in range(20):  # warm up: connections, caches
        delete([m["ReceiptHandle"] for m in receive()])
    spent = {"receive": 0.0, "delete": 0.0}
    for _ in range(calls):
        started = time.process_time()
        handles = [m["ReceiptHandle"] for m in receive()]
        middle = time.process_time()
        delete(handles)
        spent["receive"] += middle - started
        spent["delete"] += time.process_time() - middle
    return {k: v / calls * 1e6 for k, v in spent.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--clients", nargs="+", default=CLIENTS)
    args = parser.parse_args()
    env = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench"}
    env["AWS_DEFAULT_REGION"] = "us-east-1"
    if args.one:
        for key, value in env.items():
            os.environ.setdefault(key, value)
        print(json.dumps(one(args.one, args.url, args.calls)))
        return
    try:
        import awscrt  # noqa: F401
    except ImportError:
        print("awscrt is not installed: no awscrt row (pip install awscrt; botocore then signs")
        print("with awscrt's signer, so the botocore rows change too)")
        args.clients = [c for c in args.clients if c != "awscrt"]
    runs: dict[str, list[dict[str, float]]] = {c: [] for c in args.clients}
    with Endpoint() as endpoint:
        for round_ in range(args.rounds):
            order = args.clients if round_ % 2 == 0 else args.clients[::-1]
            for client in order:
                extra = {"BOTO_DISABLE_CRT": "true"} if client == "botocore, no CRT" else {}
                done = subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "bench.calls",
                        "--one",
                        client,
                        "--url",
                        endpoint.url,
                        f"--calls={args.calls}",
                    ],
                    env={**env, **os.environ, **extra},
                    capture_output=True,
                    text=True,
                    check=True,
                )
                runs[client].append(json.loads(done.stdout.strip().splitlines()[-1]))
                print(f"round {round_ + 1}, {client}: {runs[client][-1]}", flush=True)
    print(f"\nCPU µs per call, one thread, medians of {args.rounds} rounds of {args.calls}:\n")
    print("| client | receive 10 | delete batch 10 | per message |")
    print("|---|---:|---:|---:|")
    for client, results in runs.items():
        receive = statistics.median(r["receive"] for r in results)
        delete = statistics.median(r["delete"] for r in results)
        print(f"| {client} | {receive:.0f} | {delete:.0f} | {(receive + delete) / 10:.0f} |")


if __name__ == "__main__":
    main()
