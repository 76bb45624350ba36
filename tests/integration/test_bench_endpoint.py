"""The benchmarks' endless endpoint serves copies of the messages a queue was sent, so that
frameworks with envelopes of their own (bench.peers) get messages they can read."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import SSLError

from bench.endpoint import Endpoint

pytestmark = pytest.mark.integration


def _client(url: str, **options: Any) -> Any:
    return boto3.client(
        "sqs",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="bench",
        aws_secret_access_key="bench",
        **options,
    )


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    with Endpoint() as running:
        yield running
    assert running.process is not None and running.process.stdout is not None
    running.process.stdout.close()  # Endpoint leaves the pipe it read the URL from open


def test_a_queue_serves_the_messages_sent_to_it_in_turn(endpoint: Endpoint) -> None:
    client = _client(endpoint.url)
    url = client.get_queue_url(QueueName="tasks")["QueueUrl"]
    attribute = {"JobName": {"DataType": "String", "StringValue": "job"}}
    client.send_message(QueueUrl=url, MessageBody="first", MessageAttributes=attribute)
    client.send_message_batch(QueueUrl=url, Entries=[{"Id": "0", "MessageBody": "second"}])

    got = client.receive_message(
        QueueUrl=url, MaxNumberOfMessages=3, MessageAttributeNames=["All"]
    )["Messages"]
    other = client.receive_message(QueueUrl=url.replace("tasks", "other"))["Messages"]

    assert [m["Body"] for m in got] == ["first", "second", "first"]
    assert got[0]["MessageAttributes"] == attribute
    assert "MessageAttributes" not in got[1]
    assert len({m["ReceiptHandle"] for m in got}) == 3  # fresh messages, not the same one
    assert [m["Body"] for m in other] == ['{"n": 1}']  # a queue sent nothing: the default


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")
def test_over_tls_it_is_reached_only_by_a_client_that_trusts_its_certificate() -> None:
    # bench.http --tls: the consumers trust it through AWS_CA_BUNDLE, as SQS's own CA
    with Endpoint(tls=True) as running:
        assert running.url.startswith("https://")
        trusting = _client(running.url, verify=running.ca)
        url = trusting.get_queue_url(QueueName="tasks")["QueueUrl"]
        assert len(trusting.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]) == 10
        assert running.stats()["requests"]["ReceiveMessage"] == 1
        doubting = _client(running.url, verify=True)  # the usual bundle: not this certificate
        with pytest.raises(SSLError):
            doubting.receive_message(QueueUrl=url)
        assert running.process is not None and running.process.stdout is not None
        running.process.stdout.close()
