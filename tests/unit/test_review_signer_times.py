"""Review of af87f28: the SigV4 time is formatted once a second from epoch seconds. The
X-Amz-Date must be the second ``now`` falls in, as the datetime it replaced wrote it."""

from __future__ import annotations

import datetime

import pytest

from sqsworker.transports.lean import Signer


@pytest.mark.parametrize("now", [-1.0, -1.25, -0.5, -3600.75])
def test_a_time_before_the_epoch_is_stamped_with_its_own_second(now: float) -> None:
    """int() rounds toward zero (-0.5 -> the second after), and -1 is the cache's
    "nothing yet" sentinel: the first request at -1.x is signed with an empty date."""
    signer = Signer("sqs.us-east-1.amazonaws.com", "us-east-1", "sqs")
    headers = signer.headers("AmazonSQS.ReceiveMessage", b"{}", "AK", "secret", None, now)
    expected = datetime.datetime.fromtimestamp(now, datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    assert headers["X-Amz-Date"] == expected
    assert f"/{expected[:8]}/us-east-1/sqs/aws4_request" in headers["Authorization"]
