"""``spark.readStream.format("sqs")``: SQS messages in micro-batches, none lost.

How one batch goes (offsets are ``{"seq": n}``, n the batch's slot in the log):

1. Driver, ``latestOffset``: when the queue shows visible messages, the next
   batch is the next slot. Every batch up to the start offset is committed
   first (Spark asks only after that batch is in its commit log).
2. Executors, ``read``: each partition receives up to its share of
   ``maxMessagesPerBatch``, several receives in flight after its first (for a
   third of the visibility timeout at most), writes what it received to its
   slot of the write-ahead log (``wal.py``: S3 or a shared folder) with when
   each receive began, and only then returns rows. A replayed partition returns
   the log's rows and receives nothing.
3. Driver, all along: a watcher thread reads each planned slot by name until it
   is written (every 20 ms in a folder; on S3 a sixteenth of the visibility
   timeout) and hands its messages to a ``LeaseKeeper`` (the worker's lease
   thread), each lease dated from its own receive. It keeps each message
   invisible, in batched ``ChangeMessageVisibilityBatch`` calls, several at
   once, within the 12-hour cap, logging any lease it loses.
4. Driver, ``commit`` (or the next ``latestOffset``): the batch's messages are
   deleted with ``DeleteMessageBatch``, several calls at once (per-entry
   failures retried, lost handles logged); once SQS answered, its slots are
   removed.

A failure anywhere before 4 leaves the messages in the queue (or in the log,
for a replay): delivery is at least once. The documented pipeline makes the
output exactly once: ``dropDuplicatesWithinWatermark(["message_id"])`` on
``received_at``, then Spark's file sink (docs/spark.md).
"""

from __future__ import annotations

