"""The fields a handler's log lines carry, bound to its thread's (or coroutine's) context
while it runs, so that its own lines carry them too (structlog's ``merge_contextvars``)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping
from typing import Any

import structlog

_bound_keys: set[str] = set()  # keys whose ContextVar structlog has made
_making = threading.Lock()


def bind(**fields: Any) -> Mapping[str, Any]:
    """``structlog.contextvars.bind_contextvars``, safe when threads bind a key for the
    first time at once; undone with ``unbind``.

    structlog makes a key's ``ContextVar`` when the key is first bound, with no lock:
    two handler threads binding ``receive_count`` for the first time at once each make
    one, the later replaces the earlier, and resetting the earlier's token raises
    ValueError (a worker's first messages failed so after their handlers had run, and
    ran again). Here the first binding of each key happens under a lock, once."""
    if not _bound_keys.issuperset(fields):
        with _making:
            fresh = [key for key in fields if key not in _bound_keys]
            if fresh:
                made = structlog.contextvars.bind_contextvars(**dict.fromkeys(fresh))
                structlog.contextvars.reset_contextvars(**made)
                _bound_keys.update(fresh)
    return structlog.contextvars.bind_contextvars(**fields)


def unbind(tokens: Mapping[str, Any]) -> None:
    """Undo ``bind`` once the handler returned or raised. Its outcome is decided by then:
    nothing here may change it (an error would make a message that was handled fail and
    run again). On an error, which is logged, the fields are cleared instead, so that no
    later message's lines carry this one's (a group id the next one lacks, say)."""
    try:
        structlog.contextvars.reset_contextvars(**tokens)
    except Exception:
        structlog.get_logger("sqsworker").exception("could not unbind a message's log fields")
        with contextlib.suppress(Exception):
            structlog.contextvars.unbind_contextvars(*tokens)
