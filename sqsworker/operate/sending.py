"""The messages ``sqsworker send`` sends: each body with its attributes, group,
deduplication id and delay, checked against what the queue accepts before the first
is sent; and the batches SendMessageBatch takes."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from ..errors import ConfigError, TransportError
from ..keys import KEY_ATTRIBUTE
from ..payloads import check_offloadable
from ..transports import GROUP_ID, OutgoingMessage, QueueInfo, send_batches
from ..transports.sqs import SQSTransport

MAX_DELAY = 900


@dataclass
class SendReport:
    sent: int = 0
    failed: list[tuple[int, str, str]] = field(default_factory=list)  # index, code, message


_ATTRIBUTE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,256}")
# The characters SQS accepts in a body or attribute value (the rest are refused).
_REFUSED_CHARACTER = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def parse_attribute(text: str) -> tuple[str, dict[str, str]]:
    """``NAME=VALUE`` (a String) or ``NAME:Number=VALUE`` as an SQS message attribute,
    checked as SQS checks it."""
    name, equals, value = text.partition("=")
    if not equals or not name:
        raise ConfigError(f"the attribute {text!r} has no '=': write it as NAME=VALUE")
    name, _, kind = name.partition(":")
    kind = kind or "String"
    if kind.split(".", 1)[0] not in ("String", "Number"):
        raise ConfigError(
            f"the attribute {text!r} has the type {kind!r}: use String or Number "
            "(NAME=VALUE or NAME:Number=VALUE)"
        )
    if (
        not _ATTRIBUTE_NAME.fullmatch(name)
        or name.startswith(".")
        or name.endswith(".")
        or ".." in name
        or name.lower().startswith(("aws.", "amazon."))
    ):
        raise ConfigError(
            f"the attribute name {name!r} is not one SQS accepts: use letters, digits, "
            "'_', '-' and '.' (not first, last or doubled), not starting with AWS. or Amazon."
        )
    if not value:
        raise ConfigError(f"the attribute {name!r} has no value: SQS refuses an empty one")
    if kind.startswith("Number"):
        try:
            float(value)
        except ValueError:
            raise ConfigError(f"the attribute {name!r} is a Number, but {value!r} is not") from None
    return name, {"DataType": kind, "StringValue": value}


def outgoing(
    info: QueueInfo,
    bodies: Iterable[str],
    *,
    attributes: Sequence[str] = (),
    group_id: str | None = None,
    dedup_id: str | None = None,
    delay: int = 0,
    idempotency_key: str | None = None,
    offload_over: int | None = None,
) -> list[OutgoingMessage]:
    """The messages to send, every one checked against what ``info``'s queue accepts.

    ``offload_over``: messages larger than this many bytes will have their body put in
    S3 (``Payloads.offload``), so they may be larger than the queue takes.
    """
    message_attributes = dict(parse_attribute(a) for a in attributes)
    if idempotency_key is not None:
        message_attributes[KEY_ATTRIBUTE] = {"DataType": "String", "StringValue": idempotency_key}
    if len(message_attributes) > 10:
        raise ConfigError(
            f"{len(message_attributes)} message attributes were given; SQS takes at most 10"
        )
    if group_id is not None and not GROUP_ID.match(group_id):
        raise ConfigError(
            f"--group-id {group_id!r} is not one SQS takes: 1 to 128 letters, digits or "
            "punctuation, no spaces"
        )
    if info.fifo:
        if group_id is None:
            raise ConfigError(
                f"{info.name} is a FIFO queue: pass --group-id (the message group, e.g. an "
                "order or customer id)"
            )
        if dedup_id is None and not info.content_deduplication:
            raise ConfigError(
                f"{info.name} is a FIFO queue without content-based deduplication: pass "
                "--dedup-id, or enable ContentBasedDeduplication on the queue"
            )
        if delay:
            raise ConfigError(
                f"{info.name} is a FIFO queue, which has no per-message delay: drop --delay "
                "(or set the queue's DelaySeconds)"
            )
    elif dedup_id is not None:
        raise ConfigError(f"{info.name} is a standard queue: --dedup-id is for FIFO queues")
    if not 0 <= delay <= MAX_DELAY:
        raise ConfigError(f"--delay {delay} is out of range: SQS delays 0 to 900 seconds")
    messages = [
        OutgoingMessage(
            body,
            message_attributes=message_attributes,
            delay_seconds=delay,
            group_id=group_id,
            deduplication_id=dedup_id,
        )
        for body in bodies
    ]
    if dedup_id is not None and len(messages) > 1:
        raise ConfigError(
            f"--dedup-id names one message, and {len(messages)} were given: SQS would keep "
            "the first and drop the rest as duplicates; send them one at a time"
        )
    for index, message in enumerate(messages, 1):
        _check(index, message, info, offload_over)
    return messages


def _check(
    index: int, message: OutgoingMessage, info: QueueInfo, offload_over: int | None = None
) -> None:
    if not message.body:
        raise ConfigError(f"message {index} is empty: SQS does not accept an empty body")
    for text in [
        message.body,
        *(str(v.get("StringValue", "")) for v in message.message_attributes.values()),
    ]:
        refused = _REFUSED_CHARACTER.search(text)
        if refused:
            raise ConfigError(
                f"message {index} holds a character SQS refuses (U+{ord(refused[0]):04X} at "
                f"position {refused.start() + 1}): SQS takes Unicode text without control "
                "characters other than tab and line breaks"
            )
    size = message.size
    if offload_over is not None and size > offload_over:
        try:
            check_offloadable(message)
        except ConfigError as exc:
            raise ConfigError(f"message {index} cannot be offloaded to S3: {exc}") from None
    elif size > info.maximum_message_size:
        raise ConfigError(
            f"message {index} is {size:,} bytes with its attributes; {info.name} takes at "
            f"most {info.maximum_message_size:,}: send a smaller body, or put bodies this "
            "large in S3 with --payload-bucket BUCKET"
        )


def batches(messages: Sequence[OutgoingMessage]) -> Iterator[list[OutgoingMessage]]:
    """Batches of at most 10 messages and 1 MiB in all, in order."""
    return send_batches(messages, lambda message: message.size)


def send(
    queue: SQSTransport,
    messages: Sequence[OutgoingMessage],
    progress: Callable[[int], None] = lambda sent: None,
) -> SendReport:
    """Send ``messages`` in batches; every entry SQS refused is reported by its index."""
    report = SendReport()
    first = 0
    for batch in batches(messages):
        try:
            result = queue.send_batch(batch)
        except TransportError as exc:
            if not report.sent:
                raise
            raise TransportError(
                f"{exc}; {report.sent} of {len(messages)} messages were sent before it "
                f"(messages 1 to {first}; message {first + 1} and on were not)",
                code=exc.code,
            ) from exc
        report.sent += len(result.succeeded)
        for failure in result.failed:
            report.failed.append((first + int(failure.id) + 1, failure.code, failure.message))
        first += len(batch)
        progress(len(batch))
    return report
