"""``python -m bench.consumer KIND URL [--concurrency N]``: one consumer of queue "bench" at
URL, running until SIGTERM; ``bench.http`` measures its process from outside.

KIND is ``floor`` (a bare boto3 loop on one thread: receive 10, delete those 10 in one
batch call, again; the least any boto3 consumer can do per message), ``floor-lean`` (the
same loop through ``SQSTransport``'s lean client: the least the worker's client costs),
``def`` (sqsworker,
no-op ``def`` handlers) or ``async`` (sqsworker, no-op ``async def`` handlers). The
sqsworker kinds run as ``sqsworker run`` would (long polls of 20 s, 30 s visibility),
without the metrics server.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
from typing import Any

from sqsworker import Message, Worker, WorkerConfig

QUEUE = "bench"


def noop(message: Message) -> None:
    pass


async def anoop(message: Message) -> None:
    pass


def floor(url: str, stop: threading.Event) -> None:
    import boto3
    from botocore.config import Config

    client = boto3.session.Session().client(
        "sqs",
        endpoint_url=url,
        config=Config(retries={"total_max_attempts": 1, "mode": "standard"}),
    )
    queue = client.get_queue_url(QueueName=QUEUE)["QueueUrl"]
    while not stop.is_set():
        messages = client.receive_message(
            QueueUrl=queue,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=20,
            MessageSystemAttributeNames=["All"],
            MessageAttributeNames=["All"],
        ).get("Messages", [])
        if messages:
            client.delete_message_batch(
                QueueUrl=queue,
                Entries=[
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                    for i, m in enumerate(messages)
                ],
            )


def lean_floor(url: str, stop: threading.Event) -> None:
    from sqsworker.transports.sqs import SQSTransport

    transport = SQSTransport.connect(QUEUE, endpoint_url=url, sqs_client="lean")
    while not stop.is_set():
        messages = transport.receive(10, 20, 30)
        if messages:
            transport.delete_batch([(str(i), m.receipt_handle) for i, m in enumerate(messages)])


def worker(kind: str, url: str, concurrency: int, client: str, stop: threading.Event) -> None:
    config = WorkerConfig(queue=QUEUE, concurrency=concurrency, endpoint_url=url, metrics_port=None)
    handler: Any = noop if kind == "def" else anoop
    transport = None
    if client:  # else the worker connects as `sqsworker run` does
        from sqsworker.transports.sqs import SQSTransport

        transport = SQSTransport.connect(
            QUEUE, endpoint_url=url, max_connections=min(concurrency, 64) + 8, sqs_client=client
        )
    running = Worker(handler, config, transport=transport)
    running.start()
    stop.wait()
    running.request_stop()
    running.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("kind", choices=["floor", "floor-lean", "def", "async"])
    parser.add_argument("url")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument(
        "--client",
        default="",
        help="boto3 or lean: SQSTransport.connect's client (default: the worker's own)",
    )
    args = parser.parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    if args.kind == "floor":
        floor(args.url, stop)
    elif args.kind == "floor-lean":
        lean_floor(args.url, stop)
    else:
        worker(args.kind, args.url, args.concurrency, args.client, stop)


if __name__ == "__main__":
    main()
