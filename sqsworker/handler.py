"""``@sqsworker.handler``: a function of one ``Message``, with its worker options.

The function is a plain ``def`` (run on a pool of handler threads) or an ``async def``
(run as coroutines on the worker's event loop thread).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from .config import WorkerConfig
from .errors import HandlerShapeError, ImportStringError
from .message import Message

HandlerFunc = Callable[[Message], object]


class Handler:
    """A handler function and the options its decorator gave. Calling it calls the function.

    A function that cannot handle a message is refused here, so at decoration, at
    ``Worker(...)`` and at ``sqsworker run``, never after a message was received.
    """

    def __init__(self, func: HandlerFunc, options: Mapping[str, Any]) -> None:
        known = {f.name for f in dataclasses.fields(WorkerConfig)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(
                f"@sqsworker.handler got unknown option(s) {', '.join(unknown)}; "
                f"the options are: {', '.join(sorted(known))}"
            )
        problem = _shape_problem(func)
        if problem:
            raise HandlerShapeError(problem)
        self.func = func
        self.is_async = _is_async(func)  # run as a coroutine on the worker's event loop
        self.options = dict(options)
        self.name = f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', func)}"
        functools.update_wrapper(self, func)

    def __call__(self, message: Message) -> object:
        return self.func(message)

    def __repr__(self) -> str:
        return f"<sqsworker.Handler {self.name}>"


def handler(queue: str | None = None, **options: Any) -> Callable[[HandlerFunc], Handler]:
    """Mark ``func(message)`` as a handler. Returning normally means success.

    ``func`` may be an ``async def``: it then runs on the worker's event loop, with
    ``concurrency`` counting coroutines instead of threads.

    ``queue`` is a queue name or URL; the other options are those of ``sqsworker run``
    (``concurrency``, ``visibility_timeout``, ``non_retryable``, ...). The command line
    and ``SQSWORKER_*`` variables override them.
    """
    if callable(queue):  # `@sqsworker.handler` without parentheses: the function came as queue
        raise HandlerShapeError(
            f"@sqsworker.handler above {_name(queue)} needs parentheses: "
            "write @sqsworker.handler() or @sqsworker.handler(queue=...)"
        )
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
    raise ImportStringError(
        f"{spec or obj!r} is a {type(obj).__name__}, not a handler function of one message"
    )


def _shape_problem(func: object) -> str | None:
    """Why calling ``func(message)`` cannot handle a message, in one sentence; None if it can.

    Each refused shape would otherwise be reported processed (its message deleted) with
    no work done, or fail every message into the dead-letter queue.
    """
    name = _name(func)
    if not callable(func):
        return f"handler {name} is a {type(func).__name__}, not a function of one message"
    inner: object = func
    while isinstance(inner, functools.partial):
        inner = inner.func
    if isinstance(inner, type):
        return (
            f"handler {name} is a class, and calling a class with a message only constructs "
            "an object: decorate a function with @sqsworker.handler() instead, or pass an "
            "instance of a class that defines __call__(self, message)"
        )
    # What runs: the function itself, or the __call__ of an instance's class. Both are asked,
    # since a marker (inspect.markcoroutinefunction) may sit on the instance.
    runs = inner if inspect.isroutine(inner) else type(inner).__call__
    if inspect.isasyncgenfunction(inner) or inspect.isasyncgenfunction(runs):
        return (
            f"handler {_name(runs)} is an async generator function (it contains yield), so "
            "calling it returns an async iterator without running its body: write it as an "
            "async def without yield that does the work and returns"
        )
    if inspect.isgeneratorfunction(inner) or inspect.isgeneratorfunction(runs):
        return (
            f"handler {_name(runs)} is a generator function (it contains yield), so calling it "
            "returns a generator without running its body: write it as a plain def without "
            "yield that does the work and returns"
        )
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return None  # no signature to read (some builtins): let it run
    try:
        signature.bind(object())
    except TypeError:
        return (
            f"handler {name} cannot be called with one message (its signature is "
            f"{_bare(signature)}): {_one_argument_fix(func)}"
        )
    return None


def _is_async(func: object) -> bool:
    """True when calling ``func`` returns a coroutine to run: an ``async def``, a partial of
    one, or an instance whose ``__call__`` is one (or is marked as one)."""
    inner: object = func
    while isinstance(inner, functools.partial):
        inner = inner.func
    runs = inner if inspect.isroutine(inner) else type(inner).__call__
    return inspect.iscoroutinefunction(inner) or inspect.iscoroutinefunction(runs)


def _bare(signature: inspect.Signature) -> inspect.Signature:
    """``signature`` without annotations: ``(message, extra)`` reads better in a sentence."""
    empty = inspect.Parameter.empty
    parameters = [p.replace(annotation=empty) for p in signature.parameters.values()]
    return signature.replace(parameters=parameters, return_annotation=empty)


def _one_argument_fix(func: object) -> str:
    if isinstance(func, functools.partial):
        return "leave exactly one positional argument unbound, for the message"
    if not inspect.isroutine(func):
        return "give its class a method def __call__(self, message)"
    own = getattr(func, "__name__", "")
    example = own if own.isidentifier() else "process"  # a lambda is "<lambda>"
    return f"make it take exactly one positional argument, like def {example}(message)"


def _name(obj: object) -> str:
    """``module.qualname`` of a function, method or class; a partial or instance by its kind."""
    if isinstance(obj, functools.partial):
        return f"functools.partial({_name(obj.func)}, ...)"
    qualname = getattr(obj, "__qualname__", None)
    if isinstance(qualname, str):
        return f"{getattr(obj, '__module__', None) or '?'}.{qualname}"
    return f"{_name(type(obj))} instance"
