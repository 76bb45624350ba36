"""``python -m bench.rss sqsworker|naive N``: drain N no-op messages on the in-memory SQS,
sampling this process's resident memory; prints {"start_mb", "peak_mb"} as JSON."""

from __future__ import annotations

import json
import resource
import sys
import threading

from sqsworker import Message, Worker, WorkerConfig
from sqsworker.transports import send_all
from sqsworker.transports.memory import MemorySQS

from .naive import consume


def resident_mb() -> float:
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def noop(message: Message) -> None:
    pass


def main() -> None:
    consumer, count = sys.argv[1], int(sys.argv[2])
    memory = MemorySQS()
    memory.create_queue("rss")
    queue = memory.transport("rss")
    send_all(queue, [f'{{"n": {i}}}' for i in range(count)])
    start = resident_mb()
    peak = [start]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            peak[0] = max(peak[0], resident_mb())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    if consumer == "naive":
        consume(queue, noop, 30, threading.Event(), until_empty=True)
    else:
        config = WorkerConfig(queue="rss", concurrency=16, wait_time=1, burst=True)
        Worker(noop, config, transport=queue).run()
    done.set()
    sampler.join()
    assert queue.counts().total == 0
    print(json.dumps({"start_mb": round(start, 1), "peak_mb": round(max(peak), 1)}))


if __name__ == "__main__":
    main()
