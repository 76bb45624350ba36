"""Lambda SQS handlers run unchanged: Lambda's event and context in, ReportBatchItemFailures
read back, one batch at a time. On the in-memory SQS with a fake clock."""

from __future__ import annotations

import base64
import hashlib
import importlib
import json
import threading
from typing import Any

import pytest

import sqsworker
from sqsworker import ConfigError, Message
from sqsworker.clock import FakeClock
from sqsworker.errors import HandlerShapeError
from sqsworker.events import Observer
from sqsworker.handler import as_handler
from sqsworker.lambdas import LambdaResultError, read_result
from sqsworker.transports import OutgoingMessage, send_all
from sqsworker.transports.memory import MemorySQS

from ..conftest import wait_until
from .helpers import Rig


class Invocations:
    """A Lambda handler that records each (event, context) and answers with ``answer``."""

    def __init__(self, answer: Any = None) -> None:
        self.answer = answer
        self.events: list[dict[str, Any]] = []
        self.contexts: list[Any] = []
        self.remaining: list[int] = []

    def __call__(self, event: dict[str, Any], context: Any) -> Any:
        self.events.append(json.loads(json.dumps(event)))  # what Lambda sends is JSON
        self.contexts.append(context)
        self.remaining.append(context.get_remaining_time_in_millis())
        return self.answer(event) if callable(self.answer) else self.answer


def lambda_rig(memory: MemorySQS, clock: FakeClock, function: Any, **options: Any) -> Rig:
    options.setdefault("batch_size", 10)
    options.setdefault("concurrency", 1)  # the Rig's own default is 2
    return Rig(memory, clock, sqsworker.lambda_handler()(function), **options)


def test_the_event_is_lambdas_sqs_event_record_for_record(
    memory: MemorySQS, clock: FakeClock
) -> None:
    function = Invocations()
    rig = lambda_rig(memory, clock, function, visibility_timeout=30)
    send_all(
        rig.queue,
        [
            OutgoingMessage(
                '{"order": 1}',
                message_attributes={
                    "tenant": {"DataType": "String", "StringValue": "acme"},
                    "weight": {"DataType": "Number", "StringValue": "12.5"},
                    "blob": {"DataType": "Binary", "BinaryValue": b"\x00\x01"},
                },
            )
        ],
    )
    rig.worker.start()
    rig.wait_for("deleted", 1)
    assert rig.stop() == 0
    (event,) = function.events
    (record,) = event["Records"]
    assert sorted(record) == sorted(
        [
            "messageId",
            "receiptHandle",
            "body",
            "attributes",
            "messageAttributes",
            "md5OfMessageAttributes",
            "md5OfBody",
            "eventSource",
            "eventSourceARN",
            "awsRegion",
        ]
    )
    assert record["body"] == '{"order": 1}'
    assert record["md5OfBody"] == hashlib.md5(b'{"order": 1}').hexdigest()
    assert record["eventSource"] == "aws:sqs"
    assert record["eventSourceARN"] == rig.queue.info.arn
    assert record["awsRegion"] == rig.queue.info.arn.split(":")[3]
    assert record["attributes"]["ApproximateReceiveCount"] == "1"
    assert {"SentTimestamp", "ApproximateFirstReceiveTimestamp"} <= set(record["attributes"])
    assert record["messageAttributes"] == {
        "tenant": {
            "stringValue": "acme",
            "stringListValues": [],
            "binaryListValues": [],
            "dataType": "String",
        },
        "weight": {
            "stringValue": "12.5",
            "stringListValues": [],
            "binaryListValues": [],
            "dataType": "Number",
        },
        "blob": {
            "binaryValue": base64.b64encode(b"\x00\x01").decode(),
            "stringListValues": [],
            "binaryListValues": [],
            "dataType": "Binary",
        },
    }


