"""The seam between the worker and SQS.

A ``Transport`` is bound to one queue. Two implementations: ``SQSTransport``
(boto3, the only module that talks to AWS) and ``MemoryTransport`` (an
in-memory model of SQS semantics for fast tests). One contract test suite runs
against both, so the model cannot drift from the real service.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from ..errors import TransportError

# Per-entry error codes that mean "this receipt handle no longer owns the message".
LEASE_LOST_CODES = frozenset(
    {"ReceiptHandleIsInvalid", "MessageNotInflight", "InvalidReceiptHandle"}
)
# SQS also answers a gone handle with InvalidParameterValue (the code it uses for a
# value past the 12-hour cap too): the message tells them apart.
_PARAMETER_CODES = frozenset({"InvalidParameterValue", "InvalidParameterValueException"})
_GONE_TEXT = re.compile(r"does not exist or is not available|not in ?flight", re.IGNORECASE)
# An entry a batch call's answer named neither successful nor failed, or an answer
# without what the call asked for: SQS may or may not have acted.
UNANSWERED = "EntryNotAnswered"
MAX_BATCH = 10
MAX_BATCH_BYTES = 1_048_576  # SendMessageBatch: its messages in all, whatever the queue's limit
# A MessageGroupId SQS takes, on a FIFO or a standard (fair) queue: 1 to 128 letters,
# digits and punctuation, no spaces.
GROUP_ID = re.compile(r"^[!-~]{1,128}$")
_BATCH_ID = re.compile(r"[A-Za-z0-9_-]{1,80}")
T = TypeVar("T")


@dataclass(frozen=True)
class Envelope:
    """A message as one receive returned it."""

    message_id: str
    receipt_handle: str
    body: str
    attributes: Mapping[str, str] = field(default_factory=dict)
    # SQS's shape: name -> {"DataType": ..., "StringValue" | "BinaryValue": ...}
    message_attributes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def receive_count(self) -> int:
        """SQS's ApproximateReceiveCount: 1 when a server left it out or sent no number
        (no text at all, a JSON null, say)."""
        try:
            return max(1, int(self.attributes.get("ApproximateReceiveCount", "1")))
        except (TypeError, ValueError):
            return 1


@dataclass(frozen=True)
class QueueInfo:
    url: str
    name: str
    arn: str
    fifo: bool = False
    visibility_timeout: int = 30
    maximum_message_size: int = 1_048_576
    dead_letter_arn: str | None = None
    max_receive_count: int | None = None  # from the RedrivePolicy, when there is one
    content_deduplication: bool = False  # FIFO: ContentBasedDeduplication


@dataclass(frozen=True)
class QueueCounts:
    visible: int
    in_flight: int
    delayed: int

    @property
    def total(self) -> int:
        return self.visible + self.in_flight + self.delayed


@dataclass(frozen=True)
class OutgoingMessage:
    body: str
    message_attributes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    delay_seconds: int = 0
    group_id: str | None = None
    deduplication_id: str | None = None

    @property
    def size(self) -> int:
        """The bytes SQS counts against its message size limit: the body, and each
        attribute's name, type and value."""
        total = len(self.body.encode())
        for name, value in self.message_attributes.items():
            total += len(name.encode()) + len(str(value.get("DataType", "")).encode())
            total += len(str(value.get("StringValue", "")).encode())
            total += len(value.get("BinaryValue", b"") or b"")
        return total


@dataclass(frozen=True)
class EntryFailure:
    id: str
    code: str
    message: str
    sender_fault: bool = True

    @property
    def lease_lost(self) -> bool:
        """The receipt handle no longer owns the message: someone else may have it now."""
        if self.code in LEASE_LOST_CODES:
            return True
        return self.code in _PARAMETER_CODES and bool(_GONE_TEXT.search(self.message))

    @property
    def unanswered(self) -> bool:
        """The answer did not name the entry: SQS may have acted on it, or not."""
        return self.code == UNANSWERED

    @property
    def past_cap(self) -> bool:
        """SQS refused a visibility that would pass the 12-hour cap."""
        return self.code in _PARAMETER_CODES and not self.lease_lost