import base64
import math
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import structlog
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
from pyspark.sql.types import (
    IntegerType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from sqsworker.errors import PayloadMissing, SQSWorkerError
from sqsworker.message import Message
from sqsworker.payloads import Payloads
from sqsworker.pointers import is_offloaded
from sqsworker.transports import MAX_BATCH, Envelope, QueueInfo
from sqsworker.transports.sqs import SQSTransport

from .driver import Driver
from .options import SinkOptions, SourceOptions, SQSOptionError
from .wal import LogUnusable, Slot, open_log

SCHEMA = StructType(
    [
        StructField("message_id", StringType(), False),
        StructField("body", StringType(), False),
        StructField("attributes", MapType(StringType(), StringType()), False),
        StructField("message_attributes", MapType(StringType(), StringType()), False),
        StructField("receive_count", IntegerType(), False),
        StructField("sent_timestamp", TimestampType(), True),
        StructField("group_id", StringType(), True),
        StructField("sequence_number", StringType(), True),
        StructField("deduplication_id", StringType(), True),
        # When the source received this delivery (its partition's first receive): it only
        # grows with the query, unlike sent_timestamp (SQS delivers out of send order), so
        # it is the event time of dropDuplicatesWithinWatermark(["message_id"]).
        StructField("received_at", TimestampType(), False),
    ]
)
PAYLOAD_ERROR = "sqsworker.payload_error"  # the attribute of a row whose body is not in S3
IDLE_WAIT = 1.0  # seconds latestOffset waits when the queue shows nothing (no busy polling)
RECEIVE_SHARE = 3  # receiving stops 1/3 of the visibility timeout after it began
log = structlog.get_logger("spark_sink")


class SQSDataSource(DataSource):
    """Register with ``spark.dataSource.register(SQSDataSource)``; then ``format("sqs")``."""

    @classmethod
    def name(cls) -> str:
        return "sqs"

    def schema(self) -> StructType:
        return SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = SourceOptions.parse(self.options)
        info = _queue_info(options.queue, options.endpoint_url, options.region)
        try:  # refused here, at the query's start, with one sentence
            wal = open_log(options.wal_path, options.region)
            marker = wal.prepare()
            wal.refuse_other_queue(info.url)  # another query's log: its rows are not ours
        except LogUnusable as exc:
            raise SQSOptionError(str(exc)) from None
        return SQSStreamReader(options, info, marker)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from .sink import SQSStreamWriter

        options = SinkOptions.parse(self.options)
        info = _queue_info(options.queue, options.endpoint_url, options.region)
        return SQSStreamWriter(options, info, schema)


def _queue_info(queue: str, endpoint_url: str | None, region: str | None) -> QueueInfo:
    """The queue's URL and attributes, checked once on the driver for every task to use."""
    try:
        transport = SQSTransport.connect(queue, endpoint_url=endpoint_url, region=region)
    except SQSWorkerError as exc:  # one sentence: the queue, the region, the endpoint
        raise SQSOptionError(str(exc)) from None
    transport.close()
    return transport.info


class SQSPartition(InputPartition):
    """What one task needs to receive (or replay) its share of one batch."""

    def __init__(
        self,
        seq: int,
        index: int,
        budget: int,
        options: SourceOptions,
        info: QueueInfo,
        marker: str | None = None,
    ) -> None:
        super().__init__((seq, index))
        self.seq = seq
        self.index = index
        self.budget = budget
        self.options = options
        self.info = info
        self.marker = marker  # a local log's: the task refuses a folder without it


class SQSStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions, info: QueueInfo, marker: str | None = None) -> None:
        # Pickled to the executors: threads, locks and clients are made on first use.
        self.options = options
        self.info = info
        self.marker = marker
        self.available_now = False
        self._driver: Driver | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_driver": None}

    def driver(self) -> Driver:
        if self._driver is None:
            self._driver = Driver(self.options, self.info)
        return self._driver

    # -- on the driver -------------------------------------------------------------------

    def initialOffset(self) -> dict[str, int]:
        return {"seq": 0}

    def latestOffset(
        self, start: dict[str, int] | None = None, limit: Any = None
    ) -> dict[str, int]:
        driver = self.driver()
        if start is None:  # Spark before 4.2 passes no start: continue from the last plan
            start = {"seq": driver.planned}
        driver.commit_through(start["seq"])  # asked only once that batch is in the commit log
        if driver.visible() > 0:
            return {"seq": start["seq"] + 1}
        # Nothing to read: the commits' deletes finish before the query may end here.
        driver.settle()
        if self.available_now:
            # What a lapsed lease or a failed delete put back is this run's to read.
            if driver.await_returned():
                return {"seq": start["seq"] + 1}
        else:
            time.sleep(IDLE_WAIT)  # Spark asks again at once: do not poll SQS in a loop
        return start

    def prepareForTriggerAvailableNow(self) -> None:
        # SQS has no offset to stop at: the query ends at the first look that finds
        # no visible message.
        self.available_now = True

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[SQSPartition]:
        driver = self.driver()
        driver.planned = max(driver.planned, end["seq"])
        shares = [
            self.options.max_messages_per_batch // self.options.num_partitions
            + (1 if i < self.options.max_messages_per_batch % self.options.num_partitions else 0)
            for i in range(self.options.num_partitions)
        ]
        planned = [
            SQSPartition(seq, index, share, self.options, self.info, self.marker)
            for seq in range(start["seq"] + 1, end["seq"] + 1)
            for index, share in enumerate(shares)
            if share > 0
        ]
        driver.expect((p.seq, p.index) for p in planned)
        return planned

    def commit(self, end: dict[str, int]) -> None:
        self.driver().commit_through(end["seq"])

    def stop(self) -> None:
        if self._driver is not None:
            self._driver.close()
            self._driver = None

    # -- on the executors ------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, SQSPartition)
        slot = receive_or_replay(partition)
        if not any(is_offloaded(e.message_attributes) for e in slot.messages):
            return (row(envelope, slot.received_at) for envelope in slot.messages)
        return _fetched_rows(slot, partition.options)


def receive_or_replay(partition: SQSPartition) -> Slot:
    """The partition's messages: from the log when it was read before, else from SQS."""
    options = partition.options
    wal = open_log(options.wal_path, options.region)
    wal.confirm(partition.marker)  # a folder the driver does not see is refused
    logged = wal.read(partition.seq, partition.index)
    if logged is not None:
        logged.refuse_other_queue(partition.info.url, options.wal_path)
        return logged
    transport = SQSTransport.reopen(
        partition.info,
        endpoint_url=options.endpoint_url,
        region=options.region,
        max_connections=options.receives_in_flight + 1,
    )
    try:
        received_at, receipts = _receive(transport, options, partition.budget)
        received = [envelope for _, envelope in receipts]
        ours = Slot(
            partition.seq,
            partition.index,
            time.time() if received_at is None else received_at,
            tuple(received),
            tuple(began for began, _ in receipts),
            partition.info.url,
        )
        recorded = wal.write(ours)
        if recorded is not ours and received:  # another attempt recorded this slot first
            for start in range(0, len(received), MAX_BATCH):
                chunk = received[start : start + MAX_BATCH]
                transport.change_visibility_batch(
                    [(str(i), e.receipt_handle, 0) for i, e in enumerate(chunk)]
                )
        recorded.refuse_other_queue(partition.info.url, options.wal_path)
        return recorded
    finally:
        transport.close()


