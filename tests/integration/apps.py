"""Handlers the end-to-end tests run in real `sqsworker run` processes.

Each run appends lines to the ledger file named by $LEDGER (appends of one short
line are atomic, so several processes can share it): "start KIND ID RECEIVE PID"
and "done KIND ID RECEIVE PID".
"""

from __future__ import annotations

import os
import time

import sqsworker


def _record(event: str, body: dict[str, object], message: sqsworker.Message) -> None:
    line = f"{event} {body['kind']} {body['id']} {message.receive_count} {os.getpid()}\n"
    fd = os.open(os.environ["LEDGER"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@sqsworker.handler()
def work(message: sqsworker.Message) -> None:
    body = message.json()
    _record("start", body, message)
    time.sleep(float(body.get("sleep", 0)))
    if body["kind"] == "fail":
        raise RuntimeError(f"order {body['id']} cannot be processed")
    _record("done", body, message)
