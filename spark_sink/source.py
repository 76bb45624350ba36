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
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
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

from sqsworker.clock import SystemClock
from sqsworker.errors import PayloadMissing, SQSWorkerError
from sqsworker.lease import Held, LeaseKeeper
from sqsworker.logs import LogObserver
from sqsworker.message import Message
from sqsworker.payloads import Payloads
from sqsworker.pointers import is_offloaded
from sqsworker.transports import MAX_BATCH, Envelope, QueueInfo
from sqsworker.transports.sqs import SQSTransport

from .options import SinkOptions, SourceOptions, SQSOptionError
from .wal import LogUnusable, Slot, WriteAheadLog, open_log

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
WATCH_EVERY = 0.5  # seconds between the driver's looks for a late slot, when none is due
DUE_FOR = 120.0  # seconds a planned slot is looked for often (the log's look_every); then
# every WATCH_EVERY until its batch commits
LEASE_SENDERS = 16  # renewals and deletes the driver has under way at once, at most
IDLE_WAIT = 1.0  # seconds latestOffset waits when the queue shows nothing (no busy polling)
DELETE_TIMEOUT = 60.0  # seconds a commit waits for SQS to answer its deletes
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
        self._driver: _Driver | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_driver": None}

    def driver(self) -> _Driver:
        if self._driver is None:
            self._driver = _Driver(self.options, self.info)
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
            if driver.await_returned() and driver.visible() > 0:
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


