"""The queue commands where moto cannot serve them: SQS's message move task and a partly
refused send, with the API's requests and answers pinned (botocore's Stubber checks each
request against SQS's model); and the pieces with no SQS behind them."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from sqsworker.cli import main
from sqsworker.clock import SystemClock
from sqsworker.commands import messages as message_commands
from sqsworker.errors import ConfigError, StartupError, TransportError
from sqsworker.operate import Queues, Redrive, batches, parse_attribute
from sqsworker.transports import OutgoingMessage, QueueInfo
from sqsworker.transports.memory import MemorySQS, MemoryTransport
from sqsworker.transports.sqs import SQSTransport

ACCOUNT = "123456789012"
DLQ_URL = f"https://sqs.us-east-1.amazonaws.com/{ACCOUNT}/orders-dlq"
DLQ_ARN = f"arn:aws:sqs:us-east-1:{ACCOUNT}:orders-dlq"
URL = f"https://sqs.us-east-1.amazonaws.com/{ACCOUNT}/orders"
ARN = f"arn:aws:sqs:us-east-1:{ACCOUNT}:orders"
COUNTS = [
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
]


@pytest.fixture
def sqs(monkeypatch: pytest.MonkeyPatch) -> Iterator[Stubber]:
    """The commands' SQS client, every call pinned: a call not expected fails the test."""
    client = boto3.client(
        "sqs", region_name="us-east-1", aws_access_key_id="k", aws_secret_access_key="s"
    )
    stubber = Stubber(client)
    queues = Queues(SQSTransport(client, QueueInfo(url="", name="", arn="")))
    monkeypatch.setattr(Queues, "connect", classmethod(lambda cls, **kwargs: queues))
    monkeypatch.setattr(message_commands, "TASK_POLL", 0.0)
    with stubber:
        yield stubber
        stubber.assert_no_pending_responses()


class Interrupted:
    """A Ctrl-C that arrived before the command looked."""

    def __init__(self) -> None:
        self.received = threading.Event()
        self.received.set()

    def install(self) -> None:
        pass


def expect_open(sqs: Stubber, url: str, arn: str, **attributes: str) -> None:
    sqs.add_response(
        "get_queue_attributes",
        {"Attributes": {"QueueArn": arn, **attributes}},
        {"QueueUrl": url, "AttributeNames": ["All"]},
    )


def expect_redrive_start(sqs: Stubber, tasks: list[dict[str, Any]]) -> None:
    """Open the DLQ, find its one source, count it, and look for a running task."""
    expect_open(sqs, DLQ_URL, DLQ_ARN)
    sqs.add_response(
        "list_dead_letter_source_queues",
        {"queueUrls": [URL]},
        {"QueueUrl": DLQ_URL, "MaxResults": 1000},
    )
    policy = json.dumps({"deadLetterTargetArn": DLQ_ARN, "maxReceiveCount": 3})
    expect_open(sqs, URL, ARN, RedrivePolicy=policy)
    sqs.add_response(
        "get_queue_attributes",
        {"Attributes": {COUNTS[0]: "12", COUNTS[1]: "0", COUNTS[2]: "0"}},
        {"QueueUrl": DLQ_URL, "AttributeNames": COUNTS},
    )
    sqs.add_response("list_message_move_tasks", {"Results": tasks}, {"SourceArn": DLQ_ARN})


def task(status: str, moved: int, started: int = 2_000, **more: Any) -> dict[str, Any]:
    """A task as ListMessageMoveTasks shows it: SQS gives the handle of a running one only."""
    shown: dict[str, Any] = {
        "Status": status,
        "SourceArn": DLQ_ARN,
        "ApproximateNumberOfMessagesMoved": moved,
        "ApproximateNumberOfMessagesToMove": 12,
        "StartedTimestamp": started,
        **more,
    }
    if status == "RUNNING":
        shown["TaskHandle"] = "task-1"
    return shown


def test_redrive_starts_sqs_move_task_and_follows_it_to_the_end(
    sqs: Stubber, capsys: pytest.CaptureFixture[str]
) -> None:
    older = task("COMPLETED", 4, started=1_000)
    expect_redrive_start(sqs, tasks=[older])
    sqs.add_response(
        "start_message_move_task",
        {"TaskHandle": "task-1"},
        {"SourceArn": DLQ_ARN, "DestinationArn": ARN, "MaxNumberOfMessagesPerSecond": 50},
    )
    for listed in [
        [older],  # not listed yet
        [task("RUNNING", 5), older],
        [task("COMPLETED", 12), older],  # ended: no handle; the one started after the older
    ]:
        sqs.add_response("list_message_move_tasks", {"Results": listed}, {"SourceArn": DLQ_ARN})
    assert main(["redrive", DLQ_URL, "--rate", "50"]) == 0
    assert capsys.readouterr().out == "SQS moved about 12 messages from orders-dlq to orders\n"


