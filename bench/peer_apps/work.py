"""The one handler every consumer runs: nothing, or a sleep written down in a ledger."""

from __future__ import annotations

import os
import time

_SPEC = os.environ.get("PEER_HANDLER", "noop")
_SLEEP = None if _SPEC == "noop" else float(_SPEC.removeprefix("sleep:"))


def run(job_id: str) -> None:
    if _SLEEP is None:
        return
    line(f"start {job_id} {os.getpid()}")
    time.sleep(_SLEEP)
    line(f"done {job_id} {os.getpid()}")


def line(text: str) -> None:
    """One line appended to $LEDGER in one write (lines of several processes do not mix)."""
    fd = os.open(os.environ["LEDGER"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, (text + "\n").encode())
    finally:
        os.close(fd)


def visibility() -> int:
    return int(os.environ.get("PEER_VISIBILITY", "30"))