class _Driver:
    """The driver's side: leases of uncommitted batches, and their deletes."""

    def __init__(self, options: SourceOptions, info: QueueInfo) -> None:
        self.options = options
        self.queue_url = info.url
        # a connection for each sender, and one for latestOffset's counts
        self.transport = SQSTransport.reopen(
            info,
            endpoint_url=options.endpoint_url,
            region=options.region,
            max_connections=LEASE_SENDERS + 2,
        )
        self.clock = SystemClock()
        # Renewals due together, and a commit's deletes, go out LEASE_SENDERS at a time.
        self.keeper = LeaseKeeper(
            self.transport, self.clock, _SourceLog("spark_sink"), senders=LEASE_SENDERS
        )
        self.keeper.start()
        self.wal: WriteAheadLog = open_log(options.wal_path, options.region)
        self.look_every = self.wal.look_every(options.visibility_timeout)
        self.planned = 0
        # guards _held, _seen, _due, _known and _committed across a whole adopt or commit,
        # so a slot is never adopted into a batch that a commit already took
        self._lock = threading.RLock()
        self._held: dict[int, list[Held]] = {}  # seq -> its messages, leases kept
        # Slots an earlier driver left that this one has not planned: a committed batch's
        # whose deletes were not seen answered, or one a late task attempt wrote after its
        # batch committed (messages no batch returned). Not told apart, they are handed
        # back at the commit, never deleted: what comes again is dropped by message_id.
        self._left: dict[tuple[int, int], list[Held]] = {}
        self._seen: set[tuple[int, int]] = set()  # (seq, partition) slots handed to the keeper
        # slots planned whose slot is not seen yet -> until when to look for it often (a
        # task that never writes its slot, a query that failed, is looked for rarely then)
        self._due: dict[tuple[int, int], float] = {}
        self._known: set[tuple[int, int]] = set()  # every slot that may be in the log
        self._committed = 0
        self._closing = False
        # When the messages of committed batches not deleted (a lease lapsed, a delete
        # failed: SQS delivers them again) are visible at the latest (monotonic); or None
        self._returned_by: float | None = None
        self._nudge = threading.Event()  # a slot was planned, or close() was called
        # A commit's deletes go on while the next batch is planned and read: one commit
        # at a time, in order; settle() and close() wait for them.
        self._committer = ThreadPoolExecutor(1, thread_name_prefix="spark-sink-commit")
        self._last_commit: Future[None] | None = None
        # What an earlier driver of this query left: the one listing of the log.
        with self._lock:
            for slot in self.wal.slots():
                self._adopt(slot, left=True)
        self._watcher = threading.Thread(target=self._watch, name="spark-sink-wal", daemon=True)
        self._watcher.start()

    def visible(self) -> int:
        return self.transport.counts().visible

    def expect(self, slots: Iterable[tuple[int, int]]) -> None:
        """Partitions planned: look for their slots often until each is there."""
        until = time.monotonic() + max(DUE_FOR, 2 * self.options.visibility_timeout)
        with self._lock:
            for key in slots:
                self._known.add(key)
                if key in self._left:  # a batch replayed: its rows are returned again
                    self._held.setdefault(key[0], []).extend(self._left.pop(key))
                if key not in self._seen:
                    self._due[key] = until
        self._nudge.set()

    def looking_often(self) -> bool:
        with self._lock:
            now = time.monotonic()
            return any(until > now for until in self._due.values())

    def _watch(self) -> None:
        # Each slot is adopted within look_every of being written, while its partition
        # runs: the executor dated its leases from its first receive, and they are due
        # for renewal half a visibility timeout from then.
        while not self._closing:
            try:
                self.adopt()
            except Exception:  # an unreadable log, a storage error: look again, and say so
                log.exception("reading the write-ahead log failed; looking again")
            self._nudge.wait(self.look_every if self.looking_often() else WATCH_EVERY)
            self._nudge.clear()

    def adopt(self) -> None:
        """Keep alive the leases of every planned slot written since the last look (read
        by name: the log is not listed).

        The watcher reads without the lock, so a slow store never holds up a commit; a
        commit reads again under it (commit_through), and a slot found here after its
        batch was committed is not adopted again (``_adopt``).
        """
        with self._lock:
            wanted = [key for key in self._due if key[0] > self._committed]
        if not wanted:
            return
        found = self.wal.find(wanted)
        with self._lock:
            for slot in found:
                self._adopt(slot)

    def _adopt(self, slot: Slot, left: bool = False) -> None:
        key = slot.key
        self._due.pop(key, None)
        self._known.add(key)
        if slot.seq <= self._committed or key in self._seen:
            return
        self._seen.add(key)
        if slot.queue and slot.queue != self.queue_url:  # another query's: its task fails
            log.error(
                "a write-ahead log slot holds messages of another queue; its leases are "
                "not kept here (give each query a walPath of its own)",
                path=self.wal.where(*key),
                queue=slot.queue,
            )
            return
        # Each lease from when its own receive began (a partition that received nothing
        # holds none). The keeper counts on its monotonic clock; the log on the wall's.
        offset = self.clock.monotonic() - self.clock.time()
        for began, envelopes in slot.leases():
            held = self.keeper.add(envelopes, began + offset, self.options.visibility_timeout)
            if left:
                self._left.setdefault(key, []).extend(held)
            else:
                self._held.setdefault(slot.seq, []).extend(held)

    def commit_through(self, seq: int) -> None:
        """Delete every message of every batch up to ``seq``, then forget their log.

        The deletes go on after this returns, so the next batch is read meanwhile; their
        leases are kept until SQS answers, and the log stays until then (a driver
        restarted before then hands them back from it). ``settle()`` waits for them.
        """
        with self._lock:
            if seq <= self._committed:
                return
            self.adopt()  # a slot written since the last look is committed too
            batches = [self._held.pop(s) for s in list(self._held) if s <= seq]
            returned = [h for key in list(self._left) if key[0] <= seq for h in self._left.pop(key)]
            self._due = {key: until for key, until in self._due.items() if key[0] > seq}
            slots = {key for key in self._known if key[0] <= seq}
            self._known -= slots
            self._committed = seq
            held = [h for batch in batches for h in batch]
            self._last_commit = self._committer.submit(self._settle, seq, held, slots, returned)

    def await_returned(self) -> bool:
        """Wait until the committed messages not deleted since the last call may be
        visible again; True if there were any."""
        with self._lock:
            by, self._returned_by = self._returned_by, None
        if by is None:
            return False
        time.sleep(max(0.0, by - time.monotonic()))
        return True

    def settle(self) -> None:
        """Wait until every commit so far has its deletes answered and its log gone."""
        with self._lock:
            last = self._last_commit
        if last is not None:
            last.result()

    def _settle(
        self,
        seq: int,
        held: list[Held],
        slots: set[tuple[int, int]],
        returned: list[Held] | None = None,
    ) -> None:
        if returned:
            log.warning(
                "messages an earlier driver left in the write-ahead log of a committed "
                "batch are handed back; those a batch returned are dropped by message_id "
                "when they come again",
                count=len(returned),
                batch_id=seq - 1,
            )
        try:
            unsent = self.keeper.hand_back_now(returned or [], DELETE_TIMEOUT)
            unsent += self.keeper.delete_now(held, DELETE_TIMEOUT)
        except Exception:  # the log stays: a restarted driver hands them back
            log.exception("deleting committed messages failed", batch_id=seq - 1)
            return
        if unsent:
            log.warning(
                "deletes of committed messages still unanswered; they may be delivered again",
                count=unsent,
                batch_id=seq - 1,
            )
        back = [h.may_hold_for for h in held if h.lost]
        if back:
            with self._lock:
                by = time.monotonic() + max(back)
                self._returned_by = max(self._returned_by or by, by)
        # The log goes once SQS answered: a driver restarted before then hands them back.
        try:
            self.wal.drop(slots)
        except Exception:  # left behind: a restarted driver hands back, and drops them
            log.exception("removing committed slots of the write-ahead log failed")
            return
        with self._lock:
            self._seen = {key for key in self._seen if key[0] > seq}

    def close(self) -> None:
        # The commits' deletes first: when the query ends here, this process ends with it.
        self._committer.shutdown(wait=True)
        self._closing = True
        self._nudge.set()
        self._watcher.join()
        self.keeper.stop(give_up_after=10)
        self.transport.close()


class _SourceLog(LogObserver):
    """The worker's log lines, said as they apply to a batch: delivery is at least once,
    and the pipeline's dropDuplicatesWithinWatermark(["message_id"]) (or any sink keyed
    by message id) drops what comes twice."""

    def delete_failed(self, message: Message, reason: str, will_retry: bool) -> None:
        if will_retry:
            super().delete_failed(message, reason, will_retry)
            return
        if isinstance(message.lease, Held) and message.lease.disowned:
            # Some servers delete on a stale receipt handle, some do not.
            self._for(message).warning(
                "delete of a committed message not confirmed: its lease was lost, so it "
                "may not have been deleted; if it comes again, the pipeline drops it by its "
                "message_id",
                reason=reason,
            )
            return
        self._for(message).error(
            "delete of a committed message failed: SQS will deliver it again; the pipeline "
            "drops it by its message_id",
            reason=reason,
        )

    def lease_lost(self, message: Message, reason: str) -> None:
        self._for(message).warning(
            "lease lost: another consumer may receive this message; if it comes again, "
            "the pipeline drops it by its message_id",
            reason=reason,
        )
