"""The boto3 transport's retries: which failures are tried again, how often, after how long."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from sqsworker.errors import TransportError
from sqsworker.transports import QueueInfo
from sqsworker.transports import sqs as sqs_module
from sqsworker.transports.sqs import SQSTransport


def refused(code: str, status: int) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": "no"}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "DeleteMessageBatch",
    )


class Failing:
    """A call that raises each of ``errors`` in turn, then answers."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self, **kwargs: Any) -> dict[str, Any]:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return {"Successful": [], "Failed": []}


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr(sqs_module.time, "sleep", slept.append)
    return slept


def transport() -> SQSTransport:
    return SQSTransport(object(), QueueInfo(url="u", name="q", arn=""), attempts=4)


def test_throttling_and_resets_are_tried_again_after_growing_pauses(sleeps: list[float]) -> None:
    call = Failing(
        refused("ThrottlingException", 400),
        EndpointConnectionError(endpoint_url="http://sqs"),
        refused("InternalError", 500),
    )
    queue = transport()
    assert queue._call("DeleteMessageBatch", call) == {"Successful": [], "Failed": []}
    assert call.calls == 4
    assert queue.requests["DeleteMessageBatch"] == 4  # every attempt is a counted request
    assert queue.request_errors["DeleteMessageBatch", "ThrottlingException"] == 1
    assert queue.request_errors["DeleteMessageBatch", "ConnectionError"] == 1
    for slept, least in zip(sleeps, (0.1, 0.2, 0.4), strict=True):
        assert least <= slept <= least + 0.1


def test_the_last_attempt_s_error_is_raised_and_a_refusal_is_not_tried_again(
    sleeps: list[float],
) -> None:
    queue = transport()
    busy = Failing(*(refused("ServiceUnavailable", 503) for _ in range(5)))
    with pytest.raises(TransportError, match="ServiceUnavailable") as raised:
        queue._call("DeleteMessageBatch", busy)
    assert busy.calls == 4 and raised.value.retryable
    refusal = Failing(refused("AccessDenied", 403))
    with pytest.raises(TransportError, match="AccessDenied") as raised:
        queue._call("DeleteMessageBatch", refusal)
    assert refusal.calls == 1 and not raised.value.retryable
    one = Failing(refused("ThrottlingException", 400))
    with pytest.raises(TransportError):
        queue._call("ReceiveMessage", one, 1)  # a receive: one attempt
    assert one.calls == 1
    assert len(sleeps) == 3  # the busy call's pauses only


def test_pauses_stop_growing_at_two_seconds(sleeps: list[float]) -> None:
    queue = SQSTransport(object(), QueueInfo(url="u", name="q", arn=""), attempts=8)
    queue._call("DeleteMessageBatch", Failing(*(refused("Throttling", 400) for _ in range(7))))
    assert [round(s, 1) // 1 for s in sleeps[-3:]] == [1.0, 2.0, 2.0]
    assert all(s <= 2.1 for s in sleeps)
