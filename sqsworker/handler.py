"""``@sqsworker.handler``: a function of one ``Message``, with its worker options."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

from .config import WorkerConfig
from .message import Message

HandlerFunc = Callable[[Message], object]


class Handler:
    """A handler function and the options its decorator gave. Calling it calls the function."""

    def __init__(self, func: HandlerFunc, options: Mapping[str, Any]) -> None:
        known = {f.name for f in dataclasses.fields(WorkerConfig)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(
                f"@sqsworker.handler got unknown option(s) {', '.join(unknown)}; "
                f"the options are: {', '.join(sorted(known))}"
            )
        self.func = func
        self.options = dict(options)
        self.name = f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', func)}"
        functools.update_wrapper(self, func)

    def __call__(self, message: Message) -> object:
        return self.func(message)

    def __repr__(self) -> str:
        return f"<sqsworker.Handler {self.name}>"


def handler(queue: str | None = None, **options: Any) -> Callable[[HandlerFunc], Handler]:
    """Mark ``func(message)`` as a handler. Returning normally means success.

    ``queue`` is a queue name or URL; the other options are those of ``sqsworker run``
    (``concurrency``, ``visibility_timeout``, ``non_retryable``, ...). The command line
    and ``SQSWORKER_*`` variables override them.
    """
    if queue is not None:
        options["queue"] = queue

    def decorate(func: HandlerFunc) -> Handler:
        return Handler(func, options)

    return decorate


def as_handler(obj: object, spec: str = "") -> Handler:
    if isinstance(obj, Handler):
        return obj
    if callable(obj):
        return Handler(obj, {})
    from .errors import ImportStringError

    raise ImportStringError(
        f"{spec or obj!r} is a {type(obj).__name__}, not a handler function of one message"
    )
