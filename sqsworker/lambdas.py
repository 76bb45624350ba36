"""A Lambda SQS handler, unchanged: ``handler(event, context)`` called with a batch.

``LambdaAdapter`` is a batch handler around the function. It builds the event exactly as
Lambda's SQS event source does (``{"Records": [...]}``, each record in Lambda's own
shape) and a context whose remaining time is the batch's leases, then reads the result
as ReportBatchItemFailures does: ``None``, an empty response or an empty
``batchItemFailures`` is success for all; the listed ``itemIdentifier``s fail; an
exception, or an identifier that is empty or names no message of the batch, fails the
whole batch. A result of another shape fails the whole batch too, saying what it was.

Lambda runs one invocation at a time per execution environment, and handlers count on
it (module-level state such as Powertools' ``BatchProcessor`` is reused between
invocations and is not thread-safe), so a Lambda handler runs one batch at a time per
worker: its ``concurrency`` must be 1, and a process scales by replicas.
"""

from __future__ import annotations

import base64
import hashlib
import inspect
import math
import os
import struct
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from .batches import BatchReportError, BatchResult
from .errors import ConfigError
from .message import Message

LambdaFunc = Callable[[dict[str, Any], Any], object]

DEFAULT_MEMORY_MB = 128  # Lambda's default; AWS_LAMBDA_FUNCTION_MEMORY_SIZE overrides it


class LambdaResultError(BatchReportError):
    """A Lambda handler's result is not what ReportBatchItemFailures reads."""


