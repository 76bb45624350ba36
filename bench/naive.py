"""The simple alternative, as people write it: receive, run each message, delete each.

No heartbeat, one thread, the visibility timeout set long enough for the longest
handler, and boto3's client, as such a loop is written (on sqsworker's lean client it
would cost less than any loop users write). ``python -m bench.naive QUEUE VISIBILITY
HANDLER`` runs it as a process (the kill measurements); ``consume`` runs it in this one.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

from sqsworker import Message
from sqsworker.importer import import_from_string
from sqsworker.transports import Transport
from sqsworker.transports.sqs import SQSTransport


def consume(
    transport: Transport,
    handler: Callable[[Message], object],
    visibility: int,
    stop: threading.Event,
    until_empty: bool = False,
    deleted: Callable[[], None] = lambda: None,
) -> int:
    """Run until ``stop`` is set (or the queue answers empty); returns handler runs.

    ``deleted`` is called after each delete (the benchmark times the last one).
    """
    runs = 0
    while not stop.is_set():
        batch = transport.receive(10, 1, visibility)
        if not batch and until_empty:
            return runs
        for envelope in batch:
            if stop.is_set():
                return runs  # what it still holds stays invisible until its visibility ends
            try:
                handler(Message(envelope, transport.info.name))
            except Exception:
                continue  # back after the visibility timeout
            runs += 1
            transport.delete_batch([("0", envelope.receipt_handle)])
            deleted()
    return runs


def main() -> None:
    queue, visibility, handler = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    transport = SQSTransport.connect(queue, sqs_client="boto3")
    consume(transport, import_from_string(handler), visibility, threading.Event())


if __name__ == "__main__":
    main()
