"""A review of the lean client: it sends where botocore resolves, signs for the region and
service botocore signs for."""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from botocore.awsrequest import AWSResponse

from sqsworker.transports.lean import LeanSQS


class _Raw:
    def stream(self) -> Any:
        yield b'{"Messages":[]}'


@pytest.mark.parametrize(
    ("environment", "url", "region"),
    [
        ({}, "https://sqs.eu-west-3.amazonaws.com/", "eu-west-3"),
        (
            {"AWS_USE_FIPS_ENDPOINT": "true"},
            "https://sqs-fips.us-east-1.amazonaws.com/",
            "us-east-1",
        ),
        ({"AWS_USE_DUALSTACK_ENDPOINT": "true"}, "https://sqs.eu-west-3.api.aws/", "eu-west-3"),
        (
            {"AWS_ENDPOINT_URL_SQS": "https://sqs.example.internal:8443"},
            "https://sqs.example.internal:8443/",
            "eu-west-3",
        ),
    ],
    ids=["plain", "fips", "dualstack", "endpoint-env"],
)
def test_the_lean_client_learns_botocores_endpoint_and_scope(
    monkeypatch: pytest.MonkeyPatch, environment: dict[str, str], url: str, region: str
) -> None:
    """botocore resolves (FIPS, dual-stack, AWS_ENDPOINT_URL_SQS) and signs its first
    request; the lean client sends to that URL with that scope. The request's answer is
    made here, before it leaves (no network)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    session = boto3.session.Session()
    client = session.client("sqs", region_name=region)
    lean = LeanSQS(client, session.get_credentials())
    sent: list[str] = []

    def answer(request: Any, **kwargs: Any) -> AWSResponse:
        sent.append(request.url)
        return AWSResponse(request.url, 200, {}, _Raw())

    client.meta.events.register("before-send.sqs", answer)
    client.receive_message(QueueUrl="https://x/1/q")
    assert sent == [url]
    assert lean.url == url
    assert lean._signer is not None
    assert (lean._signer.region, lean._signer.service) == (region, "sqs")
