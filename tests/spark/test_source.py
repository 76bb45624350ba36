"""``format("sqs")`` in a real local SparkSession against moto's server."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from structlog.testing import capture_logs

from spark_sink import driver as driver_module
from spark_sink import source
from spark_sink.driver import LEASE_SENDERS, Driver
from spark_sink.options import SourceOptions
from spark_sink.wal import LocalLog, Slot
from sqsworker.local import LocalSQS
from sqsworker.transports import Transport, send_all
from sqsworker.transports.sqs import SQSTransport

from ..conftest import wait_until
from ..faults.proxy import FaultProxy, _answer
from ..integration.conftest import local
from .conftest import make_queue, s3_bucket, s3_keys, slot_files
from .output import read_output, write_once

pytestmark = pytest.mark.spark


def run(
    spark: SparkSession,
    queue: Transport,
    tmp_path: Path,
    sink: Callable[[DataFrame, int], None],
    wal: str | None = None,
    **options: str,
) -> None:
    """One AvailableNow run of the query (its log in ``wal``, else a folder of
    ``tmp_path``); raises what the query raised."""
    stream = (
        spark.readStream.format("sqs")
        .option("queue", queue.info.url)
        .option("walPath", wal or str(tmp_path / "wal"))
        .option("waitTimeSeconds", "0")
        .options(**options)
        .load()
    )
    query = (
        stream.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(180)
    finally:
        query.stop()


def output_ids(spark: SparkSession, path: Path) -> list[str]:
    output = read_output(spark, str(path))
    return [] if output is None else [r.message_id for r in output.select("message_id").collect()]


@pytest.mark.parametrize("place", ["local", "s3"])
def test_every_message_is_written_once_and_deleted(
    spark: SparkSession, aws: LocalSQS, tmp_path: Path, place: str
) -> None:
    queue = make_queue(aws, "orders")
    bucket = s3_bucket() if place == "s3" else None
    wal = f"s3://{bucket}/orders/wal" if bucket else None
    # Three batches; 1,000 messages took close to the 120 s test limit on moto's server.
    sent = send_all(queue, [f'{{"order": {i}}}' for i in range(500)])
    out = write_once(str(tmp_path / "out"))
    run(spark, queue, tmp_path, out, wal=wal, maxMessagesPerBatch="200")
    ids = output_ids(spark, tmp_path / "out")
    assert len(ids) == 500 and set(ids) == set(sent)
    assert queue.counts().total == 0  # every message deleted once its batch committed
    # and the log of each batch cleaned up
    assert (s3_keys(bucket) if bucket else slot_files(tmp_path / "wal")) == []


@pytest.mark.parametrize("place", ["local", "s3"])
def test_a_failed_query_restarted_from_its_checkpoint_loses_and_repeats_nothing(
    spark: SparkSession, aws: LocalSQS, tmp_path: Path, place: str
) -> None:
    queue = make_queue(aws, "orders")
    wal = f"s3://{s3_bucket()}/orders/wal" if place == "s3" else None
    sent = send_all(queue, [f'{{"order": {i}}}' for i in range(120)])
    write = write_once(str(tmp_path / "out"))
    failures = {1: "after", 2: "before"}  # batch id -> fail after or before writing it

    def flaky(batch: DataFrame, batch_id: int) -> None:
        when = failures.pop(batch_id, None)
        if when == "before":
            raise RuntimeError(f"batch {batch_id} fails before it is written")
        write(batch, batch_id)
        if when == "after":
            raise RuntimeError(f"batch {batch_id} fails after it was written")

    options = {"maxMessagesPerBatch": "30", "visibilityTimeout": "3"}
    for _ in range(2):  # each run stops at its failure; the restart replays that batch
        with pytest.raises(StreamingQueryException, match="fails"):
            run(spark, queue, tmp_path, flaky, wal=wal, **options)
    run(spark, queue, tmp_path, flaky, wal=wal, **options)
    ids = output_ids(spark, tmp_path / "out")
    assert sorted(ids) == sorted(sent)  # each once: nothing lost, nothing twice
    assert queue.counts().total == 0


def test_at_real_latency_leases_hold_from_the_first_receive_until_the_commit(
    spark: SparkSession, aws: LocalSQS, tmp_path: Path
) -> None:
    """20 ms a request, a 2 s visibility timeout, 6 s batches, one partition taking
    hundreds of messages a batch.

    A partition receives for up to 2/3 s, so the first leases are a third through
    before the log has them; the driver must date them from the first receive, adopt
    them at once and renew a few hundred together, again every second while the
    batch runs.
    """
    # The SQS server in a process of its own (`sqsworker local`), as SQS is: moto in
    # this process would share its interpreter with the test's own polling and Spark's
    # callbacks, and answer renewals late on a busy machine.
    # The other consumer receives what the query has not read yet ten times a second:
    # with the default maxReceiveCount (3) SQS would move those to the dead-letter queue.
    server = local("--max-receive-count", "1000", "--queue", "orders")
    exports = server.__enter__()
    queue = SQSTransport.connect("orders", endpoint_url=exports["AWS_ENDPOINT_URL_SQS"])
    # Hundreds in one partition: 60 renewal calls a second at a 2 s timeout.
    sent = send_all(queue, [f'{{"order": {i}}}' for i in range(600)])
    other = queue.open(queue.info.url)  # straight to the server: it polls without latency
    read: set[str] = set()  # the ids of every batch the query has read so far
    stolen: list[str] = []  # of them, those the other consumer received
    write = write_once(str(tmp_path / "out"))

    sizes: list[int] = []

    def slow(batch: DataFrame, batch_id: int) -> None:
        ids = [r.message_id for r in batch.select("message_id").collect()]
        sizes.append(len(ids))
        read.update(ids)
        tick = threading.Event()
        for _ in range(60):  # 6 s: three times the visibility timeout
            tick.wait(0.1)
            got = other.receive(10, 0, 30)
            stolen.extend(m.message_id for m in got if m.message_id in read)
            if got:  # what the query has not received yet goes back for it to receive
                other.change_visibility_batch(
                    [(str(i), m.receipt_handle, 0) for i, m in enumerate(got)]
                )
        write(batch, batch_id)

    proxy = FaultProxy(exports["AWS_ENDPOINT_URL_SQS"]).start()
    proxy.set(latency=0.02)
    try:
        run(
            spark,
            queue,
            tmp_path,
            slow,
            endpointUrl=proxy.url,
            numPartitions="1",
            visibilityTimeout="2",
        )
        # Hundreds of leases a partition, renewed together: what its 2/3 s of receives
        # bring at 20 ms a request (500 to 600 on a quiet machine, 330 with the suite beside).
        assert max(sizes) >= 250
        assert stolen == []  # another consumer saw none of them while their batch ran
        assert sorted(output_ids(spark, tmp_path / "out")) == sorted(sent)
        assert queue.counts().total == 0
    finally:
        proxy.stop()
        queue.close()
        server.__exit__(None, None, None)


def test_a_commit_keeps_the_log_until_sqs_answered_its_deletes(
    aws: LocalSQS, tmp_path: Path
) -> None:
    # As a restarted driver finds it: Spark committed batch 0 (seq 1), the log still
    # holds its slot. Its deletes are held up on the way: the log stays until answered.
    queue = make_queue(aws, "orders")
    send_all(queue, [f'{{"order": {i}}}' for i in range(10)])
    LocalLog(str(tmp_path / "wal")).write(Slot(1, 0, time.time(), tuple(queue.receive(10, 0, 30))))
    proxy = FaultProxy(aws.endpoint_url).start()
    options = SourceOptions.parse(
        {"queue": queue.info.url, "walPath": str(tmp_path / "wal"), "endpointUrl": proxy.url}
    )
    driver = Driver(options, queue.info)
    try:
        proxy.set(stall=1.0, stall_seconds=1.5)
        committing = threading.Thread(target=driver.commit_through, args=(1,))
        committing.start()
        wait_until(lambda: proxy.injected["stall"] > 0, what="a delete under way")
        assert slot_files(tmp_path / "wal") == ["000000000001/part-00000.json"]
        committing.join()
    finally:
        driver.close()
        proxy.stop()
    # Handed back, not deleted: the slot may be a late attempt's (test_review_wal.py).
    assert queue.counts().visible == 10
    assert slot_files(tmp_path / "wal") == []


def short_leases(queue: Transport, tmp_path: Path, endpoint: str, seconds: int) -> SourceOptions:
    """A driver's options with ``seconds`` of visibility timeout, through ``endpoint``."""
    return SourceOptions.parse(
        {
            "queue": queue.info.url,
            "walPath": str(tmp_path / "wal"),
            "endpointUrl": endpoint,
            "visibilityTimeout": str(seconds),
            "waitTimeSeconds": "0",
        }
    )


