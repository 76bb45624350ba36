"""``python -m bench.drain noop|sleepN|asleepN MESSAGES [--latency-ms MS] [--concurrency C]``:
one drain, as JSON.

A worker (concurrency 16 unless told, burst mode) drains MESSAGES from the in-memory SQS,
behind ``Latency`` (0 ms unless told); prints msg/s (from the start to the last delete,
and steady: from a tenth of the messages deleted to nine tenths), SQS requests per
message (all, and busy: receives that returned messages, deletes and renewals), seconds
from the last delete to the worker's exit, the process's CPU time per message (every
thread, the in-memory SQS's included; ``--metrics`` adds the Prometheus metrics as
``sqsworker run`` has them) and the part of it the in-memory SQS's calls took (the
service's work, which real SQS does elsewhere), and the folder sqsworker was
imported from, the process's peak resident memory and its most threads at once. The
cyclic garbage collector is set as ``sqsworker run`` sets it (``settle_heap``, in a tree
that has it); ``--collector python`` leaves Python's defaults. ``sleepN``
handlers sleep N ms on their thread; ``asleepN`` handlers are ``async def`` and
await ``asyncio.sleep`` for N ms, as coroutines on the worker's event loop. ``--idle S``
instead runs a worker (not in burst mode, ``--wait-time`` 20 unless told) on an empty
queue for S seconds, then stops it: requests per minute, and seconds from the stop
request to the exit. ``bench.versus`` and ``bench.grid`` run it against two versions of
sqsworker, so it uses only API that both have.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqsworker
import sqsworker.process
from sqsworker import Message, Worker, WorkerConfig
from sqsworker.events import Observer, Observers, Tally
from sqsworker.transports import Transport, send_all
from sqsworker.transports.memory import MemorySQS

from .common import Finish
from .latency import Latency


def noop(message: Message) -> None:
    pass


def sleep100(message: Message) -> None:
    time.sleep(0.1)


HANDLERS: dict[str, Callable[[Message], None]] = {"noop": noop, "sleep100": sleep100}


def handler_named(name: str) -> Callable[[Message], Any]:
    if name in HANDLERS:
        return HANDLERS[name]
    if name == "anoop":

        async def anoop(message: Message) -> None:
            pass

        return anoop
    if name.startswith("asleep") and name[6:].isdigit():
        pause = int(name[6:]) / 1000

        async def awaits(message: Message) -> None:
            await asyncio.sleep(pause)

        return awaits
    if name.startswith("sleep") and name[5:].isdigit():
        seconds = int(name[5:]) / 1000

        def sleeper(message: Message) -> None:
            time.sleep(seconds)

        return sleeper
    raise SystemExit(f"unknown handler {name!r}: noop, or sleepN or asleepN for N ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("handler")
    parser.add_argument("messages", type=int)
    parser.add_argument("--latency-ms", type=float, default=0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--idle", type=float, default=0, help="seconds on an empty queue")
    parser.add_argument("--metrics", action="store_true", help="with Prometheus metrics")
    parser.add_argument(
        "--collector",
        choices=["run", "python"],
        default="run",
        help="the cyclic garbage collector as `sqsworker run` sets it, or Python's defaults",
    )
    parser.add_argument("--wait-time", type=int, default=20, help="long poll seconds, --idle")
    args = parser.parse_args()
    if args.idle:
        return idle(args.idle, args.latency_ms, args.wait_time)

    memory = MemorySQS()
    memory.create_queue("drain")
    queue = memory.transport("drain")
    send_all(queue, [f'{{"n": {i}}}' for i in range(args.messages)])
    before = Counter(memory.requests)
    metered = Latency(queue, args.latency_ms / 1000)  # 0 ms: only counts the service's CPU
    transport: Transport = metered
    config = WorkerConfig(
        queue="drain",
        concurrency=args.concurrency,
        wait_time=1,
        burst=True,
        visibility_timeout=30,
    )
    finish, tally = Finish(args.messages), Tally()
    observers: list[Observer] = [finish, tally]
    if args.metrics:
        from sqsworker.metrics import Metrics

        metrics = Metrics(config.queue, "bench.drain")
        observers.append(metrics)
    if args.collector == "run":
        settle_heap = getattr(sqsworker.process, "settle_heap", None)  # a tree before it: none
        if settle_heap is not None:
            settle_heap()
    started = time.perf_counter()
    cpu = time.process_time()
    worker = Worker(
        handler_named(args.handler),
        config,
        transport=transport,
        observer=Observers(observers),
    )
    if args.metrics:
        metrics.watch(worker)
    threads = [threading.active_count()]
    counting = threading.Event()

    def count_threads() -> None:
        while not counting.wait(0.05):
            threads[0] = max(threads[0], threading.active_count())

    threading.Thread(target=count_threads, daemon=True).start()
    worker.run()
    ended = time.perf_counter()
    counting.set()
    cpu = time.process_time() - cpu
    assert finish.at is not None, "not every message was deleted"
    requests = memory.requests - before
    busy = (  # receives that returned messages, deletes and renewals: the saturated cost
        requests["ReceiveMessage"]
        - tally.counts["empty_receives"]
        + requests["DeleteMessageBatch"]
        + requests["ChangeMessageVisibilityBatch"]
    )
    result = {
        "rate": args.messages / (finish.at - started),
        "steady_rate": finish.steady(),
        "requests_per_message": sum(requests.values()) / args.messages,
        "busy_requests_per_message": busy / args.messages,
        "exit_after_last_delete": ended - finish.at,
        "cpu_us_per_message": cpu / args.messages * 1e6,
        "service_cpu_us_per_message": metered.service_cpu / args.messages * 1e6,
        "sqsworker": str(Path(sqsworker.__file__).parent),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "peak_threads": threads[0],
    }
    print(json.dumps(result))


def idle(seconds: float, latency_ms: float, wait_time: int) -> None:
    memory = MemorySQS()
    memory.create_queue("idle")
    queue = memory.transport("idle")
    transport: Transport = Latency(queue, latency_ms / 1000) if latency_ms else queue
    config = WorkerConfig(queue="idle", wait_time=wait_time, visibility_timeout=30)
    worker = Worker(noop, config, transport=transport)
    worker.start()
    time.sleep(seconds)
    stop = time.perf_counter()
    worker.request_stop()
    worker.shutdown()
    result = {
        "requests_per_minute": sum(memory.requests.values()) / seconds * 60,
        "stop_to_exit": time.perf_counter() - stop,
        "sqsworker": str(Path(sqsworker.__file__).parent),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
