"""``--pin-cpu``: every thread of the process on one CPU.

The worker's threads (receives, lease sends, handlers, the lease and log threads) hand
Python's GIL to one another several times a message: each blocking socket call lets it
go and takes it back. With the threads free to run on any CPU, a thread woken for the GIL
starts at once on another CPU and the two contend for it, each hand-over costing context
switches and cold caches on both. On one CPU a woken thread waits its turn instead.
Measured at an HTTP endpoint (bench/README.md), a no-op ``def`` handler took a quarter
to two fifths less CPU a message and ran 1.3 to 1.6 times the messages a second.

The affinity is a thread's, inherited by the threads and processes it starts: every
thread of the process is pinned at once (those the handler's modules started as they
were imported, a numeric library's pool, say), before the worker starts its own, so it
holds for all of them, and for any process a handler starts (so it is not the default).
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import ConfigError


def pin_to_one() -> int:
    """Run every thread of the process, and every thread or process they start from now
    on, on one CPU: the one the calling thread runs on now, if allowed. Returns that CPU."""
    if not hasattr(os, "sched_setaffinity"):
        raise ConfigError("--pin-cpu needs Linux (sched_setaffinity); leave it off on this system")
    allowed = os.sched_getaffinity(0)
    cpu = _running_on()
    if cpu not in allowed:
        cpu = min(allowed)
    for task in Path("/proc/self/task").iterdir():  # this thread and every other one
        try:
            os.sched_setaffinity(int(task.name), {cpu})
        except (ProcessLookupError, ValueError):  # it ended meanwhile
            continue
    return cpu


def _running_on() -> int | None:
    """The CPU the calling thread runs on (field 39 of proc(5)'s stat), or None."""
    try:
        stat = Path("/proc/thread-self/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[36])
    except (OSError, IndexError, ValueError):
        return None
