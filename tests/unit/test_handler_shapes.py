"""Issue 13, defect 14: a handler that cannot handle a message is refused before any message.

A generator's body never ran and a class only built an object, so their messages were
deleted with no work done; a function of no arguments failed every message into the
dead-letter queue. Each such shape is refused with one sentence at decoration, at
``Handler(...)``, ``as_handler`` and ``Worker(...)``, and by ``sqsworker run`` with exit
code 2. ``async def`` handlers, refused at first, now run as coroutines (issue 15): every
way of writing one is accepted here and awaited.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import sqsworker
from sqsworker import ConfigError, Handler, Message, Worker, WorkerConfig
from sqsworker.clock import FakeClock
from sqsworker.errors import HandlerShapeError
from sqsworker.handler import as_handler
from sqsworker.importer import import_from_string
from sqsworker.local import LocalSQS
from sqsworker.transports import send_all
from sqsworker.transports.memory import MemorySQS
from sqsworker.transports.sqs import SQSTransport

from ..conftest import unique
from .helpers import Rig

HERE = __name__  # the module the handlers below are named after

CLASS = (
    "is a class, and calling a class with a message only constructs an object: decorate a "
    "function with @sqsworker.handler() instead, or pass an instance of a class that defines "
    "__call__(self, message)"
)
SIGNATURE = "cannot be called with one message (its signature is"


# The shapes that cannot work ---------------------------------------------------------


async def stream(message: Message) -> AsyncIterator[str]:
    yield message.body


def produce(message: Message) -> Iterator[str]:
    yield message.body


class Order:
    def __init__(self, message: Message) -> None:
        self.message = message


def no_arguments() -> None:
    pass


def two_arguments(message: Message, extra: str) -> None:
    pass


def keyword_only(message: Message, *, retries: int) -> None:
    pass


class GeneratorCall:
    def __call__(self, message: Message) -> Iterator[str]:
        yield message.body


class NoMessageCall:
    def __call__(self) -> None:
        pass


BAD_SHAPES = [
    pytest.param(
        stream,
        f"handler {HERE}.stream is an async generator function (it contains yield), so calling "
        "it returns an async iterator without running its body: write it as an async def "
        "without yield that does the work and returns",
        id="async-generator",
    ),
    pytest.param(
        produce,
        f"handler {HERE}.produce is a generator function (it contains yield), so calling it "
        "returns a generator without running its body: write it as a plain def without yield "
        "that does the work and returns",
        id="generator",
    ),
    pytest.param(Order, f"handler {HERE}.Order {CLASS}", id="class"),
    pytest.param(
        no_arguments,
        f"handler {HERE}.no_arguments {SIGNATURE} ()): make it take exactly one positional "
        "argument, like def no_arguments(message)",
        id="no-arguments",
    ),
    pytest.param(
        two_arguments,
        f"handler {HERE}.two_arguments {SIGNATURE} (message, extra)): make it "
        "take exactly one positional argument, like def two_arguments(message)",
        id="two-arguments",
    ),
    pytest.param(
        keyword_only,
        f"handler {HERE}.keyword_only {SIGNATURE} (message, *, retries)): "
        "make it take exactly one positional argument, like def keyword_only(message)",
        id="required-keyword",
    ),
    pytest.param(
        lambda: None,
        f"handler {HERE}.<lambda> {SIGNATURE} ()): make it take exactly one positional "
        "argument, like def process(message)",
        id="lambda-without-message",
    ),
    pytest.param(
        GeneratorCall(),
        f"handler {HERE}.GeneratorCall.__call__ is a generator function (it contains yield), "
        "so calling it returns a generator without running its body: write it as a plain def "
        "without yield that does the work and returns",
        id="instance-with-generator-call",
    ),
    pytest.param(
        NoMessageCall(),
        f"handler {HERE}.NoMessageCall instance {SIGNATURE} ()): give its class a method "
        "def __call__(self, message)",
        id="instance-whose-call-takes-no-message",
    ),
    pytest.param(
        functools.partial(two_arguments, "message", "extra"),
        f"handler functools.partial({HERE}.two_arguments, ...) {SIGNATURE} ()): leave exactly "
        "one positional argument unbound, for the message",
        id="partial-with-nothing-left",
    ),
    pytest.param(
        functools.partial(Order),
        f"handler functools.partial({HERE}.Order, ...) {CLASS}",
        id="partial-of-class",
    ),
]


def decorated(obj: Any) -> object:
    return sqsworker.handler(queue="jobs")(obj)


def constructed(obj: Any) -> object:
    return Handler(obj, {})


def resolved(obj: Any) -> object:
    return as_handler(obj, "app:thing")


def embedded(obj: Any) -> object:
    memory = MemorySQS(FakeClock())
    memory.create_queue("jobs")
    return Worker(obj, WorkerConfig(queue="jobs"), transport=memory.transport("jobs"))


@pytest.mark.parametrize("entry", [decorated, constructed, resolved, embedded])
@pytest.mark.parametrize(("shape", "expected"), BAD_SHAPES)
def test_a_handler_that_cannot_work_is_refused_in_one_sentence(
    entry: Callable[[Any], object], shape: object, expected: str
) -> None:
    with pytest.raises(HandlerShapeError) as raised:
        entry(shape)
    assert str(raised.value) == expected
    assert isinstance(raised.value, ConfigError)  # what `sqsworker run` answers with exit 2
    assert isinstance(raised.value, TypeError)  # what a library user expects of a bad callable


def test_the_decorator_without_parentheses_is_refused() -> None:
    """`@sqsworker.handler` bare made the function a queue name and the handler a decorator,
    which took each message for a function and reported it processed."""

    def process(message: Message) -> None:
        pass

    with pytest.raises(HandlerShapeError) as raised:
        sqsworker.handler(process)  # type: ignore[arg-type]
    assert str(raised.value) == (
        f"@sqsworker.handler above {HERE}.test_the_decorator_without_parentheses_is_refused."
        "<locals>.process needs parentheses: write @sqsworker.handler() or "
        "@sqsworker.handler(queue=...)"
    )


def test_a_builtin_without_a_signature_is_accepted() -> None:
    with pytest.raises(ValueError, match="no signature found"):
        inspect.signature(max)
    assert Handler(max, {}).func is max


# The shapes that work ----------------------------------------------------------------


class Recorder:
    def __init__(self, seen: list[str]) -> None:
        self.seen = seen

    def __call__(self, message: Message) -> None:
        self.seen.append(message.body)

    def record(self, message: Message) -> None:
        self.seen.append(message.body)


def record_into(seen: list[str], message: Message) -> None:
    seen.append(message.body)


def plain(seen: list[str]) -> Callable[[Message], None]:
    def process(message: Message) -> None:
        seen.append(message.body)

    return process


async def record_later(seen: list[str], message: Message) -> None:
    await asyncio.sleep(0)
    seen.append(message.body)


def plain_async(seen: list[str]) -> Callable[[Message], Any]:
    async def process(message: Message) -> None:
        await record_later(seen, message)

    return process


class AsyncRecorder:
    def __init__(self, seen: list[str]) -> None:
        self.seen = seen

    async def __call__(self, message: Message) -> None:
        await record_later(self.seen, message)


def marked(seen: list[str]) -> Callable[[Message], Any]:
    """A plain def returning a coroutine, marked as a coroutine function (Python 3.12+)."""

    def returns_awaitable(message: Message) -> Any:
        return record_later(seen, message)

    return inspect.markcoroutinefunction(returns_awaitable)  # type: ignore[attr-defined,no-any-return]


GOOD_SHAPES = [
    pytest.param(plain, False, id="plain-function"),
    pytest.param(lambda seen: sqsworker.handler(queue="jobs")(plain(seen)), False, id="decorated"),
    pytest.param(Recorder, False, id="callable-instance"),
    pytest.param(lambda seen: Recorder(seen).record, False, id="bound-method"),
    pytest.param(lambda seen: functools.partial(record_into, seen), False, id="partial-one-left"),
    pytest.param(
        lambda seen: lambda message, *rest: seen.append(message.body), False, id="varargs"
    ),
    pytest.param(plain_async, True, id="async-def"),
    pytest.param(
        lambda seen: sqsworker.handler(queue="jobs")(plain_async(seen)), True, id="async-decorated"
    ),
    pytest.param(AsyncRecorder, True, id="instance-with-async-call"),
    pytest.param(lambda seen: functools.partial(record_later, seen), True, id="partial-of-async"),
    pytest.param(
        lambda seen: functools.partial(functools.partial(AsyncRecorder(seen))),
        True,
        id="partial-of-async-instance",
    ),
    pytest.param(
        marked,
        True,
        id="markcoroutinefunction",
        marks=pytest.mark.skipif(
            not hasattr(inspect, "markcoroutinefunction"),
            reason="inspect.markcoroutinefunction is new in Python 3.12",
        ),
    ),
]


@pytest.mark.parametrize(("make", "is_async"), GOOD_SHAPES)
def test_a_handler_of_one_message_is_accepted_and_does_its_work(
    memory: MemorySQS, clock: FakeClock, make: Callable[[list[str]], Any], is_async: bool
) -> None:
    seen: list[str] = []
    rig = Rig(memory, clock, make(seen))
    assert rig.worker.handler.is_async is is_async  # awaited on the event loop, or called
    rig.send("a", "b")
    rig.worker.start()
    rig.wait_for("deleted", 2)
    assert sorted(seen) == ["a", "b"]  # deleted because the handler ran, not instead of it
    assert rig.stop() == 0


# At start --------------------------------------------------------------------------


def test_a_module_whose_decorated_handler_is_async_imports_it_as_a_coroutine_handler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "asyncdecorated.py").write_text(
        textwrap.dedent("""
        import sqsworker

        @sqsworker.handler(queue="orders", concurrency=500)
        async def process(message):
            pass
        """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "asyncdecorated", raising=False)
    handler = as_handler(import_from_string("asyncdecorated:process"))
    assert handler.is_async and handler.options == {"queue": "orders", "concurrency": 500}


APPS = {
    "async-generator": (
        """
        async def thing(message):
            yield message.body
        """,
        "handler shapeapp.thing is an async generator function (it contains yield), so calling "
        "it returns an async iterator without running its body: write it as an async def "
        "without yield that does the work and returns",
    ),
    "class": (
        """
        class thing:
            def __init__(self, message):
                print("ran", message.body)
        """,
        f"handler shapeapp.thing {CLASS}",
    ),
    "no-arguments": (
        """
        def thing():
            print("ran")
        """,
        f"handler shapeapp.thing {SIGNATURE} ()): make it take exactly one positional "
        "argument, like def thing(message)",
    ),
    "async-batch": (
        """
        import sqsworker

        @sqsworker.batch_handler()
        async def thing(messages):
            print("ran", len(messages))
        """,
        "batch handler shapeapp.thing is an async def function, and batch handlers run on "
        "threads: write it as a plain def, or handle one message at a time with an async def "
        "under @sqsworker.handler(...)",
    ),
    "list-as-one-message": (
        """
        import sqsworker

        def thing(messages: list[sqsworker.Message]):
            print("ran", len(messages))
        """,
        "handler shapeapp.thing takes a list of messages (its parameter is annotated so), but "
        "is not a batch handler: decorate it with @sqsworker.batch_handler(...) to be given "
        "lists of messages",
    ),
    "lambda-of-one-argument --lambda": (
        """
        def thing(event):
            print("ran", event)
        """,
        "Lambda handler shapeapp.thing cannot be called with (event, context) (its signature "
        "is (event)): write it as def handler(event, context)",
    ),
    "batch-size-on-a-message-handler --batch-size 5": (
        """
        def thing(message):
            print("ran", message.body)
        """,
        "batch-size applies to batch handlers only, and shapeapp.thing handles one message at "
        "a time: decorate it with @sqsworker.batch_handler(...), leave the option out, or set "
        "it for the batch handler alone (--set NAME.batch_size=N, or SQSWORKER_NAME__BATCH_SIZE)",
    ),
    "lambda-without-the-flag": (
        """
        def thing(event, context):
            print("ran", event)
        """,
        "handler shapeapp.thing takes (event, context), as a Lambda handler does: run it with "
        "sqsworker run ... --lambda, or decorate it with @sqsworker.lambda_handler(...)",
    ),
    "lambda-with-concurrency --lambda --concurrency 4": (
        """
        def thing(event, context):
            print("ran", event)
        """,
        "concurrency is 4, and a Lambda handler runs one batch at a time, as in one Lambda "
        "execution environment (its module-level state is not made for two at once): leave "
        "--concurrency at 1 and run more replicas",
    ),
}


@pytest.mark.parametrize(("source", "expected"), list(APPS.values()), ids=list(APPS))
def test_sqsworker_run_refuses_the_handler_with_exit_2_and_leaves_the_queue_alone(
    request: pytest.FixtureRequest,
    local_sqs: LocalSQS,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    source: str,
    expected: str,
) -> None:
    for key, value in local_sqs.env().items():
        monkeypatch.setenv(key, value)
    queue = unique("shapes")
    local_sqs.create_queue(queue, visibility_timeout=30)
    transport = SQSTransport.connect(queue)
    send_all(transport, ["order-1"])
    (tmp_path / "shapeapp.py").write_text(textwrap.dedent(source))

    # --burst and a short poll: were the handler accepted, the run would end (exit 0) soon
    # after handling the message, rather than at the timeout.
    extra = request.node.callspec.id.split(" ")[1:]  # the flags some cases run with
    command = ["run", "shapeapp:thing", "--queue", queue, "--burst", "--wait-time", "1", *extra]
    result = subprocess.run(
        [sys.executable, "-m", "sqsworker.cli", *command, "--metrics-port", "off"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode == 2, result.stderr
    assert result.stderr == f"sqsworker: error: {expected}.\n"
    assert result.stdout == ""
    assert transport.counts().visible == 1  # not received, not deleted
    [envelope] = transport.receive(10, 0, 30)
    assert (envelope.body, envelope.receive_count) == ("order-1", 1)
    transport.close()