def test_the_driver_renews_with_a_connection_for_each_sender(aws: LocalSQS, tmp_path: Path) -> None:
    # A pool smaller than the senders closes a connection after each call beyond it and
    # opens another the next round: a TLS handshake each, and on a loaded endpoint a
    # refused connection's second try a second later, past a short lease's end.
    queue = make_queue(aws, "orders")
    send_all(queue, [f'{{"order": {i}}}' for i in range(10 * LEASE_SENDERS)])
    held = tuple(m for _ in range(LEASE_SENDERS) for m in queue.receive(10, 0, 30))
    LocalLog(str(tmp_path / "wal")).write(Slot(1, 0, time.time(), held))
    proxy = FaultProxy(aws.endpoint_url).start()
    proxy.set(latency=0.02)  # the renewals of a round overlap
    renewals: list[str] = []
    proxy.watch = lambda target, *_: renewals.append(target)
    options = short_leases(queue, tmp_path, proxy.url, 2)
    driver = Driver(options, queue.info)
    try:
        wait_until(lambda: len(renewals) >= 4 * LEASE_SENDERS, what="four rounds")
    finally:
        driver.close()
        proxy.stop()
    assert len(held) == 10 * LEASE_SENDERS
    assert proxy.connections <= LEASE_SENDERS + 2


