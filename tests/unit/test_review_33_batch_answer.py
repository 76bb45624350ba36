"""Review 33: a batch answer that names one id twice, once with a MessageId and once
without (``batch_result``, commit 887798a): "an id named twice counts once"."""

from __future__ import annotations

from typing import Any

import pytest

from sqsworker.producer import Producer
from sqsworker.transports import QueueInfo
from sqsworker.transports import sqs as sqs_module
from sqsworker.transports.answers import batch_result
from sqsworker.transports.sqs import SQSTransport

# A 200 whose Successful names entry 0 twice: once as SQS would, once without its MessageId.
TWICE = {"Successful": [{"Id": "0", "MessageId": "m-1", "MD5OfMessageBody": "x"}, {"Id": "0"}]}


def test_an_id_named_twice_is_never_both_succeeded_and_failed() -> None:
    result = batch_result("SendMessageBatch", TWICE, ["0"], sends=True)
    failed = [f.id for f in result.failed]
    assert not set(result.succeeded) & set(failed), (
        f"entry 0 is counted both sent ({result.succeeded}, MessageId "
        f"{result.message_ids}) and not answered ({failed})"
    )


class Client:
    """send_message_batch answered TWICE the first time, as SQS the next times."""

    def __init__(self) -> None:
        self.sent: list[str] = []  # bodies, one per copy SQS took

    def send_message_batch(self, QueueUrl: str, Entries: list[dict[str, Any]]) -> Any:
        self.sent += [e["MessageBody"] for e in Entries]
        if len(self.sent) == 1:
            return TWICE
        return {"Successful": [{"Id": e["Id"], "MessageId": "m-2"} for e in Entries]}


def test_a_send_sqs_confirmed_is_not_sent_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqs_module.time, "sleep", lambda s: None)
    client = Client()
    transport = SQSTransport(client, QueueInfo(url="u", name="q", arn=""), attempts=1)
    progress: list[int] = []
    with Producer("q", transport=transport) as producer:
        report = producer.send_many(["a"], progress=progress.append)
    # one message: "called with how many each batch sent" cannot add up to two
    assert sum(progress) == 1, f"progress {progress} for one message, sent as {client.sent}"
    # and the second naming is "not read" (the docstring): SQS's m-1 stands, no copy is sent
    assert client.sent == ["a"] and report.message_ids == ["m-1"], (client.sent, report)
