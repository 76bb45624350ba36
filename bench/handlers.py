"""Handlers the comparison runs in separate processes (``bench.compare``)."""

from __future__ import annotations

import os
import time

from sqsworker import Message


def record(message: Message) -> None:
    """Takes a second; writes "start ID PID" and "done ID PID" to $LEDGER."""
    _line(f"start {message.body} {os.getpid()}")
    time.sleep(1)
    _line(f"done {message.body} {os.getpid()}")


def _line(text: str) -> None:
    fd = os.open(os.environ["LEDGER"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, (text + "\n").encode())
    finally:
        os.close(fd)


def peer(message: Message) -> None:
    """The handler ``bench.peers`` gives every consumer (``bench/peer_apps/work.py``)."""
    from .peer_apps import work

    work.run(message.body)
