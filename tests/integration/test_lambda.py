"""A Lambda SQS handler written with Powertools, run unchanged by `sqsworker run --lambda`
on moto's SQS server; the event's checksums are the ones SQS itself computes."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import boto3
import pytest

from sqsworker.lambdas import _md5_of_attributes, record
from sqsworker.local import LocalSQS
from sqsworker.message import Message
from sqsworker.transports import Envelope, send_all
from sqsworker.transports.sqs import SQSTransport

from ..conftest import unique
from ..snippets import snippet
from .scenario import ROOT

pytestmark = pytest.mark.integration


def test_the_powertools_handler_runs_unchanged_and_its_failures_reach_the_dlq(
    local_env: LocalSQS, tmp_path: Path
) -> None:
    queue = unique("orders")
    local_env.create_queue(queue, max_receive_count=3, visibility_timeout=10)
    transport = SQSTransport.connect(queue, endpoint_url=local_env.endpoint_url)
    orders = [json.dumps({"id": n, "amount": -5 if n in (3, 7) else 20}) for n in range(10)]
    send_all(transport, orders)
    ledger = tmp_path / "ledger.txt"
    # docs/lambda.md's line, on this test's queue, with quick polls and backoff
    (line,) = snippet("docs/lambda.md", "--lambda --queue orders").text.splitlines()
    documented = shlex.split(line.replace("--queue orders", f"--queue {queue}"))
    assert documented[:3] == ["ORDERS_LEDGER=orders.txt", "sqsworker", "run"]
    documented = documented[1:]  # the ledger goes in the test's folder instead
    command = [
        sys.executable,
        "-m",
        "sqsworker.cli",
        *documented[1:],
        "--burst",
        "--wait-time",
        "1",
        "--backoff-base",
        "0.2",
        "--backoff-max",
        "0.5",
        "--metrics-port",
        "off",
    ]
    env = {**os.environ, **local_env.env(), "ORDERS_LEDGER": str(ledger), "PYTHONPATH": str(ROOT)}
    ran = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr

    stored = [line.split() for line in ledger.read_text().splitlines()]
    assert sorted(int(order) for order, _, _ in stored) == [0, 1, 2, 4, 5, 6, 8, 9]  # once each
    lines = [json.loads(line) for line in ran.stdout.splitlines() if line.startswith("{")]
    injected = [line for line in lines if line.get("message") == "order stored"]
    assert injected and all(line["function_memory_size"] == 128 for line in injected)
    assert all(line["function_arn"].startswith("arn:aws:lambda:") for line in injected)
    counts = transport.counts()
    assert counts.total == 0
    dlq = transport.open(f"{queue}-dlq")
    dead = []
    while batch := dlq.receive(10, 1, 30):
        dead += batch
    assert sorted(json.loads(m.body)["id"] for m in dead) == [3, 7]
    # Every allowed attempt, then moved (moto counts the receive that moved it, too).
    assert all(m.receive_count >= 3 for m in dead)
    transport.close()


IDEMPOTENT_APP = """
import os

from aws_lambda_powertools.utilities.batch import (
    BatchProcessor,
    EventType,
    process_partial_response,
)
from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent_function,
)

processor = BatchProcessor(event_type=EventType.SQS)
persistence = DynamoDBPersistenceLayer(table_name=os.environ["IDEMPOTENCY_TABLE"])
config = IdempotencyConfig(event_key_jmespath="order")


@idempotent_function(data_keyword_argument="order", config=config, persistence_store=persistence)
def charge(order: dict) -> str:
    with open(os.environ["ORDERS_LEDGER"], "a") as ledger:
        ledger.write(f"charged {order['order']}\\n")
    return "charged"


def record_handler(record):
    charge(order=record.json_body)


def lambda_handler(event, context):
    config.register_lambda_context(context)
    return process_partial_response(
        event=event, record_handler=record_handler, processor=processor, context=context
    )
"""


def test_powertools_idempotency_runs_unchanged_against_dynamodb(
    local_env: LocalSQS, tmp_path: Path
) -> None:
    """Powertools' idempotency utility, its DynamoDB table on the same server: an order
    sent three times is charged once."""
    queue, table = unique("payments"), unique("idempotency")
    local_env.create_queue(queue, max_receive_count=3, visibility_timeout=10)
    dynamodb = boto3.client(
        "dynamodb", endpoint_url=local_env.endpoint_url, region_name="us-east-1"
    )
    dynamodb.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    transport = SQSTransport.connect(queue, endpoint_url=local_env.endpoint_url)
    send_all(transport, [json.dumps({"order": n}) for n in (1, 2, 1, 3, 1)])
    (tmp_path / "payapp.py").write_text(IDEMPOTENT_APP)
    ledger = tmp_path / "ledger.txt"
    env = {
        **os.environ,
        **local_env.env(),
        "ORDERS_LEDGER": str(ledger),
        "IDEMPOTENCY_TABLE": table,
        "AWS_LAMBDA_FUNCTION_NAME": "payments",
    }
    command = [sys.executable, "-m", "sqsworker.cli", "run", "payapp:lambda_handler", "--lambda"]
    command += ["--queue", queue, "--burst", "--wait-time", "1", "--metrics-port", "off"]
    ran = subprocess.run(
        command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 0, ran.stderr
    assert sorted(ledger.read_text().splitlines()) == ["charged 1", "charged 2", "charged 3"]
    assert transport.counts().total == 0
    transport.close()


def test_the_events_checksums_are_the_ones_sqs_computes(local_env: LocalSQS) -> None:
    queue = unique("checksums")
    url = local_env.create_queue(queue, max_receive_count=None)
    sqs = local_env.client()
    sqs.send_message(
        QueueUrl=url,
        MessageBody='{"order": 7, "note": "é"}',
        MessageAttributes={
            "tenant": {"DataType": "String", "StringValue": "acme"},
            "weight": {"DataType": "Number", "StringValue": "12.5"},
            "blob": {"DataType": "Binary", "BinaryValue": b"\x00\xff"},
            "kind": {"DataType": "String.custom", "StringValue": "x"},
        },
    )
    (raw,) = sqs.receive_message(
        QueueUrl=url, MessageAttributeNames=["All"], AttributeNames=["All"]
    )["Messages"]
    envelope = Envelope(
        raw["MessageId"], raw["ReceiptHandle"], raw["Body"], raw["Attributes"],
        raw["MessageAttributes"],
    )  # fmt: skip
    event_record = record(Message(envelope, queue), f"arn:aws:sqs:us-east-1:123456789012:{queue}")
    assert event_record["md5OfBody"] == raw["MD5OfBody"]
    assert event_record["md5OfMessageAttributes"] == raw["MD5OfMessageAttributes"]
    assert _md5_of_attributes(raw["MessageAttributes"]) == raw["MD5OfMessageAttributes"]