def _receive(
    transport: SQSTransport, options: SourceOptions, budget: int
) -> tuple[float | None, list[tuple[float, Envelope]]]:
    """Up to ``budget`` messages: when the first receive that returned some began (wall
    clock; None if none did), and each message with when its own receive began (the
    driver dates each lease from it).

    The first receive long-polls alone; then up to ``receivesInFlight`` receives are in
    flight at once (so a partition is not capped at 10 messages a round trip), each asking for
    what the budget has left, until the budget is spent, a receive comes back empty, or
    a RECEIVE_SHARE of the visibility timeout has passed since that first receive began
    (the driver keeps the leases alive only once the log has them, from half of it).
    """
    began, began_wall = time.monotonic(), time.time()
    first = transport.receive(
        min(MAX_BATCH, budget), options.wait_time_seconds, options.visibility_timeout
    )
    if not first:
        return None, []
    stop_at = began + options.visibility_timeout / RECEIVE_SHARE
    received = [(began_wall, envelope) for envelope in first]
    lock = threading.Lock()  # guards received, asked and done
    asked = 0  # messages the receives under way ask for
    done = False  # a receive came back empty, or failed: no more start

    def receiver() -> None:
        nonlocal asked, done
        while True:
            with lock:
                want = min(MAX_BATCH, budget - len(received) - asked)
                if done or want <= 0 or time.monotonic() >= stop_at:
                    return
                asked += want
            when = time.time()
            try:
                got = transport.receive(want, 0, options.visibility_timeout)
            except SQSWorkerError as exc:  # what was received so far is kept and logged
                log.warning("a receive failed; the batch keeps what it has", error=str(exc))
                got = []
            with lock:
                asked -= want
                received.extend((when, envelope) for envelope in got)
                done = done or not got

    count = min(options.receives_in_flight, math.ceil((budget - len(received)) / MAX_BATCH))
    if count > 0:
        with ThreadPoolExecutor(count, thread_name_prefix="spark-sink-receive") as pool:
            for running in [pool.submit(receiver) for _ in range(count)]:
                running.result()
    return began_wall, received


def _fetched_rows(slot: Slot, options: SourceOptions) -> Iterator[tuple[Any, ...]]:
    """The slot's rows, offloaded bodies fetched from S3 (the log keeps the pointers, so a
    replay fetches again). A body that cannot be had is a row all the same, its pointer as
    the body and the reason in ``attributes["sqsworker.payload_error"]``: the batch, and
    the query, go on. S3 not answering fails the task, which Spark tries again."""
    payloads = Payloads(bucket=options.payload_bucket, region=options.region)
    try:
        for envelope in slot.messages:
            message = Message(envelope)
            try:
                message.fetch_body(payloads)
            except PayloadMissing as exc:
                yield row(envelope, slot.received_at, error=str(exc))
                continue
            yield row(envelope, slot.received_at, body=message.body)
    finally:
        payloads.close()


def row(
    envelope: Envelope, received_at: float, body: str | None = None, error: str | None = None
) -> tuple[Any, ...]:
    attributes = dict(envelope.attributes)
    if error is not None:
        attributes[PAYLOAD_ERROR] = error
    sent = attributes.get("SentTimestamp")
    user: dict[str, str] = {}
    for name, value in envelope.message_attributes.items():
        text = value.get("StringValue")
        if text is None and "BinaryValue" in value:
            raw = value["BinaryValue"]
            text = base64.b64encode(raw).decode() if isinstance(raw, bytes) else str(raw)
        user[name] = str(text)
    return (
        envelope.message_id,
        envelope.body if body is None else body,
        attributes,
        user,
        envelope.receive_count,
        datetime.fromtimestamp(int(sent) / 1000, tz=UTC) if sent else None,
        attributes.get("MessageGroupId"),
        attributes.get("SequenceNumber"),
        attributes.get("MessageDeduplicationId"),
        datetime.fromtimestamp(received_at, tz=UTC),
    )