@dataclass
class BatchResult:
    """Which entries of a batch call succeeded; every failed one must be handled."""

    succeeded: list[str] = field(default_factory=list)
    failed: list[EntryFailure] = field(default_factory=list)
    # For send batches: entry id -> new MessageId.
    message_ids: dict[str, str] = field(default_factory=dict)


class Transport(Protocol):
    info: QueueInfo
    requests: Counter[str]  # API action -> requests sent, retries included
    request_errors: Counter[tuple[str, str]]  # (action, error code) -> failed requests

    def receive(
        self,
        max_messages: int,
        wait_seconds: int,
        visibility_timeout: int,
        attempt_id: str | None = None,
    ) -> list[Envelope]: ...

    def delete_batch(self, entries: Sequence[tuple[str, str]]) -> BatchResult:
        """Delete up to 10 messages; entries are ``(entry_id, receipt_handle)``."""
        ...

    def change_visibility_batch(self, entries: Sequence[tuple[str, str, int]]) -> BatchResult:
        """Up to 10 ``(entry_id, receipt_handle, seconds)``, each counted from now."""
        ...

    def send_batch(self, messages: Sequence[OutgoingMessage]) -> BatchResult:
        """Send up to 10 messages; entry ids are their positions, "0" to "9"."""
        ...

    def counts(self) -> QueueCounts: ...

    def open(self, queue: str) -> Transport:
        """Another queue (name, URL or ARN) on the same endpoint and credentials."""
        ...

    def close(self) -> None: ...


def check_batch(ids: Sequence[str]) -> None:
    """SQS's rules for the entries of a batch call; a breach refuses the whole call."""
    if (
        0 < len(ids) <= MAX_BATCH
        and len(set(ids)) == len(ids)
        and all(map(_BATCH_ID.fullmatch, ids))
    ):
        return  # every batch the worker makes: checked in one pass
    if not ids:
        raise _refused("EmptyBatchRequest", "there should be at least one entry in the request")
    if len(ids) > MAX_BATCH:
        raise _refused("TooManyEntriesInBatchRequest", "at most 10 entries per batch")
    if len(set(ids)) != len(ids):
        raise _refused("BatchEntryIdsNotDistinct", "two or more entries have the same Id")
    for entry_id in ids:
        if not _BATCH_ID.fullmatch(entry_id):
            raise _refused("InvalidBatchEntryId", f"batch entry id {entry_id!r} is not valid")


def _refused(code: str, text: str) -> TransportError:
    return TransportError(f"{code}: {text}", code=code)


def chunks(items: Sequence[Any], size: int = MAX_BATCH) -> list[Sequence[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def send_batches(items: Iterable[T], size: Callable[[T], int]) -> Iterator[list[T]]:
    """``items`` in order, in batches SendMessageBatch takes: at most 10 entries and
    ``MAX_BATCH_BYTES`` in all, ``size(item)`` bytes each."""
    batch: list[T] = []
    total = 0
    for item in items:
        length = size(item)
        if batch and (len(batch) == MAX_BATCH or total + length > MAX_BATCH_BYTES):
            yield batch
            batch, total = [], 0
        batch.append(item)
        total += length
    if batch:
        yield batch


def send_all(transport: Transport, messages: Sequence[OutgoingMessage | str]) -> list[str]:
    """Send any number of messages in batches of 10; raise if any entry fails."""
    outgoing = [m if isinstance(m, OutgoingMessage) else OutgoingMessage(m) for m in messages]
    ids: list[str] = []
    for batch in chunks(outgoing):
        result = transport.send_batch(batch)
        if result.failed:
            first = result.failed[0]
            raise TransportError(
                f"{len(result.failed)} of {len(batch)} messages were not sent: "
                f"{first.code}: {first.message}",
                code=first.code,
            )
        ids.extend(result.message_ids[str(i)] for i in range(len(batch)))
    return ids
