"""What a review of the source found at its start: a log that is another queue's, and
options the source does not know. No Spark needed (the source is built as Spark builds
it on the driver, against moto's server)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from spark_sink import SQSDataSource
from spark_sink.options import SourceOptions, SQSOptionError
from spark_sink.source import SCHEMA, SQSPartition, receive_or_replay
from spark_sink.wal import LocalLog, LogUnusable
from sqsworker.local import LocalSQS
from sqsworker.transports import send_all

from .conftest import make_queue, s3_bucket


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
