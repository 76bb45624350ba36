"""What a review of the source found at its start: a log that is another queue's, and
options the source does not know. No Spark needed (the source is built as Spark builds
it on the driver, against moto's server)."""

from __future__ import annotations

import base64
import http.client
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import boto3
import pytest

from spark_sink import SQSDataSource
from spark_sink.driver import Driver
from spark_sink.options import SourceOptions, SQSOptionError
from spark_sink.source import SCHEMA, SQSPartition, receive_or_replay, row
from spark_sink.wal import LocalLog, LogUnusable, S3Log
from sqsworker.local import LocalSQS
from sqsworker.transports import OutgoingMessage, send_all

from ..conftest import wait_until
from .conftest import make_queue, s3_bucket, slot_files


def start(queue_url: str, wal: str) -> None:
    """What Spark does on the driver when a query starts: the reader, its checks."""
    SQSDataSource({"queue": queue_url, "walPath": wal}).streamReader(SCHEMA)


@pytest.mark.parametrize("place", ["s3", "folder"])
def test_a_wal_path_that_holds_another_queues_log_is_refused(
    aws: LocalSQS, tmp_path: Path, place: str
) -> None:
    # Two pipelines given one walPath (a pasted snippet): the second would replay the
    # first one's slots as its own rows, and delete them with handles of another queue.
    orders, payments = make_queue(aws, "orders"), make_queue(aws, "payments")
    wal = f"s3://{s3_bucket()}/wal" if place == "s3" else str(tmp_path / "wal")
    send_all(orders, ["an order"])
    start(orders.info.url, wal)
    options = SourceOptions.parse({"queue": orders.info.url, "walPath": wal})
    taken = receive_or_replay(SQSPartition(1, 0, 10, options, orders.info, marker(wal)))
    assert [m.body for m in taken.messages] == ["an order"]  # orders' batch 0, uncommitted

    start(orders.info.url, wal)  # the same queue again: a restart, accepted
    with pytest.raises(SQSOptionError) as refused:
        start(payments.info.url, wal)
    sentence = str(refused.value)
    assert "\n" not in sentence and sentence.count(". ") == 0  # one sentence
    assert f"the sqs option 'walPath' ({wal}) holds the write-ahead log of queue" in sentence
    assert orders.info.url in sentence and payments.info.url in sentence

    # Started anyway (orders' slots not there yet at payments' start): its task refuses
    # orders' slot rather than return an order as a payment.
    options = SourceOptions.parse({"queue": payments.info.url, "walPath": wal})
    with pytest.raises(LogUnusable, match=re.escape(orders.info.url)):
        receive_or_replay(SQSPartition(1, 0, 10, options, payments.info, marker(wal)))


def marker(wal: str) -> str | None:
    return None if wal.startswith("s3://") else LocalLog(wal).prepare()


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("maxMessagesPerPartition", "did you mean 'maxMessagesPerBatch'"),
        ("visibilityTimout", "did you mean 'visibilityTimeout'"),
        ("checkpointLocation", ""),
    ],
)
def test_an_option_the_source_does_not_know_is_refused(name: str, hint: str) -> None:
    # Ignored, a misspelt visibilityTimeout leaves the default lease in place unsaid.
    with pytest.raises(SQSOptionError, match=re.escape(f"the sqs source has no option {name!r}")):
        SourceOptions.parse({"queue": "q", "walPath": "/w", name: "10"})
    if hint:
        with pytest.raises(SQSOptionError, match=re.escape(hint)):
            SourceOptions.parse({"queue": "q", "walPath": "/w", name.lower(): "10"})


def test_a_slot_whose_first_answer_was_lost_keeps_its_messages(
    aws: LocalSQS, monkeypatch: pytest.MonkeyPatch
) -> None:
    # S3 stored the slot, but its answer was lost (a 500, a timeout): boto3 sends the
    # PutObject again, and S3 answers PreconditionFailed, the slot being there: ours.
    queue = make_queue(aws, "orders")
    sent = sorted(send_all(queue, [f"order {n}" for n in range(5)]))
    bucket = s3_bucket()
    proxy = _LosingFirstAnswer(aws.endpoint_url)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{proxy.server_address[1]}")
        options = SourceOptions.parse(
            {"queue": queue.info.url, "walPath": f"s3://{bucket}/wal", "waitTimeSeconds": "0"}
        )
        slot = receive_or_replay(SQSPartition(1, 0, 10, options, queue.info))
    finally:
        proxy.shutdown()
        proxy.server_close()
    assert proxy.lost == ["/wal/000000000001/part-00000.json"]
    assert sorted(m.message_id for m in slot.messages) == sent
    # The batch returns them as rows and the driver keeps their leases: none handed back.
    assert queue.counts().visible == 0


