"""Review 35 (fa0fa44): a send SQS answered with a refusal is "not sent", by the commit's
own rule ("a refusal stays 'not sent'") and docs/operating.md ("One SQS did not confirm
either way ... its request's answer never came"). A throttled SendMessageBatch is
answered (HTTP 400, ThrottlingException): SQS took nothing. It is retryable, though, and
``Producer._send`` marks every retryable whole-call failure ``unconfirmed``: the message
SQS refused is reported "maybe sent" ("may not have been sent", "1 maybe sent"), and a
user told that sending it again may send a copy may well not send it again: lost."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from sqsworker import producer as producer_module
from sqsworker.producer import Producer, SendError
from sqsworker.transports import QueueInfo
from sqsworker.transports import sqs as sqs_module
from sqsworker.transports.sqs import SQSTransport


class Throttles:
    """SQS refusing every SendMessageBatch with a throttling answer: nothing taken."""

    def __init__(self, code: str) -> None:
        self.code = code
        self.taken: list[str] = []
        self.calls = 0

    def send_message_batch(self, QueueUrl: str, Entries: list[dict[str, Any]]) -> Any:
        self.calls += 1
        raise ClientError(
            {
                "Error": {"Code": self.code, "Message": "Rate exceeded"},
                "ResponseMetadata": {"HTTPStatusCode": 400},
            },
            "SendMessageBatch",
        )

    def close(self) -> None:
        pass


@pytest.mark.parametrize("code", ["ThrottlingException", "RequestThrottled"])
def test_a_send_sqs_answered_throttled_is_not_said_maybe_sent(
    monkeypatch: pytest.MonkeyPatch, code: str
) -> None:
    monkeypatch.setattr(sqs_module.time, "sleep", lambda s: None)
    monkeypatch.setattr(producer_module.time, "sleep", lambda s: None)
    client = Throttles(code)
    transport = SQSTransport(client, QueueInfo(url="u", name="q", arn=""), attempts=1)
    with Producer("q", transport=transport) as producer, pytest.raises(SendError) as raised:
        producer.send("a")
    error = raised.value
    assert client.calls >= 1 and not client.taken  # every try was answered: refused
    assert error.unconfirmed == frozenset(), (
        f"SQS answered each try {code} and took nothing, yet the message is reported "
        f"maybe sent: unconfirmed={set(error.unconfirmed)}, text: {error}"
    )


class CannotConnect(Throttles):
    """No connection to the endpoint at all: the request never left this machine."""

    def send_message_batch(self, QueueUrl: str, Entries: list[dict[str, Any]]) -> Any:
        self.calls += 1
        raise EndpointConnectionError(endpoint_url="https://sqs.us-east-1.amazonaws.com/")


def test_a_send_that_never_connected_is_not_said_maybe_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sqs_module.time, "sleep", lambda s: None)
    monkeypatch.setattr(producer_module.time, "sleep", lambda s: None)
    client = CannotConnect("")
    transport = SQSTransport(client, QueueInfo(url="u", name="q", arn=""), attempts=1)
    with Producer("q", transport=transport) as producer, pytest.raises(SendError) as raised:
        producer.send("a")
    assert client.calls >= 1
    assert raised.value.unconfirmed == frozenset(), (
        f"no request reached SQS, yet the message is reported maybe sent: {raised.value}"
    )
