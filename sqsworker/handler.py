"""``@sqsworker.handler``: a function of one ``Message``, with its worker options;
``@sqsworker.batch_handler``: a function of a list of them.

A message handler is a plain ``def`` (run on a pool of handler threads) or an ``async
def`` (run as coroutines on the worker's event loop thread). A batch handler is a plain
``def``, run on the handler threads, one batch each.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from . import lambdas
from .config import WorkerConfig
from .errors import ConfigError, HandlerShapeError, ImportStringError
from .message import Message
from .producer import encode
from .typed import Typed, plan

if TYPE_CHECKING:
    from .producer import Producer, SendReport

HandlerFunc = Callable[[Message], object]
BATCH_OPTIONS = ("batch_size", "batch_window")


class Handler:
    """A handler function and the options its decorator gave. Calling it calls the function.

    A function that cannot handle a message is refused here, so at decoration, at
    ``Worker(...)`` and at ``sqsworker run``, never after a message was received.
    """

    def __init__(
        self,
        func: HandlerFunc,
        options: Mapping[str, Any],
        batch: bool = False,
        lambda_function: Callable[..., object] | None = None,
    ) -> None:
        decorator = "@sqsworker.batch_handler" if batch else "@sqsworker.handler"
        if lambda_function is not None:
            problem = lambdas.shape_problem(lambda_function, _name(lambda_function))
            if problem:
                raise HandlerShapeError(problem)
            func = lambdas.LambdaAdapter(lambda_function)  # type: ignore[assignment]
            batch, decorator = True, "@sqsworker.lambda_handler"
        known = {f.name for f in dataclasses.fields(WorkerConfig)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(
                f"{decorator} got unknown option(s) {', '.join(unknown)}; "
                f"the options are: {', '.join(sorted(known))}"
            )
        misplaced = [o for o in BATCH_OPTIONS if o in options and not batch]
        if misplaced:
            raise TypeError(
                f"{', '.join(misplaced)} is an option of batch handlers: decorate "
                f"{_name(func)} with @sqsworker.batch_handler(...) to be given lists of messages"
            )
        # A parameter annotated with a model: given the body, parsed and validated.
        typed = None if batch or lambda_function else plan(func, _name(func))
        if isinstance(typed, str):
            raise HandlerShapeError(typed)
        self.typed: Typed | None = typed
        problem = None if lambda_function else _shape_problem(func, batch, typed=bool(typed))
        if problem:
            raise HandlerShapeError(problem)
        self.func = func
        self.is_batch = batch  # given a list of messages: see batches.py
        # A Lambda SQS handler of (event, context), called through lambdas.LambdaAdapter.
        self.is_lambda = lambda_function is not None
        self.is_async = _is_async(func)  # run as a coroutine on the worker's event loop
        self.options = dict(options)
        self.name = f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', func)}"
        functools.update_wrapper(self, func)

    def __call__(self, message: Message) -> object:
        if self.typed is not None:
            if not isinstance(message, Message):  # called with its body, as in a unit test
                message = Message.build(encode(message))
            # A body that does not validate raises, the function unrun.
            return self.func(**self.typed.arguments(message))  # type: ignore[call-arg]
        return self.func(message)

    def __repr__(self) -> str:
        return f"<sqsworker.Handler {self.name}>"

    # -- sending to its own queue (Celery's ``.delay`` habit) ------------------------------

    def send(self, body: object, **options: Any) -> str:
        """Send ``body`` to this handler's queue (``Producer.send``); its message id."""
        return self.producer.send(body, **options)

    def send_many(self, bodies: Iterable[object], **options: Any) -> SendReport:
        """Send ``bodies`` to this handler's queue (``Producer.send_many``)."""
        return self.producer.send_many(bodies, **options)

    @functools.cached_property
    def producer(self) -> Producer:
        """A ``Producer`` for the queue the decorator names, made on first use, with the
        decorator's ``endpoint_url``, ``region`` and ``payload_bucket``."""
        from .producer import Producer

        queue = self.options.get("queue")
        if not queue:
            raise ConfigError(
                f"{self.name} names no queue, so there is nowhere to send to: give its "
                "decorator one (@sqsworker.handler(queue=...)), or use sqsworker.Producer"
            )
        return Producer(
            queue,
            endpoint_url=self.options.get("endpoint_url"),
            region=self.options.get("region"),
            payload_bucket=self.options.get("payload_bucket"),
        )


def handler(queue: str | None = None, **options: Any) -> Callable[[HandlerFunc], Handler]:
    """Mark ``func(message)`` as a handler. Returning normally means success.

    ``func`` may be an ``async def``: it then runs on the worker's event loop, with
    ``concurrency`` counting coroutines instead of threads.

    ``queue`` is a queue name or URL; the other options are those of ``sqsworker run``
    (``concurrency``, ``visibility_timeout``, ``non_retryable``, ...). The command line
    and ``SQSWORKER_*`` variables override them.
    """
    options = _decorator_options("handler", queue, options)

    def decorate(func: HandlerFunc) -> Handler:
        return Handler(func, options)

    return decorate