class LambdaContext:
    """What Lambda passes as ``context``; the remaining time is the batch's leases'."""

    def __init__(self, function_name: str, queue_arn: str, messages: Sequence[Message]) -> None:
        region, account = _region_and_account(queue_arn)
        self.function_name = function_name
        self.function_version = os.environ.get("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
        self.invoked_function_arn = f"arn:aws:lambda:{region}:{account}:function:{function_name}"
        self.memory_limit_in_mb = memory_size()
        self.aws_request_id = str(uuid.uuid4())
        self.log_group_name = f"/aws/lambda/{function_name}"
        day = datetime.now(UTC).strftime("%Y/%m/%d")
        self.log_stream_name = f"{day}/[{self.function_version}]{uuid.uuid4().hex}"
        self.identity = None
        self.client_context = None
        self._messages = messages

    def get_remaining_time_in_millis(self) -> int:
        """Until the first lease of the batch runs out: the worker renews them while the
        handler runs, so this grows again after each renewal, as a deadline it is not."""
        left = min((m.lease.seconds_left for m in self._messages), default=0.0)
        return max(0, math.floor(left * 1000))

    def __repr__(self) -> str:
        return f"<LambdaContext {self.function_name} {self.aws_request_id}>"


def memory_size() -> int:
    """``$AWS_LAMBDA_FUNCTION_MEMORY_SIZE`` (megabytes), else Lambda's default."""
    raw = os.environ.get("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "")
    if not raw:
        return DEFAULT_MEMORY_MB
    if not raw.isdigit() or int(raw) == 0:
        raise ConfigError(
            f"AWS_LAMBDA_FUNCTION_MEMORY_SIZE is {raw!r}, and the context's "
            "memory_limit_in_mb is a whole number of megabytes: set it as Lambda does "
            "(e.g. 1024), or unset it for 128"
        )
    return int(raw)


class LambdaAdapter:
    """A batch handler that calls ``func(event, context)`` and reads its result."""

    def __init__(self, func: LambdaFunc) -> None:
        memory_size()  # a malformed value is refused at start, not on every batch
        self.function = func  # not "func": Handler copies this __dict__ onto itself
        self.__module__ = getattr(func, "__module__", None) or "?"
        self.__qualname__ = getattr(func, "__qualname__", repr(func))
        self.__name__ = getattr(func, "__name__", self.__qualname__)

    def __call__(self, messages: list[Message], queue_arn: str = "") -> BatchResult:
        """One invocation with ``messages``, received from the queue ``queue_arn``."""
        event = {"Records": [record(m, queue_arn) for m in messages]}
        name = os.environ.get("AWS_LAMBDA_FUNCTION_NAME") or self.__name__
        result = self.function(event, LambdaContext(name, queue_arn, messages))
        return read_result(result, [m.message_id for m in messages])


def read_result(result: object, ids: Sequence[str]) -> BatchResult:
    """ReportBatchItemFailures, as AWS documents it."""
    if result is None:
        return BatchResult()
    if not isinstance(result, Mapping):
        raise LambdaResultError(
            f"the Lambda handler returned {type(result).__name__}, and a response to an "
            'SQS batch is None or {"batchItemFailures": [{"itemIdentifier": <messageId>}, ...]}'
        )
    failures = result.get("batchItemFailures")
    if failures is None:
        return BatchResult()
    # What Lambda reads is the result as JSON: a tuple is a list there.
    if not isinstance(failures, (list, tuple)):
        raise LambdaResultError(
            f"batchItemFailures is a {type(failures).__name__}, not a list of "
            '{"itemIdentifier": <messageId>}'
        )
    known = set(ids)
    failed = []
    for item in failures:
        identifier = item.get("itemIdentifier") if isinstance(item, Mapping) else None
        if not isinstance(identifier, str) or not identifier:
            raise LambdaResultError(
                f"batchItemFailures holds {item!r}, which has no itemIdentifier: Lambda fails "
                "the whole batch on it"
            )
        if identifier not in known:
            raise LambdaResultError(
                f"batchItemFailures names {identifier!r}, which is not a messageId of the "
                "batch: Lambda fails the whole batch on it"
            )
        failed.append(identifier)
    return BatchResult(failed)


def record(message: Message, queue_arn: str) -> dict[str, Any]:
    """``message`` as one record of Lambda's SQS event."""
    region, _ = _region_and_account(queue_arn)
    attributes = message.raw_message_attributes
    return {
        "messageId": message.message_id,
        "receiptHandle": message.receipt_handle,
        "body": message.body,
        "attributes": dict(message.attributes),
        "messageAttributes": {name: _attribute(value) for name, value in attributes.items()},
        "md5OfMessageAttributes": _md5_of_attributes(attributes) if attributes else None,
        "md5OfBody": hashlib.md5(message.body.encode()).hexdigest(),
        "eventSource": "aws:sqs",
        "eventSourceARN": queue_arn,
        "awsRegion": region,
    }


def _region_and_account(arn: str) -> tuple[str, str]:
    """``arn:aws:sqs:REGION:ACCOUNT:NAME`` -> (REGION, ACCOUNT); blanks when not an ARN."""
    parts = arn.split(":", 5)
    return (parts[3], parts[4]) if len(parts) == 6 else ("", "")


def _attribute(value: Mapping[str, Any]) -> dict[str, Any]:
    """SQS's ``{"DataType", "StringValue" | "BinaryValue"}`` in Lambda's lower camel case,
    binary values base64-encoded."""
    shaped: dict[str, Any] = {"stringListValues": [], "binaryListValues": []}
    if "StringValue" in value:
        shaped["stringValue"] = value["StringValue"]
    if "BinaryValue" in value:
        raw = value["BinaryValue"]
        shaped["binaryValue"] = base64.b64encode(raw).decode() if isinstance(raw, bytes) else raw
    shaped["dataType"] = value.get("DataType", "String")
    return shaped


def _md5_of_attributes(attributes: Mapping[str, Mapping[str, Any]]) -> str:
    """SQS's MD5 of message attributes: each by name, its name, type and value, each
    length-prefixed, the value after a byte saying string (1) or binary (2)."""
    digest = hashlib.md5()

    def put(data: bytes) -> None:
        digest.update(struct.pack(">I", len(data)) + data)

    for name in sorted(attributes):
        value = attributes[name]
        put(name.encode())
        put(str(value.get("DataType", "String")).encode())
        if "BinaryValue" in value:
            raw = value["BinaryValue"]
            digest.update(b"\x02")
            put(raw if isinstance(raw, bytes) else base64.b64decode(raw))
        else:
            digest.update(b"\x01")
            put(str(value.get("StringValue", "")).encode())
    return digest.hexdigest()


def shape_problem(func: object, name: str) -> str | None:
    """Why ``func(event, context)`` cannot run as a Lambda handler; None if it can."""
    if not callable(func) or isinstance(func, type):
        kind = "class" if isinstance(func, type) else type(func).__name__
        return f"Lambda handler {name} is a {kind}, not a function of (event, context)"
    if inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(
        getattr(func, "__call__", None)  # noqa: B004
    ):
        return (
            f"Lambda handler {name} is an async def function, and Lambda's Python runtime "
            "calls a plain def: write it as def handler(event, context)"
        )
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind({}, None)
    except TypeError:
        return (
            f"Lambda handler {name} cannot be called with (event, context) (its signature is "
            f"{signature}): write it as def handler(event, context)"
        )
    return None