def test_the_context_has_lambdas_fields_and_its_time_left_is_the_leases(
    memory: MemorySQS, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "orders-consumer")
    function = Invocations()
    rig = lambda_rig(memory, clock, function, visibility_timeout=30)
    rig.send("a", "b")
    rig.worker.start()
    rig.wait_for("deleted", 2)
    assert rig.stop() == 0
    context = function.contexts[0]
    region, account = rig.queue.info.arn.split(":")[3:5]
    assert context.function_name == "orders-consumer"
    assert context.invoked_function_arn == (
        f"arn:aws:lambda:{region}:{account}:function:orders-consumer"
    )
    assert context.memory_limit_in_mb == 128 and context.function_version == "$LATEST"
    assert context.log_group_name == "/aws/lambda/orders-consumer"
    assert len({c.aws_request_id for c in function.contexts}) == len(function.contexts)
    assert 0 < function.remaining[0] <= 30_000  # the batch's lease, not Lambda's 15 minutes


@pytest.mark.parametrize(
    "answer",
    [None, {}, {"batchItemFailures": []}, {"batchItemFailures": None}, {"statusCode": 200}],
    ids=["none", "empty", "empty-list", "null-list", "no-failures-key"],
)
def test_an_empty_response_is_success_for_every_message(answer: Any) -> None:
    assert read_result(answer, ["m1", "m2"]).failed == {}


def test_listed_item_identifiers_fail_and_the_others_succeed() -> None:
    result = read_result({"batchItemFailures": [{"itemIdentifier": "m2"}]}, ["m1", "m2", "m3"])
    assert list(result.failed) == ["m2"]


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        ("ok", "the Lambda handler returned str, and a response to an SQS batch is None or"),
        ({"batchItemFailures": "m1"}, "batchItemFailures is a str, not a list of"),
        ({"batchItemFailures": [{"itemIdentifier": ""}]}, "which has no itemIdentifier"),
        ({"batchItemFailures": [{"id": "m1"}]}, "which has no itemIdentifier"),
        ({"batchItemFailures": [{"itemIdentifier": "m9"}]}, "'m9', which is not a messageId"),
    ],
    ids=["not-a-dict", "not-a-list", "empty-identifier", "bad-key", "unknown-identifier"],
)
def test_a_result_lambda_cannot_read_fails_the_whole_batch_saying_what_was_wrong(
    memory: MemorySQS, clock: FakeClock, answer: Any, why: str
) -> None:
    with pytest.raises(LambdaResultError) as raised:
        read_result(answer, ["m1", "m2"])
    assert why in str(raised.value)

    errors: list[str] = []

    class Failures(Observer):
        def handler_failed(self, message: Message, error: BaseException, *args: Any) -> None:
            errors.append(str(error))

    rig = lambda_rig(memory, clock, Invocations(answer), observers=[Failures()])
    rig.send("a", "b")
    rig.worker.start()
    rig.advance_until(lambda: rig.count("failed") == 2)
    assert rig.count("deleted") == 0 and all(why in e for e in errors)
    assert rig.stop() == 0


def test_partial_failures_fail_only_their_messages(memory: MemorySQS, clock: FakeClock) -> None:
    def answer(event: dict[str, Any]) -> dict[str, Any]:
        bad = [r["messageId"] for r in event["Records"] if r["body"] == "bad"]
        return {"batchItemFailures": [{"itemIdentifier": i} for i in bad]}

    rig = lambda_rig(memory, clock, Invocations(answer))
    rig.send("good", "bad", "fine")
    rig.worker.start()
    rig.advance_until(lambda: rig.count("deleted") == 2 and rig.count("failed") == 1)
    assert rig.stop() == 0


def test_an_exception_fails_the_whole_batch(memory: MemorySQS, clock: FakeClock) -> None:
    def answer(event: dict[str, Any]) -> None:
        raise RuntimeError("downstream unavailable")

    rig = lambda_rig(memory, clock, Invocations(answer))
    rig.send("a", "b", "c")
    rig.worker.start()
    rig.advance_until(lambda: rig.count("failed") == 3)
    assert rig.count("deleted") == 0
    assert rig.stop() == 0