def test_ctrl_c_cancels_sqs_move_task(
    sqs: Stubber, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(message_commands, "Signals", Interrupted)
    expect_redrive_start(sqs, tasks=[])
    sqs.add_response(
        "start_message_move_task",
        {"TaskHandle": "task-1"},
        {"SourceArn": DLQ_ARN, "DestinationArn": ARN},
    )
    sqs.add_response(
        "list_message_move_tasks", {"Results": [task("RUNNING", 3)]}, {"SourceArn": DLQ_ARN}
    )
    sqs.add_response(
        "cancel_message_move_task",
        {"ApproximateNumberOfMessagesMoved": 3},
        {"TaskHandle": "task-1"},
    )
    assert main(["redrive", DLQ_URL]) == 1
    out = capsys.readouterr().out
    assert out == "cancelled the move task after about 3 messages from orders-dlq to orders\n"


def test_a_second_redrive_while_one_runs_is_refused_and_starts_nothing(
    sqs: Stubber, capsys: pytest.CaptureFixture[str]
) -> None:
    expect_redrive_start(sqs, tasks=[task("RUNNING", 7)])
    assert main(["redrive", DLQ_URL]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sqsworker: error: a redrive of orders-dlq is already running")
    assert "7 moved so far" in err


def test_a_failed_move_task_says_why(sqs: Stubber, capsys: pytest.CaptureFixture[str]) -> None:
    expect_redrive_start(sqs, tasks=[])
    sqs.add_response(
        "start_message_move_task",
        {"TaskHandle": "task-1"},
        {"SourceArn": DLQ_ARN, "DestinationArn": ARN},
    )
    failed = task("FAILED", 2, FailureReason="AWS.SimpleQueueService.NonExistentQueue")
    sqs.add_response("list_message_move_tasks", {"Results": [failed]}, {"SourceArn": DLQ_ARN})
    assert main(["redrive", DLQ_URL]) == 1
    assert "ended FAILED after about 2 messages" in capsys.readouterr().out


def test_send_reports_each_refused_entry_by_its_place_and_exits_1(
    sqs: Stubber, capsys: pytest.CaptureFixture[str]
) -> None:
    expect_open(sqs, URL, ARN)
    sqs.add_response(
        "send_message_batch",
        {
            "Successful": [{"Id": "0", "MessageId": "m-0", "MD5OfMessageBody": "x"}],
            "Failed": [
                {"Id": "1", "SenderFault": True, "Code": "InvalidMessageContents", "Message": "no"}
            ],
        },
        {
            "QueueUrl": URL,
            "Entries": [{"Id": "0", "MessageBody": "a"}, {"Id": "1", "MessageBody": "b"}],
        },
    )
    assert main(["send", URL, "a", "b"]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "message 2 was not sent: InvalidMessageContents: no",
        "sent 1 message to orders; 1 not sent",
    ]


def test_send_says_an_entry_sqs_never_confirmed_may_not_have_been_sent(
    sqs: Stubber, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry the answers never named, after the producer's retries: SQS may have sent
    it, so "was not sent" would be a claim nobody can make (and send it again, a copy)."""
    monkeypatch.setattr("sqsworker.producer.time.sleep", lambda seconds: None)
    expect_open(sqs, URL, ARN)
    sqs.add_response(
        "send_message_batch",
        {"Successful": [{"Id": "0", "MessageId": "m-0", "MD5OfMessageBody": "x"}], "Failed": []},
        {
            "QueueUrl": URL,
            "Entries": [{"Id": "0", "MessageBody": "a"}, {"Id": "1", "MessageBody": "b"}],
        },
    )
    for _ in range(2):  # sent again: each answer names it neither sent nor failed
        sqs.add_response(
            "send_message_batch",
            {"Successful": [], "Failed": []},
            {"QueueUrl": URL, "Entries": [{"Id": "0", "MessageBody": "b"}]},
        )
    assert main(["send", URL, "a", "b"]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "message 2 may not have been sent: EntryNotAnswered: the answer named it neither "
        "successful nor failed",
        "sent 1 message to orders; 1 maybe sent",
    ]


def test_batches_hold_ten_messages_and_one_mebibyte_at_most() -> None:
    small = [OutgoingMessage("x")] * 25
    assert [len(b) for b in batches(small)] == [10, 10, 5]
    big = [OutgoingMessage("y" * 400_000)] * 5
    assert [len(b) for b in batches(big)] == [2, 2, 1]  # 3 would pass 1 MiB


def test_attributes_are_strings_or_numbers() -> None:
    assert parse_attribute("a=b=c") == ("a", {"DataType": "String", "StringValue": "b=c"})
    assert parse_attribute("n:Number=3") == ("n", {"DataType": "Number", "StringValue": "3"})
    with pytest.raises(ConfigError, match="has no '='"):
        parse_attribute("=x")


def test_aws_region_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    assert SQSTransport.connect_client().client.meta.region_name == "eu-west-1"


def test_a_queue_url_of_another_region_is_one_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    probe = SQSTransport.connect_client()
    with pytest.raises(
        StartupError, match="is in region eu-west-1, but the client is in us-east-1"
    ):
        probe.open(f"https://sqs.eu-west-1.amazonaws.com/{ACCOUNT}/orders")


class OneSource:
    """The account, as Redrive sees it: one queue whose dead-letter queue is the DLQ."""

    def __init__(self, source: MemoryTransport) -> None:
        self.source = source

    def sources_of(self, dlq: object) -> list[str]:
        return [self.source.info.url]

    def open(self, queue: str) -> MemoryTransport:
        return self.source


def test_a_fifo_message_redriven_within_its_deduplication_window_is_not_dropped() -> None:
    """SQS drops a FIFO message sent under a deduplication id it saw in the last 5 minutes,
    though it answers success: a copy under the message's own id would be dropped, and the
    delete from the DLQ would lose the message. (moto forgets an id once its message is
    deleted, so this runs on the in-memory SQS, which keeps the 5-minute window.)"""
    memory = MemorySQS(SystemClock())
    memory.create_queue_with_dlq("pay.fifo", max_receive_count=1)
    source, dlq = memory.transport("pay.fifo"), memory.transport("pay-dlq.fifo")
    source.send_batch([OutgoingMessage("pay 9", group_id="customer-4", deduplication_id="p9")])
    (first,) = source.receive(1, 0, 30)
    source.change_visibility_batch([("0", first.receipt_handle, 0)])
    assert source.receive(1, 0, 30) == []  # past maxReceiveCount: in the DLQ now
    assert dlq.counts().visible == 1

    report = Redrive(OneSource(source), dlq, None).move_here()  # type: ignore[arg-type]
    assert (report.moved, report.failed, report.in_both) == (1, 0, 0)
    (back,) = source.receive(1, 0, 30)
    assert (back.body, back.attributes["MessageGroupId"]) == ("pay 9", "customer-4")
    assert dlq.counts().total == 0


def test_a_fair_queues_message_is_redriven_with_its_tenant() -> None:
    memory = MemorySQS(SystemClock())
    memory.create_queue_with_dlq("orders")
    source, dlq = memory.transport("orders"), memory.transport("orders-dlq")
    dlq.send_batch([OutgoingMessage("order 7", group_id="tenant-1")])
    report = Redrive(OneSource(source), dlq, None).move_here()  # type: ignore[arg-type]
    assert (report.moved, report.failed) == (1, 0)
    (back,) = source.receive(1, 0, 30)
    assert back.attributes["MessageGroupId"] == "tenant-1"


def dead_letters(count: int) -> tuple[MemorySQS, MemoryTransport, MemoryTransport]:
    memory = MemorySQS(SystemClock())
    memory.create_queue_with_dlq("orders")
    source, dlq = memory.transport("orders"), memory.transport("orders-dlq")
    dlq.send_batch([OutgoingMessage(f"m{i}") for i in range(count)])
    return memory, source, dlq


def test_a_move_whose_send_fails_hands_the_batch_back_at_once() -> None:
    memory, source, dlq = dead_letters(3)
    memory.inject_fault("SendMessageBatch", TransportError("SendMessageBatch failed: AccessDenied"))
    report = Redrive(OneSource(source), dlq, None).move_here()  # type: ignore[arg-type]
    assert (report.moved, report.failed, report.status) == (0, 3, "FAILED")
    assert report.error == "SendMessageBatch failed: AccessDenied"
    assert dlq.counts().visible == 3  # visible again now, not after the move's 60 s hold
    assert source.counts().total == 0


def test_a_move_whose_delete_fails_says_the_messages_are_in_both_queues() -> None:
    memory, source, dlq = dead_letters(3)
    memory.inject_fault("DeleteMessageBatch", TransportError("DeleteMessageBatch failed: boom"))
    report = Redrive(OneSource(source), dlq, None).move_here()  # type: ignore[arg-type]
    assert (report.moved, report.in_both, report.status) == (3, 3, "FAILED")
    assert source.counts().visible == 3 and dlq.counts().in_flight == 3


def test_send_that_fails_midway_says_how_many_went(
    sqs: Stubber, capsys: pytest.CaptureFixture[str]
) -> None:
    expect_open(sqs, URL, ARN)
    bodies = [f"m{i}" for i in range(12)]
    sqs.add_response(
        "send_message_batch",
        {
            "Successful": [
                {"Id": str(i), "MessageId": f"id{i}", "MD5OfMessageBody": "x"} for i in range(10)
            ],
            "Failed": [],
        },
        {
            "QueueUrl": URL,
            "Entries": [{"Id": str(i), "MessageBody": b} for i, b in enumerate(bodies[:10])],
        },
    )
    sqs.add_client_error("send_message_batch", "AccessDenied", "not allowed", 403)
    assert main(["send", URL, *bodies]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("message 11 was not sent: AccessDenied: SendMessageBatch failed")
    assert out[1].startswith("message 12 was not sent: AccessDenied")
    assert out[2] == "sent 10 messages to orders; 2 not sent"


class BouncingBack(OneSource):
    """A destination whose consumer fails every message straight back to the DLQ."""

    def __init__(self, source: MemoryTransport, dlq: MemoryTransport) -> None:
        super().__init__(source)
        self.dlq = dlq
        real = source.send_batch

        def send_batch(messages: list[OutgoingMessage]) -> Any:
            dlq.send_batch([OutgoingMessage(m.body) for m in messages])
            return real(messages)

        source.send_batch = send_batch  # type: ignore[method-assign]


def test_a_move_here_stops_at_what_the_dlq_held_at_the_start() -> None:
    """Messages failing back into the DLQ during the move are not moved round again."""
    _, source, dlq = dead_letters(3)
    redrive = Redrive(BouncingBack(source, dlq), dlq, None)  # type: ignore[arg-type]
    report = redrive.move_here(limit=redrive.pending())
    assert (report.moved, report.status) == (3, "COMPLETED")
    assert source.counts().visible == 3 and dlq.counts().visible == 3


def test_a_move_task_sqs_refuses_points_to_the_move_here(
    sqs: Stubber, capsys: pytest.CaptureFixture[str]
) -> None:
    expect_redrive_start(sqs, tasks=[])
    sqs.add_client_error("start_message_move_task", "InvalidParameterValue", "not for this queue")
    assert main(["redrive", DLQ_URL]) == 1
    err = capsys.readouterr().err
    assert "StartMessageMoveTask failed: InvalidParameterValue: not for this queue" in err
    assert "--client-side moves the messages here instead" in err


def test_peek_names_the_source_queue_sqs_gives_of_a_dead_lettered_message(
    sqs: Stubber, capsys: pytest.CaptureFixture[str]
) -> None:
    """SQS (not moto) gives a message it moved its DeadLetterQueueSourceArn: of the two
    queues this DLQ serves, peek names that one, and its maxReceiveCount."""
    eu_url, eu_arn = f"{URL}-eu", f"{ARN}-eu"
    expect_open(sqs, DLQ_URL, DLQ_ARN)
    moved = {
        "MessageId": "m-1",
        "ReceiptHandle": "r-1",
        "Body": "{}",
        "Attributes": {"ApproximateReceiveCount": "6", "DeadLetterQueueSourceArn": eu_arn},
    }
    sqs.add_response("receive_message", {"Messages": [moved]}, None)
    sqs.add_response(
        "change_message_visibility_batch", {"Successful": [{"Id": "0"}], "Failed": []}, None
    )
    sqs.add_response(
        "list_dead_letter_source_queues",
        {"queueUrls": [URL, eu_url]},
        {"QueueUrl": DLQ_URL, "MaxResults": 1000},
    )
    for url, arn, receives in ((URL, ARN, 3), (eu_url, eu_arn, 5)):
        policy = json.dumps({"deadLetterTargetArn": DLQ_ARN, "maxReceiveCount": receives})
        expect_open(sqs, url, arn, RedrivePolicy=policy)
    assert main(["peek", DLQ_URL, "-n", "1", "--json"]) == 0
    [shown] = json.loads(capsys.readouterr().out)
    assert shown["dead_letter_reason"] == (
        "SQS moved it from orders-eu, whose maxReceiveCount is 5: received 6 times, this "
        "peek included"
    )
