"""``python -m bench.idempotency [MESSAGES] [--rounds N]``: what an idempotency store costs.

A worker (concurrency 16) drains MESSAGES from the in-memory SQS; each handler takes
10 ms. Side by side, rounds alternating: no store; a SQLite store (claim, then
completion); a PostgreSQL store on a local server (tests/postgres.py: Debian's
package), claim and completion; and PostgreSQL with the handler's write inside
``message.transaction()``. Prints msg/s per round, the medians, and each store's
median over no store's (the bar: 0.8).

``--split-cores``: this process on CPU 0, the PostgreSQL server on CPU 1, as when the
database has a host of its own (on 2 cores, the server otherwise takes CPU from the
worker it serves, which a production database does not).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqsworker import Message, Worker, WorkerConfig
from sqsworker.stores import Store, open_store
from sqsworker.transports import send_all
from sqsworker.transports.memory import MemorySQS
from tests.postgres import PostgresServer

from .common import Finish


def sleep10(message: Message) -> None:
    time.sleep(0.01)


def sleep10_in_a_transaction(message: Message) -> None:
    with message.transaction() as db:
        db.execute("INSERT INTO effects VALUES (%s)", (message.idempotency_key,))
        time.sleep(0.01)


def drain(messages: int, handler: Callable[[Message], None], store: Store | None) -> float:
    memory = MemorySQS()
    memory.create_queue("bench")
    queue = memory.transport("bench")
    send_all(queue, [f'{{"n": {i}}}' for i in range(messages)])
    config = WorkerConfig(
        queue="bench", concurrency=16, wait_time=1, burst=True, visibility_timeout=30
    )
    finish = Finish(messages)
    started = time.perf_counter()
    worker = Worker(handler, config, transport=queue, observer=finish, idempotency_store=store)
    worker.run()
    assert finish.at is not None, "not every message was deleted"
    return messages / (finish.at - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("messages", type=int, nargs="?", default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--split-cores", action="store_true")
    args = parser.parse_args()
    server = PostgresServer().start()
    if args.split_cores:
        postmaster = (server.data / "postmaster.pid").read_text().split()[0]
        subprocess.run(["taskset", "-a", "-cp", "1", postmaster], check=True, capture_output=True)
        os.sched_setaffinity(0, {0})
    folder = Path(tempfile.mkdtemp(prefix="bench-idempotency-"))
    try:
        server.sql("CREATE TABLE effects (key text)")
        stores: dict[str, Callable[[int], tuple[Callable[[Message], None], Any]]] = {
            "no store": lambda r: (sleep10, None),
            "sqlite": lambda r: (sleep10, open_store(f"sqlite:///{folder}/keys-{r}.db")),
            "postgresql": lambda r: (
                sleep10,
                open_store(server.url_for(f"keys_{r}"), create=True, connections=18),
            ),
            "postgresql, transaction()": lambda r: (
                sleep10_in_a_transaction,
                open_store(server.url_for(f"tx_keys_{r}"), create=True, connections=18),
            ),
        }
        rates: dict[str, list[float]] = {name: [] for name in stores}
        for round_ in range(args.rounds):
            for name, make in stores.items():
                handler, store = make(round_)
                rates[name].append(drain(args.messages, handler, store))
        base = statistics.median(rates["no store"])
        split = ", worker on CPU 0, server on CPU 1" if args.split_cores else ""
        print(
            f"{args.messages} messages, concurrency 16, 10 ms handlers, {args.rounds} rounds{split}"
        )
        print("| store | msg/s per round | median | / no store |")
        print("|---|---|---:|---:|")
        for name, values in rates.items():
            median = statistics.median(values)
            runs = " ".join(f"{v:.0f}" for v in values)
            print(f"| {name} | {runs} | {median:.0f} | {median / base:.2f} |")
    finally:
        server.close()


if __name__ == "__main__":
    main()
