"""What the producer says of a send that failed: "not sent" only when SQS certainly took
nothing (it refused or throttled every try, or no connection was made), else "maybe
sent" (``SendError.unconfirmed``): a try's answer was lost after SQS may have taken the
batch. Sent again on the word "not sent", such a message is a copy; told "maybe sent" of
one SQS never took, a user may not send it again, and it is lost."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError

from sqsworker import producer as producer_module
from sqsworker.producer import ATTEMPTS, Producer, SendError
from sqsworker.transports import QueueInfo
from sqsworker.transports import sqs as sqs_module
from sqsworker.transports.sqs import SQSTransport

URL = "https://sqs.us-east-1.amazonaws.com/"


def answered(code: str, status: int) -> Callable[[], Exception]:
    return lambda: ClientError(
        {"Error": {"Code": code, "Message": "no"}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "SendMessageBatch",
    )


def timed_out() -> Exception:  # after SQS took the batch: its answer lost
    return ReadTimeoutError(endpoint_url=URL)


def no_connection() -> Exception:  # before anything left
    return EndpointConnectionError(endpoint_url=URL)


class Scripted:
    """botocore's SQS client whose SendMessageBatch tries fail in turn as ``script`` says
    (the last failure again once the script ends); SQS takes the batch on a timeout."""

    def __init__(self, script: list[Callable[[], Exception]]) -> None:
        self.script = script
        self.taken: list[str] = []
        self.calls = 0

    def send_message_batch(self, QueueUrl: str, Entries: list[dict[str, Any]]) -> Any:
        fault = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        if fault is timed_out:
            self.taken += [e["MessageBody"] for e in Entries]
        raise fault()

    def close(self) -> None:
        pass


@pytest.mark.parametrize(
    ("script", "tries", "maybe_sent", "calls"),
    [
        ([timed_out], 1, True, ATTEMPTS),
        ([answered("ThrottlingException", 400)], 1, False, ATTEMPTS),
        ([answered("RequestThrottled", 400)], 1, False, ATTEMPTS),
        ([no_connection], 1, False, ATTEMPTS),
        ([answered("InternalError", 500)], 1, True, ATTEMPTS),  # a 5xx may have acted
        # the call's last try says nothing of its first
        ([timed_out, no_connection], 2, True, 2 * ATTEMPTS),
        ([timed_out, answered("ExpiredToken", 400)], 4, True, 2),  # refused on the retry
        ([timed_out, answered("AccessDenied", 403)], 4, True, 2),
        ([answered("AccessDenied", 403)], 4, False, 1),
    ],
    ids=[
        "timeout",
        "throttled",
        "request-throttled",
        "no-connection",
        "5xx",
        "timeout-then-no-connection",
        "timeout-then-expired-token",
        "timeout-then-access-denied",
        "access-denied",
    ],
)
def test_a_send_is_maybe_sent_only_if_a_try_of_it_may_have_reached_sqs(
    monkeypatch: pytest.MonkeyPatch,
    script: list[Callable[[], Exception]],
    tries: int,
    maybe_sent: bool,
    calls: int,
) -> None:
    monkeypatch.setattr(sqs_module.time, "sleep", lambda s: None)
    monkeypatch.setattr(producer_module.time, "sleep", lambda s: None)
    client = Scripted(script)
    transport = SQSTransport(client, QueueInfo(url="u", name="q", arn=""), attempts=tries)
    with Producer("q", transport=transport) as producer, pytest.raises(SendError) as raised:
        producer.send("a")
    error = raised.value
    assert error.message_ids == [None]
    assert error.unconfirmed == ({0} if maybe_sent else set()), (str(error), client.taken)
    said = "were not sent, or not confirmed sent, to" if maybe_sent else "were not sent to"
    assert said in str(error)
    assert client.calls == calls
    assert bool(client.taken) <= maybe_sent  # what SQS took is never said "not sent"
