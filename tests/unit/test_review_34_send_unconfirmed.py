"""Review 34: a send whose answer never came (a read timeout after SQS took the batch) is
as unconfirmed as an entry the answer did not name, but SendError says it was "not sent"
(commit 35c6d5f words only EntryNotAnswered so; the retryable whole-call failure keeps its
own code, ConnectionError, and the flat "not sent"). The user who sends it again sends a
copy of a message SQS has."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import EndpointConnectionError, ReadTimeoutError

from sqsworker import producer as producer_module
from sqsworker.producer import Producer, SendError
from sqsworker.transports import QueueInfo
from sqsworker.transports import sqs as sqs_module
from sqsworker.transports.sqs import SQSTransport


class TakesThenTimesOut:
    """SQS taking each batch, its answer lost on the way back."""

    def __init__(self) -> None:
        self.taken: list[str] = []

    def send_message_batch(self, QueueUrl: str, Entries: list[dict[str, Any]]) -> Any:
        self.taken += [e["MessageBody"] for e in Entries]
        raise ReadTimeoutError(endpoint_url="https://sqs.us-east-1.amazonaws.com/")

    def close(self) -> None:
        pass


def test_a_send_whose_answer_was_lost_is_not_said_to_be_not_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sqs_module.time, "sleep", lambda s: None)
    monkeypatch.setattr(producer_module.time, "sleep", lambda s: None)
    client = TakesThenTimesOut()
    transport = SQSTransport(client, QueueInfo(url="u", name="q", arn=""), attempts=1)
    with Producer("q", transport=transport) as producer, pytest.raises(SendError) as raised:
        producer.send("a")
    assert client.taken, "SQS took the message"
    text = str(raised.value)
    assert "messages were not sent to" not in text, (
        f"SQS has the message ({len(client.taken)} copies), and the error says: {text}; "
        f"failed={raised.value.failed}"
    )


class TimesOutThenCannotConnect(TakesThenTimesOut):
    """Each call's first try taken by SQS, its answer lost; the transport's next try
    finds no connection. The call's last error says nothing reached SQS; its first did."""

    def send_message_batch(self, QueueUrl: str, Entries: list[dict[str, Any]]) -> Any:
        if len(self.taken) % 2 == 0:
            super().send_message_batch(QueueUrl, Entries)
        self.taken.append("")  # the try that never connected
        raise EndpointConnectionError(endpoint_url="https://sqs.us-east-1.amazonaws.com/")


def test_a_call_is_maybe_sent_if_any_try_of_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqs_module.time, "sleep", lambda s: None)
    monkeypatch.setattr(producer_module.time, "sleep", lambda s: None)
    client = TimesOutThenCannotConnect()
    transport = SQSTransport(client, QueueInfo(url="u", name="q", arn=""), attempts=2)
    with Producer("q", transport=transport) as producer, pytest.raises(SendError) as raised:
        producer.send("a")
    assert raised.value.failed[0][2].startswith("SendMessageBatch failed: Could not connect")
    assert raised.value.unconfirmed == {0}