def test_one_batch_at_a_time_and_concurrency_above_1_is_refused(
    memory: MemorySQS, clock: FakeClock
) -> None:
    running = 0
    most = 0
    lock = threading.Lock()

    def function(event: dict[str, Any], context: Any) -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        threading.Event().wait(0.01)
        with lock:
            running -= 1

    rig = lambda_rig(memory, clock, function, batch_size=2)
    assert rig.worker.config.concurrency == 1
    rig.send(*[f"m{i}" for i in range(10)])
    rig.worker.start()
    rig.wait_for("deleted", 10)
    assert most == 1
    assert rig.stop() == 0

    with pytest.raises(ConfigError) as raised:
        lambda_rig(memory, clock, function, queue="other", concurrency=4)
    assert str(raised.value).startswith(
        "concurrency is 4, and a Lambda handler runs one batch at a time, as in one Lambda "
        "execution environment"
    )


def one_message(message: Message) -> None:
    pass


def no_context(event: dict[str, Any]) -> None:
    pass


async def async_lambda(event: dict[str, Any], context: Any) -> None:
    pass


@pytest.mark.parametrize(
    ("make", "sentence"),
    [
        (
            lambda: as_handler(sqsworker.handler()(one_message), "app:one_message", True),
            "app:one_message is a handler of one message, and --lambda runs a Lambda handler "
            "of (event, context)",
        ),
        (
            lambda: as_handler(no_context, "app:no_context", True),
            f"Lambda handler {__name__}.no_context cannot be called with (event, context)",
        ),
        (
            lambda: sqsworker.lambda_handler()(async_lambda),
            f"Lambda handler {__name__}.async_lambda is an async def function",
        ),
    ],
    ids=["message-handler-with-lambda", "wrong-arity", "async"],
)
def test_a_handler_that_cannot_run_as_a_lambda_handler_is_refused(make: Any, sentence: str) -> None:
    with pytest.raises(HandlerShapeError) as raised:
        make()
    assert str(raised.value).startswith(sentence)


def test_the_powertools_example_runs_unchanged(
    memory: MemorySQS, clock: FakeClock, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """examples/lambda_orders.py: Powertools' BatchProcessor, process_partial_response and
    Logger.inject_lambda_context, on the event and context the worker makes."""
    ledger = tmp_path / "ledger.txt"
    monkeypatch.setenv("ORDERS_LEDGER", str(ledger))
    example = importlib.import_module("examples.lambda_orders")
    handler = as_handler(example.lambda_handler, as_lambda=True)
    rig = Rig(memory, clock, handler, batch_size=10, concurrency=1)
    rig.send(*[json.dumps({"id": n, "amount": -1 if n == 3 else 10}) for n in range(6)])
    rig.worker.start()
    rig.advance_until(lambda: rig.count("deleted") == 5 and rig.count("failed") == 1)
    wait_until(lambda: len(ledger.read_text().splitlines()) == 5)
    stored = sorted(int(line.split()[0]) for line in ledger.read_text().splitlines())
    assert stored == [0, 1, 2, 4, 5]
    assert rig.stop() == 0


def test_failures_listed_in_a_tuple_are_read_as_lambda_reads_json() -> None:
    result = read_result({"batchItemFailures": ({"itemIdentifier": "m2"},)}, ["m1", "m2"])
    assert list(result.failed) == ["m2"]


def test_a_malformed_memory_size_is_refused_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "1GB")
    with pytest.raises(ConfigError) as raised:
        as_handler(no_context_either, "app:handler", True)
    assert str(raised.value).startswith("AWS_LAMBDA_FUNCTION_MEMORY_SIZE is '1GB'")


def no_context_either(event: dict[str, Any], context: Any) -> None:
    pass


def test_lambda_applies_to_every_handler_a_module_target_names(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sqsworker.process import find_handlers

    (tmp_path / "mixedapp.py").write_text(
        "import sqsworker\n\n@sqsworker.handler(queue='q')\ndef process(message):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(HandlerShapeError) as raised:
        find_handlers(["mixedapp"], as_lambda=True)
    assert str(raised.value).startswith(
        "mixedapp:process is a handler of one message, and --lambda"
    )
