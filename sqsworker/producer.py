"""Sending from Python: ``Producer(queue).send(body)`` and ``send_many(bodies)``.

The sending half of the product, for application code (a web request that queues an
order, a job that fans work out) and for ``sqsworker send``. A body may be text, a dict
or list (sent as JSON), a pydantic model or a dataclass (as their JSON). Each message is
checked against what the queue accepts before anything is sent: FIFO queues need a
group id (and get a deduplication id derived from the body when the queue has no
content-based deduplication, as SQS's own would be), and a body larger than the queue's
``MaximumMessageSize`` goes to S3 in the extended clients' format when a
``payload_bucket`` is given, or is refused with one sentence. ``send_many`` sends
batches of at most 10 entries and 1 MiB, tries entries SQS failed again (those it
refused for their content cannot succeed and are not), and raises ``SendError`` naming
the ones that kept failing. The current trace context goes with each message when
tracing is on. A ``Producer`` may be shared between threads; ``AsyncProducer`` is the
same for ``async def`` code.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import tracing
from .errors import ConfigError, TransportError
from .payloads import Payloads
from .transports import GROUP_ID, UNANSWERED, OutgoingMessage, Transport, send_batches

MAX_DELAY = 900  # SQS: DelaySeconds
ATTEMPTS = 3  # sends of an entry SQS failed for a passing reason, at most
RETRY_AFTER = 0.2  # seconds before the first retry of failed entries; doubled each time
# Codes of an entry SQS refused for the message itself: sending it again cannot succeed.
REFUSED = frozenset(
    {
        "InvalidParameterValue",
        "InvalidMessageContents",
        "MessageTooLong",
        "InvalidAttributeValue",
        "InvalidAttributeName",
        "UnsupportedOperation",
    }
)


class SendError(TransportError):
    """Some messages were not sent: ``failed`` names each (its index among the bodies
    given, SQS's code and text); ``message_ids`` has the id of each one that was (None for
    those that were not). ``unconfirmed`` holds the indexes of those SQS may have taken
    all the same (a call whose answer never came: a timeout, a reset, a server error; or
    an answer that did not name it, code ``EntryNotAnswered``): sending one again may send
    a copy."""

    def __init__(
        self,
        message: str,
        failed: list[tuple[int, str, str]],
        message_ids: list[str | None],
        unconfirmed: frozenset[int] = frozenset(),
    ) -> None:
        super().__init__(message, code=failed[0][1] if failed else "")
        self.failed = failed
        self.message_ids = message_ids
        self.unconfirmed = unconfirmed


@dataclass
class SendReport:
    """What ``send_many`` did: each message's id, in the order of the bodies given."""

    message_ids: list[str] = field(default_factory=list)
    requests: int = 0  # SendMessageBatch calls made, retries included
    offloaded: int = 0  # bodies put in S3

    @property
    def sent(self) -> int:
        return len(self.message_ids)