class _LosingFirstAnswer(ThreadingHTTPServer):
    """Forwards every request to moto's server; the first PutObject of a slot is done,
    but its answer is a 500 (as when S3's answer is lost), so boto3 sends it again."""

    daemon_threads = True

    def __init__(self, upstream: str) -> None:
        target = urlsplit(upstream)
        lost = self.lost = list[str]()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def forward(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                body = self.rfile.read(length) if length else b""
                headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
                connection = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
                try:
                    connection.request(self.command, self.path, body, headers)
                    answer = connection.getresponse()
                    status, data, given = answer.status, answer.read(), answer.getheaders()
                finally:
                    connection.close()
                path = urlsplit(self.path).path
                if self.command == "PUT" and "/part-" in path and status == 200 and not lost:
                    lost.append(path[path.index("/wal/") :])
                    status, given = 500, [("Content-Type", "application/xml")]
                    data = b"<Error><Code>InternalError</Code><Message>lost</Message></Error>"
                self.send_response_only(status)
                for name, value in given:
                    if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = forward

        super().__init__(("127.0.0.1", 0), Handler)


def test_a_message_with_a_binary_attribute_is_logged_and_replayed_whole(
    aws: LocalSQS, tmp_path: Path
) -> None:
    # SQS gives a Binary attribute's value as bytes, which JSON has no word for.
    queue = make_queue(aws, "orders")
    attributes = {
        "signature": {"DataType": "Binary", "BinaryValue": b"\x00\xffsig"},
        "kind": {"DataType": "String", "StringValue": "order"},
    }
    send_all(queue, [OutgoingMessage("an order", message_attributes=attributes)])
    wal = str(tmp_path / "wal")
    options = SourceOptions.parse({"queue": queue.info.url, "walPath": wal})
    partition = SQSPartition(1, 0, 10, options, queue.info, LocalLog(wal).prepare())
    received = receive_or_replay(partition)
    replayed = receive_or_replay(partition)  # a task retried: the log's rows
    assert replayed == received
    assert [m.message_attributes for m in replayed.messages] == [attributes]
    assert row(replayed.messages[0], replayed.received_at)[3] == {
        "signature": base64.b64encode(b"\x00\xffsig").decode(),
        "kind": "order",
    }


def test_a_slot_a_late_attempt_wrote_after_its_batch_committed_is_not_deleted_at_restart(
    aws: LocalSQS, tmp_path: Path
) -> None:
    # Batch 0's partition had two attempts (speculation, or an executor taken for lost
    # that was not): one wrote the slot, the batch committed, its slot was removed; the
    # other, still receiving, then wrote the slot afresh with messages no batch returned.
    queue = make_queue(aws, "orders")
    send_all(queue, ["returned by batch 0"])
    wal = str(tmp_path / "wal")
    options = SourceOptions.parse(
        {"queue": queue.info.url, "walPath": wal, "waitTimeSeconds": "0", "numPartitions": "1"}
    )
    first = Driver(options, queue.info)
    partition = SQSPartition(1, 0, 10, options, queue.info, LocalLog(wal).prepare())
    first.expect([(1, 0)])
    assert [m.body for m in receive_or_replay(partition).messages] == ["returned by batch 0"]
    first.commit_through(1)
    first.settle()
    assert slot_files(tmp_path / "wal") == []

    late = sorted(send_all(queue, ["received by the late attempt"]))
    assert [m.message_id for m in receive_or_replay(partition).messages] == late
    first.close()

    # The driver restarted within the late messages' lease; Spark commits batch 0 again.
    second = Driver(options, queue.info)
    try:
        second.commit_through(1)
        second.settle()
    finally:
        second.close()
    # No batch returned them: they must come again, not be deleted.
    assert queue.counts().total == 1
    wait_until(lambda: queue.counts().visible == 1, what="the late attempt's message back")
    assert sorted(m.message_id for m in queue.receive(10, 0, 30)) == late
    assert slot_files(tmp_path / "wal") == []


def test_an_s3_wal_path_without_credentials_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # as a new process has it
    with pytest.raises(LogUnusable) as refused:
        S3Log("orders-bucket", "wal").prepare()
    assert str(refused.value) == (
        "the sqs option 'walPath' (s3://orders-bucket/wal) cannot be used: no AWS "
        "credentials were found (the driver and every executor need them: environment, "
        "profile, instance or pod role)"
    )