class CountingReceives(FaultProxy):
    """moto's server behind latency; counts the ReceiveMessage calls under way at once."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.under_way = 0
        self.most = 0
        self._counting = threading.Lock()

    def _handle(self, request: Any) -> None:
        receive = request.headers.get("X-Amz-Target", "").endswith(".ReceiveMessage")
        if receive:
            with self._counting:
                self.under_way += 1
                self.most = max(self.most, self.under_way)
        try:
            super()._handle(request)
        finally:
            if receive:
                with self._counting:
                    self.under_way -= 1


def test_a_partition_keeps_several_receives_in_flight_within_its_budget(aws: LocalSQS) -> None:
    queue = make_queue(aws, "orders")
    sent = send_all(queue, [f'{{"order": {i}}}' for i in range(300)])
    proxy = CountingReceives(aws.endpoint_url).start()
    proxy.set(latency=0.02)
    options = SourceOptions.parse(
        {"queue": queue.info.url, "walPath": "/unused", "waitTimeSeconds": "0"}
    )
    transport = SQSTransport.reopen(queue.info, endpoint_url=proxy.url)
    try:
        received_at, received = source._receive(transport, options, 205)
    finally:
        transport.close()
        proxy.stop()
    assert received_at is not None and received_at == min(began for began, _ in received)
    ids = [e.message_id for _, e in received]
    assert len(ids) == 205 and len(set(ids)) == 205 and set(ids) <= set(sent)  # the budget
    assert 1 < proxy.most <= options.receives_in_flight  # not one round trip at a time
    assert queue.counts().visible == 95  # none received beyond it


def test_a_partition_that_received_nothing_is_committed_with_the_others(
    aws: LocalSQS, tmp_path: Path
) -> None:
    # A partition's slot with no message beside one with messages: the driver keeps
    # the one's leases, commits both, and says nothing went wrong.
    queue = make_queue(aws, "orders")
    send_all(queue, [f'{{"order": {i}}}' for i in range(10)])
    wal = LocalLog(str(tmp_path / "wal"))
    wal.write(Slot(1, 0, time.time(), ()))
    wal.write(Slot(1, 1, time.time(), tuple(queue.receive(10, 0, 30))))
    options = SourceOptions.parse({"queue": queue.info.url, "walPath": str(tmp_path / "wal")})
    with capture_logs() as logs:
        driver = Driver(options, queue.info)
        try:
            driver.expect([(1, 0), (1, 1)])
            driver.commit_through(1)
            driver.settle()
        finally:
            driver.close()
    assert [line["event"] for line in logs if line["log_level"] == "error"] == []
    assert queue.counts().total == 0
    assert slot_files(tmp_path / "wal") == []


def test_the_driver_stops_looking_often_for_a_file_never_written(
    aws: LocalSQS, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A task that dies before writing its slot, a query that fails: the watcher looks
    # for it often only for a while, then every WATCH_EVERY.
    monkeypatch.setattr(driver_module, "DUE_FOR", 0.0)  # the while: twice the visibility timeout
    queue = make_queue(aws, "orders")
    options = SourceOptions.parse(
        {
            "queue": queue.info.url,
            "walPath": str(tmp_path / "wal"),
            "visibilityTimeout": "1",
            "waitTimeSeconds": "0",
        }
    )
    driver = Driver(options, queue.info)
    try:
        driver.expect([(1, 0)])
        assert driver.looking_often()
        wait_until(lambda: not driver.looking_often(), what="the planned slot looked for rarely")
        driver.wal.write(Slot(1, 0, time.time(), ()))
        wait_until(lambda: (1, 0) in driver._seen, what="a late file still adopted")
    finally:
        driver.close()


@pytest.mark.parametrize(
    ("options", "sentence"),
    [
        ({"walPath": "/tmp/w"}, "the sqs option 'queue' is missing"),
        ({"queue": "QUEUE"}, "the sqs option 'walPath' is missing"),
        ({"queue": "no-such-queue", "walPath": "/tmp/w"}, "queue 'no-such-queue' does not exist"),
        ({"queue": "QUEUE", "walPath": "wal"}, "got 'wal', a relative path"),
        (
            {"queue": "QUEUE", "walPath": "s3://no-such-bucket-here/wal"},
            "names a bucket that does not exist",
        ),
        (
            {"queue": "QUEUE", "walPath": "/tmp/w", "visibilityTimeout": "50000"},
            "'visibilityTimeout' must be from 1 to 43200; got 50000",
        ),
    ],
)
def test_bad_options_stop_the_query_at_start_with_one_sentence(
    spark: SparkSession, aws: LocalSQS, tmp_path: Path, options: dict[str, Any], sentence: str
) -> None:
    queue = make_queue(aws, "orders")
    given = {k: (queue.info.url if v == "QUEUE" else v) for k, v in options.items()}
    with pytest.raises(Exception, match=r"sqs option|does not exist") as raised:
        stream = spark.readStream.format("sqs").options(**given).load()
        query = (
            stream.writeStream.format("noop")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(60)
    assert sentence in str(raised.value)


def test_offloaded_bodies_are_read_from_s3_and_a_missing_one_is_a_row_that_says_why(
    spark: SparkSession, aws: LocalSQS, tmp_path: Path
) -> None:
    import boto3

    from sqsworker.payloads import Payloads
    from sqsworker.transports import OutgoingMessage

    from ..conftest import unique

    bucket = unique("frames")
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=bucket)
    queue = make_queue(aws, "frames")
    payloads = Payloads(bucket=bucket)
    big = [f"{i}" + "f" * 300_000 for i in range(3)]
    offloaded = [payloads.offload(OutgoingMessage(body), 0) for body in big]
    payloads.close()
    gone = offloaded[0]
    s3.delete_object(Bucket=bucket, Key=json.loads(gone.body)[1]["s3Key"])
    s3.close()
    send_all(queue, [*offloaded, "small"])
    run(spark, queue, tmp_path, write_once(str(tmp_path / "out")), payloadBucket=bucket)
    output = read_output(spark, str(tmp_path / "out"))
    assert output is not None
    rows = {r.body[:1]: r for r in output.collect()}
    assert rows["s"].body == "small"
    assert {rows["1"].body, rows["2"].body} == {big[1], big[2]}  # fetched whole
    missing = rows["["]  # the pointer, as SQS holds it
    assert missing.body == gone.body
    assert "gone from S3 (NoSuchKey)" in missing.attributes["sqsworker.payload_error"]
    assert queue.counts().total == 0  # every message deleted: the query went on


class RefusingSettles(FaultProxy):
    """moto's server, but every renewal and delete refused as AccessDenied (not retried:
    the leases are lost at once, SQS returning the messages when they run out)."""

    def _handle(self, request: Any) -> None:
        target = request.headers.get("X-Amz-Target", "")
        if target.endswith((".DeleteMessageBatch", ".ChangeMessageVisibilityBatch")):
            request.rfile.read(int(request.headers.get("Content-Length", 0)))
            return _answer(request, 403, "AccessDenied", "Access to the resource is denied")
        return super()._handle(request)


def test_available_now_waits_until_sqs_itself_returns_what_a_commit_did_not_delete(
    aws: LocalSQS, tmp_path: Path
) -> None:
    # An executor dates each lease from when its receive began; SQS's countdown starts
    # when the receive reaches it, later by the way there (a second here). A committed
    # batch whose deletes were refused: once await_returned says so, the messages are
    # visible, or an availableNow query ends without reading them again.
    queue = make_queue(aws, "orders")
    send_all(queue, [f'{{"order": {i}}}' for i in range(5)])
    slow = FaultProxy(aws.endpoint_url).start()
    slow.set(latency=1.0)  # each request held a second before it reaches SQS
    refusing = RefusingSettles(aws.endpoint_url).start()
    executor = SQSTransport.reopen(queue.info, endpoint_url=slow.url, region="us-east-1")
    options = short_leases(queue, tmp_path, refusing.url, 4)
    driver = Driver(options, queue.info)
    try:
        began = time.time()
        held = tuple(executor.receive(10, 0, 4))
        assert len(held) == 5
        driver.expect([(1, 0)])
        LocalLog(str(tmp_path / "wal")).write(Slot(1, 0, began, held))
        wait_until(lambda: not driver.looking_often(), what="the slot adopted")
        driver.commit_through(1)
        driver.settle()
        assert driver.await_returned()
        assert queue.counts().visible == 5
    finally:
        driver.close()
        executor.close()
        slow.stop()
        refusing.stop()
