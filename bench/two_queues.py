"""``python -m bench.two_queues``: does a slow queue slow a fast one in the same process?

Two handlers in one process (``Process``, as ``sqsworker run app:fast app:slow`` runs
them), each on its own queue of the in-memory SQS with 20 ms added to every call: the
fast handler takes 20 ms a message, the slow one ten times as long. Each round drains
the fast queue alone, then again with the slow queue busy beside it (it always has
messages left), alternating the order between rounds. Prints the fast queue's msg/s
each way and their ratio; the bar is 0.90 or more.
"""

from __future__ import annotations

import argparse
import statistics
import time

from sqsworker import Message, Worker, WorkerConfig
from sqsworker.events import Observers
from sqsworker.process import Process
from sqsworker.transports import send_all
from sqsworker.transports.memory import MemorySQS

from .common import Finish
from .latency import Latency

LATENCY = 0.02
FAST, SLOW = 0.02, 0.2  # seconds a message


def fast(message: Message) -> None:
    time.sleep(FAST)


def slow(message: Message) -> None:
    time.sleep(SLOW)


def drain(messages: int, concurrency: int, beside_slow: bool) -> float:
    """The fast queue's msg/s, from the start to its last delete."""
    memory = MemorySQS()
    workers: dict[str, Worker] = {}
    finish = Finish(messages)
    for name, handler, count in (("fast", fast, messages), ("slow", slow, messages)):
        if name == "slow" and not beside_slow:
            continue
        memory.create_queue(name)
        queue = memory.transport(name)
        send_all(queue, [f'{{"n": {i}}}' for i in range(count)])
        config = WorkerConfig(
            queue=name, concurrency=concurrency, wait_time=1, visibility_timeout=30
        )
        observer = Observers([finish]) if name == "fast" else None
        workers[name] = Worker(
            handler, config, transport=Latency(queue, LATENCY), observer=observer
        )
    process = Process(workers)
    started = time.perf_counter()
    process.start()
    while finish.at is None:
        time.sleep(0.01)
    process.request_stop()
    process.shutdown()
    return messages / (finish.at - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    alone: list[float] = []
    beside: list[float] = []
    for round_ in range(args.rounds):
        order = (False, True) if round_ % 2 == 0 else (True, False)
        for with_slow in order:
            rate = drain(args.messages, args.concurrency, with_slow)
            (beside if with_slow else alone).append(rate)
            label = "beside the slow queue" if with_slow else "alone"
            print(f"round {round_ + 1}: fast queue {label}: {rate:.0f} msg/s", flush=True)
    ideal = args.concurrency / FAST
    a, b = statistics.median(alone), statistics.median(beside)
    print(
        f"\nfast queue, concurrency {args.concurrency} x {FAST * 1000:.0f} ms (ideal {ideal:.0f} "
        f"msg/s), +{LATENCY * 1000:.0f} ms a call, medians of {args.rounds}: alone {a:.0f} msg/s, "
        f"beside a queue {SLOW / FAST:.0f}x slower {b:.0f} msg/s: {b / a:.2f} of alone"
    )


if __name__ == "__main__":
    main()