class Producer:
    """Sends messages to one queue.

    ``queue``: a name, URL or ARN. ``endpoint_url`` and ``region`` as ``sqsworker run``
    takes them (boto3's own configuration otherwise: ``AWS_ENDPOINT_URL_SQS``,
    ``AWS_REGION``...). ``payload_bucket``: where bodies too large for the queue go. The
    queue is looked up on the first send (or at once with ``connect=True``)."""

    def __init__(
        self,
        queue: str,
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        payload_bucket: str | None = None,
        payload_threshold: int | None = None,
        transport: Transport | None = None,
        payloads: Payloads | None = None,
        connect: bool = False,
    ) -> None:
        self.queue = queue
        # Bodies over this many bytes (attributes counted) go to S3: the queue's limit, or
        # less (the extended clients' own default is 262,144).
        self.payload_threshold = payload_threshold
        self._endpoint_url = endpoint_url
        self._region = region
        self._transport = transport
        self._owns_transport = transport is None
        self.payload_bucket = payload_bucket
        self._payloads = payloads
        self._lock = threading.Lock()
        if connect:
            self.transport  # noqa: B018 - the lookup raises now, not at the first send

    @property
    def transport(self) -> Transport:
        with self._lock:
            if self._transport is None:
                from .transports.sqs import SQSTransport

                self._transport = SQSTransport.connect(
                    self.queue, endpoint_url=self._endpoint_url, region=self._region
                )
            return self._transport

    @property
    def payloads(self) -> Payloads:
        with self._lock:
            if self._payloads is None:
                self._payloads = Payloads(bucket=self.payload_bucket, region=self._region)
            return self._payloads

    def send(
        self,
        body: object,
        *,
        group_id: str | None = None,
        deduplication_id: str | None = None,
        delay: int | None = None,
        attributes: Mapping[str, object] | None = None,
    ) -> str:
        """Send one message; its message id. Raises ``SendError`` if SQS would not take it."""
        message = self.message(
            body,
            group_id=group_id,
            deduplication_id=deduplication_id,
            delay=delay,
            attributes=attributes,
        )
        return self.deliver([message]).message_ids[0]

    def send_many(
        self,
        bodies: Iterable[object],
        *,
        group_id: str | Callable[[object], str] | None = None,
        deduplication_id: Callable[[object], str] | None = None,
        delay: int | None = None,
        attributes: Mapping[str, object] | None = None,
        progress: Callable[[int], None] = lambda sent: None,
    ) -> SendReport:
        """Send every body, in batches. ``group_id`` may be a function of the body (each
        body its group), ``deduplication_id`` must be (a body's own id); ``progress`` is
        called with how many each batch sent. Raises ``SendError`` naming the messages
        that were not sent (after ``ATTEMPTS`` tries where a retry could help)."""
        messages = [
            self.message(
                body,
                group_id=group_id(body) if callable(group_id) else group_id,
                deduplication_id=deduplication_id(body) if deduplication_id else None,
                delay=delay,
                attributes=attributes,
            )
            for body in bodies
        ]
        return self.deliver(messages, progress)

    def deliver(
        self, messages: Sequence[OutgoingMessage], progress: Callable[[int], None] = lambda n: None
    ) -> SendReport:
        """Send messages made already (``message``): offloaded where too large, traced,
        in batches, failed entries tried again. Raises ``SendError``."""
        info = self.transport.info
        messages = list(messages)
        report = SendReport()
        threshold = info.maximum_message_size
        if self.payload_threshold is not None:
            threshold = min(threshold, self.payload_threshold)
        if any(m.size > threshold for m in messages):
            outgoing = []
            for index, message in enumerate(messages):
                if message.size > threshold:
                    message = self._offload(message, index, threshold)
                    report.offloaded += 1
                outgoing.append(message)
            messages = outgoing
        with tracing.producing(info.name, len(messages)):
            messages = [tracing.injected(m) for m in messages]
            ids, failed, unconfirmed = self._send(messages, report, progress)
        if failed:
            names = ", ".join(f"{i} ({code}: {text})" for i, code, text in failed[:5])
            more = f" and {len(failed) - 5} more" if len(failed) > 5 else ""
            what = "not sent, or not confirmed sent," if unconfirmed else "not sent"
            raise SendError(
                f"{len(failed)} of {len(messages)} messages were {what} to {info.name}: "
                f"message {names}{more}",
                failed,
                ids,
                frozenset(unconfirmed),
            )
        report.message_ids = [i for i in ids if i is not None]
        return report

    def message(
        self,
        body: object,
        *,
        group_id: str | None = None,
        deduplication_id: str | None = None,
        delay: int | None = None,
        attributes: Mapping[str, object] | None = None,
    ) -> OutgoingMessage:
        """The message ``body`` makes, checked against what the queue accepts."""
        info = self.transport.info
        text = encode(body)
        if info.fifo:
            if group_id is None:
                raise ConfigError(
                    f"{info.name} is a FIFO queue: give each message a group_id (an order or "
                    "customer id: messages of one group are delivered in order)"
                )
            if deduplication_id is None and not info.content_deduplication:
                # What SQS's content-based deduplication would use: the body's SHA-256.
                deduplication_id = hashlib.sha256(text.encode()).hexdigest()
            if delay:
                raise ConfigError(
                    f"{info.name} is a FIFO queue: SQS takes no per-message delay there (set "
                    "the queue's DelaySeconds instead)"
                )
        elif deduplication_id is not None:
            raise ConfigError(
                f"{info.name} is a standard queue: a deduplication_id is for FIFO queues only "
                "(use an idempotency key to run a message's effect once)"
            )
        if group_id is not None and not GROUP_ID.match(group_id):
            raise ConfigError(
                f"group_id {group_id!r} is not one SQS takes: 1 to 128 letters, digits or "
                "punctuation, no spaces"
            )
        if delay is not None and not 0 <= delay <= MAX_DELAY:
            raise ConfigError(f"delay must be from 0 to {MAX_DELAY} seconds, not {delay}")
        return OutgoingMessage(
            text,
            message_attributes(attributes or {}),
            delay_seconds=delay or 0,
            group_id=group_id,
            deduplication_id=deduplication_id,
        )

    def close(self) -> None:
        with self._lock:
            transport, self._transport = self._transport, None
            payloads, self._payloads = self._payloads, None
        if transport is not None and self._owns_transport:
            transport.close()
        if payloads is not None:
            payloads.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- inside ------------------------------------------------------------------------

    def _offload(self, message: OutgoingMessage, index: int, threshold: int) -> OutgoingMessage:
        if self.payload_bucket is None and (self._payloads is None or not self._payloads.bucket):
            raise ConfigError(
                f"message {index} is {message.size:,} bytes (attributes counted), more than "
                f"the {threshold:,} {self.transport.info.name} takes: give the Producer a "
                "payload_bucket to put such bodies in S3, or send less"
            )
        return self.payloads.offload(message, threshold)

    def _send(
        self,
        messages: list[OutgoingMessage],
        report: SendReport,
        progress: Callable[[int], None],
    ) -> tuple[list[str | None], list[tuple[int, str, str]], set[int]]:
        """Send ``messages``; each one's id (None if not sent), what failed for good, and
        which of those SQS may have taken (a try of theirs went unanswered)."""
        ids: list[str | None] = [None] * len(messages)
        failed: dict[int, tuple[str, str]] = {}
        unconfirmed: set[int] = set()  # a try went unanswered: maybe sent, until confirmed
        todo = list(range(len(messages)))
        refused = False
        for attempt in range(ATTEMPTS):
            if attempt:
                time.sleep(RETRY_AFTER * 2 ** (attempt - 1))
            again: list[int] = []
            for batch in send_batches(todo, lambda i: messages[i].size):
                report.requests += 1
                try:
                    result = self.transport.send_batch([messages[i] for i in batch])
                except TransportError as exc:  # the whole call, after the transport's retries
                    if exc.retryable:
                        for index in batch:
                            failed[index] = (exc.code or "RequestFailed", str(exc))
                        if not exc.unapplied:  # a timeout, a reset, a 5xx: maybe taken
                            unconfirmed.update(batch)
                        again += batch
                        continue
                    # Refused (AccessDenied, a deleted queue): so would every other call be.
                    for index in (i for i in todo if ids[i] is None):
                        failed[index] = (exc.code or "RequestFailed", str(exc))
                    if not exc.unapplied:  # an earlier try of this call may have reached SQS
                        unconfirmed.update(batch)
                    refused = True
                    break
                for entry, message_id in result.message_ids.items():
                    ids[batch[int(entry)]] = message_id
                    failed.pop(batch[int(entry)], None)
                    unconfirmed.discard(batch[int(entry)])
                for failure in result.failed:
                    index = batch[int(failure.id)]
                    failed[index] = (failure.code, failure.message)
                    if failure.code == UNANSWERED:
                        unconfirmed.add(index)
                    if failure.code not in REFUSED and not failure.sender_fault:
                        again.append(index)
                progress(len(result.message_ids))
            if refused or not again:
                break
            todo = again
        failures = [(i, code, text) for i, (code, text) in sorted(failed.items())]
        return ids, failures, unconfirmed & failed.keys()


