"""Review 36 (e5b2e7a): TransportError.unapplied is kept across the transport's tries
("a call one try of which may have reached SQS stays maybe applied whatever its last try
met"), but ``Producer._send`` reads it only for a retryable error. A call whose first try
SQS took (its answer lost: a read timeout) and whose retry is refused (ExpiredToken,
AccessDenied: not retryable) raises a TransportError with ``unapplied`` False, and the
refusal branch marks the message failed without adding it to ``unconfirmed``: SendError
and ``sqsworker send`` say "was not sent" / "1 not sent" of a message SQS has. Sent again
on that word, it is a copy."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError, ReadTimeoutError

from sqsworker import producer as producer_module
from sqsworker.producer import Producer, SendError
from sqsworker.transports import QueueInfo
from sqsworker.transports import sqs as sqs_module
from sqsworker.transports.sqs import SQSTransport


class TakesThenRefuses:
    """First try of each call: SQS takes the batch, its answer is lost. The transport's
    retry is refused (the session's token expired meanwhile)."""

    def __init__(self, code: str, status: int) -> None:
        self.code, self.status = code, status
        self.taken: list[str] = []
        self.calls = 0

    def send_message_batch(self, QueueUrl: str, Entries: list[dict[str, Any]]) -> Any:
        self.calls += 1
        if self.calls == 1:
            self.taken += [e["MessageBody"] for e in Entries]
            raise ReadTimeoutError(endpoint_url="https://sqs.us-east-1.amazonaws.com/")
        raise ClientError(
            {
                "Error": {"Code": self.code, "Message": "refused"},
                "ResponseMetadata": {"HTTPStatusCode": self.status},
            },
            "SendMessageBatch",
        )

    def close(self) -> None:
        pass


@pytest.mark.parametrize(("code", "status"), [("ExpiredToken", 400), ("AccessDenied", 403)])
def test_a_send_taken_then_refused_on_retry_is_not_said_not_sent(
    monkeypatch: pytest.MonkeyPatch, code: str, status: int
) -> None:
    monkeypatch.setattr(sqs_module.time, "sleep", lambda s: None)
    monkeypatch.setattr(producer_module.time, "sleep", lambda s: None)
    client = TakesThenRefuses(code, status)
    transport = SQSTransport(client, QueueInfo(url="u", name="q", arn=""), attempts=4)
    with Producer("q", transport=transport) as producer, pytest.raises(SendError) as raised:
        producer.send("a")
    assert client.taken == ["a"], "SQS took the message on the first try"
    assert client.calls == 2
    error = raised.value
    assert error.unconfirmed == {0}, (
        f"SQS took the message (its first try's answer was lost), the retry was refused "
        f"({code}), and the message is reported not sent: unconfirmed="
        f"{set(error.unconfirmed)}, text: {error}"
    )
