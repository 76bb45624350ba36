"""How a command of ``sqsworker`` ends: its exit codes, its one-sentence error on
stderr, and the signals that ask it to stop.

Shared by ``cli.py`` (``run``, ``local``, ``create-store``) and the queue commands
(``commands/``), so that neither imports the other for them. Exit codes: 0 done,
1 could not start (or SQS or the endpoint failed), 2 bad usage, 130 forced.

Signal handlers only set a flag: the main thread acts on it. The first SIGTERM or
SIGINT asks for a graceful stop; a second SIGINT exits at once.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType

from . import log_output

EXIT_STARTUP = 1
EXIT_USAGE = 2
EXIT_FORCED = 130


def fail(message: str) -> None:
    """Say on stderr what went wrong, as one sentence."""
    message = message.rstrip()
    if not message.endswith((".", "?")):
        message += "."
    log_output.flush()  # after the log lines logged before it, as they were logged
    print(f"sqsworker: error: {message}", file=sys.stderr)


class Signals:
    """Signal handlers only set a flag; the main thread acts on it."""

    def __init__(self) -> None:
        self.received = threading.Event()
        self.count = 0

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self.count > 1 and signum == signal.SIGINT:
            os.write(2, b"sqsworker: second interrupt, exiting now without handing back.\n")
            os._exit(EXIT_FORCED)
        self.received.set()
