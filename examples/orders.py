"""An order pipeline handler: the worker `make demo` runs.

Run it by hand against the embedded SQS:

    sqsworker local --queue orders          # in one shell; export what it prints
    sqsworker run examples.orders:process   # in another

Each order is a JSON body such as {"id": 7, "kind": "normal"}. The kinds show
what the runtime does with each outcome:
- normal: processed and deleted;
- slow: takes longer than the visibility timeout; the lease thread keeps it hidden;
- flaky: fails on its first attempt (a gateway time-out) and succeeds on the retry;
- poison: fails every time; after the queue's maxReceiveCount it is in the DLQ;
- a body that is not JSON: message.json() rejects it straight to the DLQ;
- duplicate: sent twice under one idempotency-key attribute; with
  --idempotency-store the copy is deleted without running.

``refund`` serves a second queue, refunds, from the same codebase:
`sqsworker run examples.orders` runs both handlers in one process, each on its queue.
"""

from __future__ import annotations

import os
import time

import sqsworker


@sqsworker.handler(queue="orders", visibility_timeout=30, concurrency=8)
def process(message: sqsworker.Message) -> None:
    order = message.json()
    _ledger("attempt", order, message)
    if order.get("kind") == "slow":
        time.sleep(float(order.get("seconds", 5)))  # rendering an invoice, say
    if order.get("kind") == "flaky" and message.receive_count == 1:
        raise ConnectionError("payment gateway timed out")
    if order.get("kind") == "poison":
        raise ValueError(f"order {order['id']} has no line items")
    _ledger("done", order, message)


@sqsworker.handler(queue="refunds", visibility_timeout=30, concurrency=4)
def refund(message: sqsworker.Message) -> None:
    order = message.json()
    _ledger("refunded", order, message)


def _ledger(event: str, order: dict[str, object], message: sqsworker.Message) -> None:
    """Record the side effect where the demo can count it ($ORDERS_LEDGER, if set)."""
    path = os.environ.get("ORDERS_LEDGER")
    if path:
        line = f"{event} {order.get('kind', 'normal')} {order['id']} {message.receive_count}\n"
        with open(path, "a") as ledger:
            ledger.write(line)
