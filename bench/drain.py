"""``python -m bench.drain noop|sleep100 MESSAGES [--latency-ms MS]``: one drain, as JSON.

A worker (concurrency 16, burst mode) drains MESSAGES from the in-memory SQS, optionally
behind ``Latency``; prints msg/s (from the start to the last delete), SQS requests per
message, and the folder sqsworker was imported from. ``bench.versus`` runs it against two
versions of sqsworker, so it uses only API that both have.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import sqsworker
from sqsworker import Message, Worker, WorkerConfig
from sqsworker.transports import Transport, send_all
from sqsworker.transports.memory import MemorySQS

from .common import Finish
from .latency import Latency


def noop(message: Message) -> None:
    pass


def sleep100(message: Message) -> None:
    time.sleep(0.1)


HANDLERS: dict[str, Callable[[Message], None]] = {"noop": noop, "sleep100": sleep100}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("handler", choices=HANDLERS)
    parser.add_argument("messages", type=int)
    parser.add_argument("--latency-ms", type=float, default=0)
    args = parser.parse_args()

    memory = MemorySQS()
    memory.create_queue("drain")
    queue = memory.transport("drain")
    send_all(queue, [f'{{"n": {i}}}' for i in range(args.messages)])
    before = Counter(memory.requests)
    transport: Transport = Latency(queue, args.latency_ms / 1000) if args.latency_ms else queue
    config = WorkerConfig(
        queue="drain", concurrency=16, wait_time=1, burst=True, visibility_timeout=30
    )
    finish = Finish(args.messages)
    started = time.perf_counter()
    Worker(HANDLERS[args.handler], config, transport=transport, observer=finish).run()
    assert finish.at is not None, "not every message was deleted"
    requests = sum((memory.requests - before).values())
    result = {
        "rate": args.messages / (finish.at - started),
        "requests_per_message": requests / args.messages,
        "sqsworker": str(Path(sqsworker.__file__).parent),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