class AsyncProducer:
    """``Producer`` for ``async def`` code: each call runs on a thread of its own, so the
    event loop never waits on SQS or S3."""

    def __init__(self, queue: str, **options: Any) -> None:
        self.sync = Producer(queue, **options)

    async def send(self, body: object, **options: Any) -> str:
        return await asyncio.to_thread(self.sync.send, body, **options)

    async def send_many(self, bodies: Iterable[object], **options: Any) -> SendReport:
        return await asyncio.to_thread(self.sync.send_many, list(bodies), **options)

    async def close(self) -> None:
        await asyncio.to_thread(self.sync.close)

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def encode(body: object) -> str:
    """A body as the text SQS carries: text as it is; a dict, list, pydantic model or
    dataclass as JSON."""
    if isinstance(body, str):
        return body
    if isinstance(body, bytes):
        raise ConfigError("a body must be text: decode the bytes, or base64-encode binary data")
    dump = getattr(body, "model_dump_json", None)  # a pydantic model (v2)
    if callable(dump):
        return str(dump())
    if dataclasses.is_dataclass(body) and not isinstance(body, type):
        body = dataclasses.asdict(body)
    try:
        return json.dumps(body)
    except TypeError as exc:
        raise ConfigError(
            f"a body must be text, a dict or list, a pydantic model or a dataclass: {exc}"
        ) from None


def message_attributes(attributes: Mapping[str, object]) -> dict[str, dict[str, Any]]:
    """Attributes in SQS's shape: a str is a String, an int or float a Number, bytes
    Binary; a mapping already in SQS's shape (``{"DataType": ..., ...}``) is kept."""
    shaped: dict[str, dict[str, Any]] = {}
    for name, value in attributes.items():
        if isinstance(value, Mapping) and "DataType" in value:
            shaped[name] = dict(value)
        elif isinstance(value, bool):
            raise ConfigError(f"attribute {name!r}: SQS has no boolean type; send a string")
        elif isinstance(value, int | float):
            shaped[name] = {"DataType": "Number", "StringValue": str(value)}
        elif isinstance(value, bytes):
            shaped[name] = {"DataType": "Binary", "BinaryValue": value}
        elif isinstance(value, str):
            shaped[name] = {"DataType": "String", "StringValue": value}
        else:
            raise ConfigError(
                f"attribute {name!r} is a {type(value).__name__}: give a str, a number or bytes"
            )
    if len(shaped) > 10:
        raise ConfigError(f"{len(shaped)} message attributes were given; SQS takes at most 10")
    return shaped
