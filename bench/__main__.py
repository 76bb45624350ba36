"""`python -m bench` (or `make bench`): the worker's throughput and SQS cost, side by side.

Every figure comes from one run on this machine, so compare rows, not runs.
Requests per message are counted at the transport: each counted request is one
HTTP request on a real endpoint.
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from sqsworker import Message, Worker, WorkerConfig
from sqsworker.events import Tally
from sqsworker.local import LocalSQS
from sqsworker.transports import Transport, send_all
from sqsworker.transports.memory import MemorySQS
from sqsworker.transports.sqs import SQSTransport


@dataclass
class Result:
    name: str
    messages: int
    seconds: float
    requests: Counter[str]
    empty_receives: int
    ideal: float | None = None

    @property
    def rate(self) -> float:
        return self.messages / self.seconds

    @property
    def saturated_requests_per_message(self) -> float:
        """Receives that returned messages, deletes and renewals: the cost while busy."""
        busy = (
            self.requests["ReceiveMessage"]
            - self.empty_receives
            + self.requests["DeleteMessageBatch"]
            + self.requests["ChangeMessageVisibilityBatch"]
        )
        return busy / self.messages

    @property
    def total_requests_per_message(self) -> float:
        return sum(self.requests.values()) / self.messages


def drain(
    name: str,
    transport: Transport,
    requests: Counter[str],
    messages: int,
    handler: Callable[[Message], None],
    concurrency: int,
    ideal: float | None = None,
) -> Result:
    send_all(transport, [f'{{"n": {i}}}' for i in range(messages)])
    before = Counter(requests)
    tally = Tally()
    config = WorkerConfig(
        queue=transport.info.name,
        concurrency=concurrency,
        wait_time=1,
        burst=True,
        visibility_timeout=30,
    )
    worker = Worker(handler, config, transport=transport, observer=tally)
    started = time.perf_counter()
    worker.start()
    worker.wait()
    elapsed = time.perf_counter() - started
    worker.shutdown()
    assert tally.counts["deleted"] == messages, tally.counts
    return Result(name, messages, elapsed, requests - before, tally.counts["empty_receives"], ideal)


def noop(message: Message) -> None:
    pass


def sleeper(seconds: float) -> Callable[[Message], None]:
    def handler(message: Message) -> None:
        time.sleep(seconds)

    return handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--memory-messages", type=int, default=5000)
    parser.add_argument("--moto-messages", type=int, default=500)
    parser.add_argument("--slow-messages", type=int, default=2000)
    args = parser.parse_args()

    results: list[Result] = []
    memory = MemorySQS()
    for name, count, handler, concurrency, ideal in [
        ("memory, no-op handlers, concurrency 16", args.memory_messages, noop, 16, None),
        ("memory, 100 ms handlers, concurrency 16", args.slow_messages, sleeper(0.1), 16, 160.0),
    ]:
        queue = f"bench-{len(results)}"
        memory.create_queue(queue)
        results.append(
            drain(
                name, memory.transport(queue), memory.requests, count, handler, concurrency, ideal
            )
        )

    with LocalSQS() as server:
        os.environ.update(server.env())
        for name, handler, ideal in [
            ("moto server, no-op handlers, concurrency 16", noop, None),
            ("moto server, 100 ms handlers, concurrency 16", sleeper(0.1), 160.0),
        ]:
            queue = f"bench-moto-{len(results)}"
            server.create_queue(queue, max_receive_count=None)
            transport = SQSTransport.connect(queue, max_connections=24)
            results.append(
                drain(name, transport, transport.requests, args.moto_messages, handler, 16, ideal)
            )
            transport.close()

    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"\n{'scenario':<46}{'msgs':>6}{'msg/s':>9}{'req/msg busy':>14}{'req/msg all':>13}"
        f"{'of ideal':>10}"
    )
    for r in results:
        of_ideal = f"{r.rate / r.ideal:.2f}" if r.ideal else "-"
        print(
            f"{r.name:<46}{r.messages:>6}{r.rate:>9.0f}{r.saturated_requests_per_message:>14.3f}"
            f"{r.total_requests_per_message:>13.3f}{of_ideal:>10}"
        )
    print(f"\npeak RSS of the benchmark process: {peak_mb:.0f} MB")
    print(
        "req/msg busy: receives that returned messages + deletes + renewals, per message "
        "(floor 0.2)."
    )
    print(
        "req/msg all: every request, including the empty receives and queue-size checks "
        "with which burst mode ends."
    )


if __name__ == "__main__":
    main()
