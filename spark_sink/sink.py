"""``df.writeStream.format("sqs")``: each row a message, sent in batches, none dropped.

Columns: ``body`` (required, a string); ``group_id`` (required on a FIFO queue; on
a standard queue, a fair queue's tenant);
``deduplication_id`` (FIFO; made from the batch when absent); ``idempotency_key``
(sent as the ``idempotency-key`` attribute, which sqsworker consumers use to
drop duplicates); ``delay_seconds`` (standard queues). Other columns are ignored.

With ``payloadBucket``, a message larger than ``payloadThreshold`` (default: the
queue's ``MaximumMessageSize``) has its body put in that S3 bucket and is sent as a
pointer, in the format of AWS's extended clients (see ``sqsworker.payloads``).

Each ``SendMessageBatch`` carries at most 10 messages and at most the queue's
``MaximumMessageSize`` in all. Entries SQS refuses for its own reasons are sent
again (up to 5 tries); an entry refused for the sender's fault (too big, a bad
attribute) fails the task with SQS's reason. On a FIFO queue a row without a
``deduplication_id`` gets one derived from the query, the batch, the partition
and the row's place in it, so a replayed batch is dropped by SQS within its
5-minute deduplication window instead of being sent twice.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark import TaskContext
from pyspark.sql import Row
from pyspark.sql.datasource import DataSourceStreamWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from sqsworker import tracing
from sqsworker.keys import KEY_ATTRIBUTE
from sqsworker.payloads import Payloads
from sqsworker.transports import GROUP_ID, MAX_BATCH, OutgoingMessage, QueueInfo
from sqsworker.transports.sqs import SQSTransport

from .options import SinkOptions, SQSOptionError

TRIES = 5


@dataclass
class Sent(WriterCommitMessage):
    messages: int


class SQSSendError(RuntimeError):
    """SQS refused a row for a reason sending it again cannot fix."""


class SQSStreamWriter(DataSourceStreamWriter):
    def __init__(self, options: SinkOptions, info: QueueInfo, schema: StructType) -> None:
        columns = set(schema.fieldNames())
        if "body" not in columns:
            raise SQSOptionError(
                "the sqs sink needs a string column 'body': select or alias one, e.g. "
                "df.selectExpr('to_json(struct(*)) AS body')"
            )
        if info.fifo and "group_id" not in columns:
            raise SQSOptionError(
                f"{info.name} is a FIFO queue: the sqs sink needs a column 'group_id' "
                "with each row's MessageGroupId"
            )
        threshold = options.payload_threshold
        if threshold is not None and threshold > info.maximum_message_size:
            raise SQSOptionError(
                f"the sqs option 'payloadThreshold' ({threshold}) is more than {info.name} "
                f"takes ({info.maximum_message_size} bytes): use at most that"
            )
        self.threshold = info.maximum_message_size if threshold is None else threshold
        self.options = options
        self.info = info

    def write(self, iterator: Iterator[Row]) -> Sent:
        context = TaskContext.get()
        origin = "local"
        if context is not None:
            query = context.getLocalProperty("sql.streaming.queryId") or ""
            batch = context.getLocalProperty("streaming.sql.batchId") or ""
            origin = f"{query}/{batch}/{context.partitionId()}"
        transport = SQSTransport.reopen(
            self.info, endpoint_url=self.options.endpoint_url, region=self.options.region
        )
        payloads = None
        if self.options.payload_bucket is not None:
            payloads = Payloads(bucket=self.options.payload_bucket, region=self.options.region)
        try:
            with tracing.producing(self.info.name, 0):
                sent = self._send_rows(transport, iterator, origin, payloads)
        finally:
            transport.close()
            if payloads is not None:
                payloads.close()
            tracing.flush()  # an executor's Python worker may be ended without a goodbye
        return Sent(sent)

    def _send_rows(
        self,
        transport: SQSTransport,
        iterator: Iterator[Row],
        origin: str,
        payloads: Payloads | None,
    ) -> int:
        sent = 0
        pending: list[OutgoingMessage] = []
        size = 0
        for index, record in enumerate(iterator):
            message = tracing.injected(self._message(record.asDict(), origin, index))
            if payloads is not None:
                message = payloads.offload(message, self.threshold)
            length = message.size
            if pending and (
                len(pending) == MAX_BATCH or size + length > self.info.maximum_message_size
            ):
                sent += _send(transport, pending)
                pending, size = [], 0
            pending.append(message)
            size += length
        if pending:
            sent += _send(transport, pending)
        return sent

    def _message(self, values: dict[str, Any], origin: str, index: int) -> OutgoingMessage:
        body = values.get("body")
        if not isinstance(body, str):
            raise SQSSendError(f"row {index} of {origin} has no string body (got {body!r})")
        attributes: dict[str, dict[str, str]] = {}
        key = values.get("idempotency_key")
        if key is not None:
            attributes[KEY_ATTRIBUTE] = {"DataType": "String", "StringValue": str(key)}
        group = values.get("group_id")
        if group and not GROUP_ID.match(str(group)):
            raise SQSSendError(
                f"row {index} of {origin} has group_id {str(group)[:140]!r}, which SQS refuses: "
                "1 to 128 letters, digits or punctuation, no spaces"
            )
        if not self.info.fifo:  # a group id there names a fair queue's tenant
            return OutgoingMessage(
                body,
                attributes,
                delay_seconds=int(values.get("delay_seconds") or 0),
                group_id=str(group) if group else None,
            )
        if not group:
            raise SQSSendError(f"row {index} of {origin} has no group_id for FIFO queue")
        dedup = (
            values.get("deduplication_id")
            or hashlib.sha256(f"{origin}/{index}".encode()).hexdigest()[:64]
        )
        return OutgoingMessage(body, attributes, group_id=str(group), deduplication_id=str(dedup))

    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        pass  # every message was sent by its task; there is nothing to publish

    def abort(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        pass  # sent messages cannot be unsent: the replay's deduplication ids cover FIFO


def _send(transport: SQSTransport, batch: list[OutgoingMessage]) -> int:
    """Send ``batch``; entries refused by SQS's own fault are tried again."""
    total = len(batch)
    for attempt in range(TRIES):
        result = transport.send_batch(batch)
        if not result.failed:
            return total
        refused = [f for f in result.failed if f.sender_fault]
        if refused:
            first = refused[0]
            raise SQSSendError(f"SQS refused a message of the batch: {first.code}: {first.message}")
        batch = [batch[int(f.id)] for f in result.failed]
        time.sleep(min(2.0, 0.1 * 2**attempt))
    raise SQSSendError(f"{len(batch)} messages were still refused after {TRIES} tries")
