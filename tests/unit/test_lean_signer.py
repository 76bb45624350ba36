"""The lean client's SigV4 signature is botocore's, byte for byte."""

from __future__ import annotations

import datetime

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from sqsworker.transports.lean import Signer, _host


@pytest.mark.parametrize("token", [None, "FwoGZXIvYXdzEJr//////////token+/="])
@pytest.mark.parametrize(
    ("url", "region"),
    [
        ("https://sqs.us-east-1.amazonaws.com/", "us-east-1"),
        ("https://sqs-fips.us-gov-west-1.amazonaws.com/", "us-gov-west-1"),
        ("http://127.0.0.1:4566/", "eu-west-3"),
    ],
)
# a receive; a delete batch of ten real receipt handles (hashed in pieces that keep the
# GIL); a send batch past HASHED_WHOLE (hashed whole)
@pytest.mark.parametrize("padding", [0, 2_300, 40_000], ids=["receive", "delete", "send"])
def test_the_signature_is_botocores(url: str, region: str, token: str | None, padding: int) -> None:
    body = b'{"QueueUrl": "https://sqs.us-east-1.amazonaws.com/1/q", "MaxNumberOfMessages": 10'
    body += b', "Pad": "' + b"h" * padding + b'"}'
    target = "AmazonSQS.ReceiveMessage"
    credentials = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token)
    request = AWSRequest(
        "POST",
        url,
        data=body,
        headers={"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": target},
    )
    SigV4Auth(credentials, "sqs", region).add_auth(request)
    when = datetime.datetime.strptime(request.context["timestamp"], "%Y%m%dT%H%M%SZ")
    now = when.replace(tzinfo=datetime.UTC).timestamp() + 0.75  # within that second
    scheme, netloc = url.split("://")[0], url.split("://")[1].rstrip("/")
    signer = Signer(_host(scheme, netloc), region, "sqs")
    for _ in range(2):  # the second from the cached key
        ours = signer.headers(target, body, "AKIDEXAMPLE", credentials.secret_key, token, now)
        assert ours["Authorization"] == request.headers["Authorization"]
        assert ours["X-Amz-Date"] == request.headers["X-Amz-Date"]
        assert ours.get("X-Amz-Security-Token") == request.headers.get("X-Amz-Security-Token")


def test_a_new_day_or_a_new_secret_signs_with_a_new_key() -> None:
    signer = Signer("sqs.us-east-1.amazonaws.com", "us-east-1", "sqs")
    day = datetime.datetime(2026, 11, 27, 23, 59, 59, tzinfo=datetime.UTC).timestamp()
    first = signer.headers("AmazonSQS.X", b"{}", "AK", "one", None, day)["Authorization"]
    again = signer.headers("AmazonSQS.X", b"{}", "AK", "one", None, day)["Authorization"]
    rotated = signer.headers("AmazonSQS.X", b"{}", "AK", "two", None, day)["Authorization"]
    assert first == again != rotated
    assert (
        "20261128/us-east-1/sqs"
        in signer.headers("AmazonSQS.X", b"{}", "AK", "one", None, day + 1)["Authorization"]
    )
