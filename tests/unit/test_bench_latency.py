"""bench.latency's ``Latency`` on a coroutine worker's loop: the worker receives, deletes
and returns there, as with the lean client, and a long poll of an empty queue waits on a
thread of the service's, not on the loop."""

from __future__ import annotations

import threading
from typing import Any

from bench.latency import Latency
from sqsworker import Worker, WorkerConfig
from sqsworker.transports import send_all
from sqsworker.transports.memory import MemorySQS

from ..conftest import wait_until


def test_a_coroutine_worker_calls_the_slow_in_memory_sqs_on_its_loop() -> None:
    memory = MemorySQS()
    memory.create_queue("drain")
    queue = memory.transport("drain")
    transport = Latency(queue, 0.002)
    threads: set[str] = set()
    delete = transport.delete_batch_async

    async def recorded(entries: Any) -> Any:
        threads.add(threading.current_thread().name)
        return await delete(entries)

    transport.delete_batch_async = recorded  # type: ignore[method-assign]
    ran: list[str] = []

    async def handler(message: Any) -> None:
        ran.append(message.body)

    config = WorkerConfig(queue="drain", concurrency=8, wait_time=2, metrics_port=None)
    worker = Worker(handler, config, transport=transport)  # type: ignore[arg-type]
    worker.start()
    try:
        assert worker.receiver._loop is not None  # receives on the loop
        wait_until(
            lambda: any(t.name.startswith("latency-long-poll") for t in threading.enumerate()),
            what="a long poll of the empty queue, on the service's thread",
        )
        send_all(queue, [f"m{i}" for i in range(30)])
        wait_until(lambda: len(ran) == 30, what="the thirty to run")
        wait_until(lambda: queue.counts().in_flight == 0, what="their deletes")
    finally:
        worker.request_stop()
        assert worker.shutdown() == 0
    assert threads == {"sqsworker-event-loop"}
    assert sorted(ran) == sorted(f"m{i}" for i in range(30))
