"""Bodies over SQS's size limit, through S3 on moto's server: `sqsworker send` and AWS's
own Python extended client (amazon-sqs-extended-client) write them, `sqsworker run` and
that client read them, in the one wire format."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest

from sqsworker.cli import main
from sqsworker.local import LocalSQS
from sqsworker.payloads import SIZE_ATTRIBUTE
from sqsworker.transports.sqs import SQSTransport

from ..conftest import unique
from .scenario import ROOT, command

pytestmark = pytest.mark.integration

# AWS's client, in a process of its own: importing it replaces boto3's Session for the
# whole process. argv: send QUEUE_URL BUCKET BODY_FILE | receive QUEUE_URL
EXTENDED_CLIENT = """
import hashlib, sys
import boto3, sqs_extended_client  # noqa: F401  (patches boto3's Session)
sqs = boto3.session.Session().client("sqs")
action, url = sys.argv[1], sys.argv[2]
if action == "send":
    sqs.large_payload_support = sys.argv[3]
    sqs.send_message(QueueUrl=url, MessageBody=open(sys.argv[4]).read())
else:
    got = sqs.receive_message(
        QueueUrl=url, MaxNumberOfMessages=1, WaitTimeSeconds=5, MessageAttributeNames=["All"]
    )["Messages"][0]
    print(hashlib.sha256(got["Body"].encode()).hexdigest(), len(got["Body"].encode()))
"""


def extended_client(env: dict[str, str], *argv: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", EXTENDED_CLIENT, *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def make_bucket(name: str) -> None:
    s3 = boto3.client("s3")
    try:
        s3.create_bucket(Bucket=name)
    finally:
        s3.close()


def digest(text: str) -> str:
    data = text.encode()
    return f"{hashlib.sha256(data).hexdigest()} {len(data)}"


def test_large_bodies_pass_both_ways_between_sqsworker_and_the_extended_client(
    local_sqs: LocalSQS, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {**os.environ, **local_sqs.env()}
    for key, value in local_sqs.env().items():
        monkeypatch.setenv(key, value)
    bucket = unique("bodies")
    make_bucket(bucket)
    queue = unique("videos")
    url = local_sqs.create_queue(queue)
    ours = json.dumps({"frames": "a" * 1_500_000})  # over the queue's 1 MiB
    theirs = json.dumps({"frames": "b" * 400_000})  # over the extended client's 256 KiB
    (tmp_path / "theirs.json").write_text(theirs)

    # In: the extended client sends one, `sqsworker send` the other.
    extended_client(env, "send", url, bucket, str(tmp_path / "theirs.json"))
    assert main(["send", queue, ours, "--payload-bucket", bucket]) == 0
    ledger = tmp_path / "ledger"
    worker = subprocess.run(
        command(
            queue, "--burst", "--metrics-port", "off", "--payload-bucket", bucket, handler="measure"
        ),
        env={**env, "LEDGER": str(ledger)},
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert worker.returncode == 0, worker.stderr
    assert sorted(ledger.read_text().splitlines()) == sorted([digest(ours), digest(theirs)])

    # Out: what `sqsworker send` offloaded, the extended client reads whole.
    assert main(["send", queue, ours, "--payload-bucket", bucket]) == 0
    assert extended_client(env, "receive", url) == digest(ours)


def test_send_offloads_only_over_the_threshold_and_refuses_what_cannot_go(
    local_sqs: LocalSQS, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for key, value in local_sqs.env().items():
        monkeypatch.setenv(key, value)
    bucket = unique("bodies")
    make_bucket(bucket)
    queue = unique("videos")
    local_sqs.create_queue(queue)
    args = ["send", queue, "x" * 100, "y" * 5000, "--payload-bucket", bucket]
    assert main([*args, "--payload-threshold", "1000"]) == 0
    assert "put 1 of 2 bodies in s3://" in capsys.readouterr().out
    transport = SQSTransport.connect(queue)
    got = {m.body[:1]: m for m in transport.receive(10, 1, 30)}
    assert got["x"].message_attributes == {}
    assert SIZE_ATTRIBUTE in got["["].message_attributes  # the pointer, a JSON array
    transport.close()

    too_big = "z" * 1_100_000
    assert main(["send", queue, too_big]) == 2
    assert "put bodies this large in S3 with --payload-bucket" in capsys.readouterr().err
    assert main(["send", queue, "x", "--payload-threshold", "10"]) == 2
    assert "--payload-threshold needs --payload-bucket" in capsys.readouterr().err
    assert main(["send", queue, "x", "--payload-bucket", "Not_A_Bucket"]) == 2
    assert "is not an S3 bucket name" in capsys.readouterr().err
    assert main(["send", queue, too_big, "--payload-bucket", unique("missing")]) == 1
    assert "could not put a message's body" in capsys.readouterr().err
