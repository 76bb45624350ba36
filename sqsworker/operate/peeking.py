"""``sqsworker peek``: receive a few messages and hand each back at once; and why each
message of a dead-letter queue is there (a worker rejected it, or SQS moved it after
its source queue's maxReceiveCount receives)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from ..errors import StartupError
from ..transports import MAX_BATCH, Envelope, QueueInfo
from ..transports.sqs import SQSTransport
from .queues import Queues

PEEK_HOLD = 20  # seconds a peeked message would stay hidden if the hand-back failed


def refuse_peek(info: QueueInfo) -> str | None:
    """Why a peek of ``info``'s queue could do harm (None when it cannot)."""
    if info.dead_letter_arn is None:
        return None
    dlq = info.dead_letter_arn.rsplit(":", 1)[-1]
    return (
        f"a peek is a receive: on {info.name} it adds one to each message's receive count, "
        f"and a message at its maxReceiveCount ({info.max_receive_count}) would move to {dlq}. "
        "Peek the dead-letter queue instead, or pass --force"
    )


def peek(queue: SQSTransport, count: int, *, wait: int = 1) -> list[Envelope]:
    """Receive up to ``count`` messages and hand every one back at once (visible again)."""
    seen: list[Envelope] = []
    try:
        while len(seen) < count:
            got = queue.receive(min(MAX_BATCH, count - len(seen)), wait, PEEK_HOLD)
            if not got:
                break
            seen += got
    finally:
        hand_back(queue, seen)
    return seen


REJECTED_ATTRIBUTE = "sqsworker-error"  # set by a worker on the copy of a rejected message
SOURCE_ARN = "DeadLetterQueueSourceArn"  # set by SQS on a message it moved (not by moto)


def dead_letter_reasons(
    queues: Queues, dlq: SQSTransport, messages: Sequence[Envelope]
) -> dict[str, str]:
    """Why each of ``messages``, received from ``dlq``, is there, by message id: a worker
    rejected it (it carries the error), or SQS moved it from a source queue after that
    queue's maxReceiveCount receives. Empty when ``dlq`` is no queue's dead-letter queue
    and no message says where it came from."""
    sources: dict[str, QueueInfo] = {}  # by ARN
    for url in queues.sources_of(dlq):
        info = queues.sqs.open(url).info
        sources[info.arn] = info
    reasons = {}
    for message in messages:
        if REJECTED_ATTRIBUTE in message.message_attributes:
            reasons[message.message_id] = (
                "a worker rejected it (the handler error below) and sent it here at once"
            )
            continue
        arn = message.attributes.get(SOURCE_ARN)
        if arn and arn not in sources:
            with contextlib.suppress(StartupError):  # deleted since: its name still says
                sources[arn] = queues.sqs.open(arn).info
        from_ = [sources[arn]] if arn in sources else list(sources.values())
        if not from_:
            if arn:
                reasons[message.message_id] = f"SQS moved it from {arn.rsplit(':', 1)[-1]}"
            continue
        received = message.attributes.get("ApproximateReceiveCount", "?")
        if len(from_) == 1:
            where = f"{from_[0].name}, whose maxReceiveCount is {from_[0].max_receive_count}"
        else:
            names = ", ".join(info.name for info in from_)
            limits = ", ".join(str(info.max_receive_count) for info in from_)
            where = f"one of {names} (maxReceiveCount {limits})"
        reasons[message.message_id] = (
            f"SQS moved it from {where}: received {received} times, this peek included"
        )
    return reasons


def hand_back(queue: SQSTransport, messages: Sequence[Envelope]) -> None:
    for first in range(0, len(messages), MAX_BATCH):
        part = messages[first : first + MAX_BATCH]
        queue.change_visibility_batch([(str(i), m.receipt_handle, 0) for i, m in enumerate(part)])