def batch_handler(
    queue: str | None = None, *, batch_size: int = 10, batch_window: float = 0.0, **options: Any
) -> Callable[[Callable[[list[Message]], object]], Handler]:
    """Mark ``func(messages)`` as a batch handler: given up to ``batch_size`` messages at
    once, after waiting at most ``batch_window`` seconds for a batch to fill.

    Returning ``None`` means every message succeeded; a ``sqsworker.BatchResult(failed)``
    (or raising ``sqsworker.BatchFailure(failed)``) names those that failed, and the
    others are deleted. Any other exception fails the whole batch. ``concurrency`` counts
    batches running at once. The other options are those of ``@sqsworker.handler``.
    """
    options = _decorator_options("batch_handler", queue, options)
    options.update(batch_size=batch_size, batch_window=batch_window)

    def decorate(func: Callable[[list[Message]], object]) -> Handler:
        return Handler(func, options, batch=True)  # type: ignore[arg-type]

    return decorate


def lambda_handler(
    queue: str | None = None, *, batch_size: int = 10, batch_window: float = 0.0, **options: Any
) -> Callable[[Callable[..., object]], Handler]:
    """Mark ``func(event, context)``, a Lambda SQS handler, to run unchanged: given
    Lambda's SQS event for each batch, its result read as ReportBatchItemFailures. One
    batch at a time (``concurrency`` 1), as Lambda runs it. See lambdas.py."""
    options = _decorator_options("lambda_handler", queue, options)
    options.setdefault("concurrency", 1)  # one batch at a time, as Lambda runs one
    options.update(batch_size=batch_size, batch_window=batch_window)

    def decorate(func: Callable[..., object]) -> Handler:
        return Handler(func, options, batch=True, lambda_function=func)

    return decorate


def _decorator_options(decorator: str, queue: object, options: dict[str, Any]) -> dict[str, Any]:
    """A decorator's options, ``queue`` among them; one used without parentheses is
    refused (the function came as ``queue``)."""
    if callable(queue):
        raise HandlerShapeError(
            f"@sqsworker.{decorator} above {_name(queue)} needs parentheses: "
            f"write @sqsworker.{decorator}() or @sqsworker.{decorator}(queue=...)"
        )
    if queue is not None:
        options["queue"] = queue
    return options


def as_handler(obj: object, spec: str = "", as_lambda: bool = False) -> Handler:
    """The handler ``obj`` is; with ``as_lambda`` (``--lambda``), a Lambda SQS handler."""
    if as_lambda:
        if isinstance(obj, Handler) and not obj.is_lambda:
            kind = "batch handler" if obj.is_batch else "handler of one message"
            raise HandlerShapeError(
                f"{spec or obj.name} is a {kind}, and --lambda runs a Lambda handler of "
                "(event, context): leave out --lambda, or name the Lambda function"
            )
        if isinstance(obj, Handler):
            return obj
        return Handler(obj, {"concurrency": 1}, batch=True, lambda_function=obj)  # type: ignore[arg-type]
    if isinstance(obj, Handler):
        return obj
    if callable(obj):
        return Handler(obj, {})
    raise ImportStringError(
        f"{spec or obj!r} is a {type(obj).__name__}, not a handler function of one message"
    )


def _shape_problem(func: object, batch: bool = False, typed: bool = False) -> str | None:
    """Why calling ``func(message)`` (``func(messages)`` for a ``batch`` handler) cannot
    handle a message, in one sentence; None if it can.

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
    if typed:
        return None  # called with its body (and its message): typed.plan read the shape
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return None  # no signature to read (some builtins): let it run
    if list(signature.parameters)[:2] == ["event", "context"]:
        return (
            f"handler {name} takes (event, context), as a Lambda handler does: run it with "
            "sqsworker run ... --lambda, or decorate it with @sqsworker.lambda_handler(...)"
        )
    try:
        signature.bind(object())
    except TypeError:
        given = "a list of messages" if batch else "one message"
        return (
            f"handler {name} cannot be called with {given} (its signature is "
            f"{_bare(signature)}): {_one_argument_fix(func)}"
        )
    takes = _takes(signature)
    if batch and _is_async(func):
        return (
            f"batch handler {name} is an async def function, and batch handlers run on "
            "threads: write it as a plain def, or handle one message at a time with an "
            "async def under @sqsworker.handler(...)"
        )
    if batch and takes == "one":
        return (
            f"batch handler {name} takes one message (its parameter is annotated Message): "
            "take list[sqsworker.Message], or decorate it with @sqsworker.handler(...) to be "
            "given one message at a time"
        )
    if not batch and takes == "list":
        return (
            f"handler {name} takes a list of messages (its parameter is annotated so), but "
            "is not a batch handler: decorate it with @sqsworker.batch_handler(...) to be "
            "given lists of messages"
        )
    return None


def _takes(signature: inspect.Signature) -> str | None:
    """ "list" when the first parameter is annotated as a list (or sequence) of messages,
    "one" when as one message, else None (not annotated, or annotated otherwise)."""
    parameters = list(signature.parameters.values())
    if not parameters or parameters[0].annotation is inspect.Parameter.empty:
        return None
    annotation = parameters[0].annotation
    if isinstance(annotation, str):
        text = annotation
    else:
        text = annotation.__name__ if isinstance(annotation, type) else repr(annotation)
    text = text.replace("sqsworker.", "").replace("typing.", "").replace("collections.abc.", "")
    text = text.replace(" ", "")
    if re.fullmatch(r"(list|List|Sequence|Iterable|Collection)\[(message\.)?Message\]", text):
        return "list"
    if re.fullmatch(r"(message\.)?Message", text):
        return "one"
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
