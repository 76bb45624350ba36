"""The copy of a rejected message that goes to the dead-letter queue, made to fit.

SQS counts a message's attributes against its size limit, and refuses some characters in
attribute values: the worker's notes (the error, the source message's id) are cut or
left out so that the copy always fits the dead-letter queue. A copy SQS refuses for its
content is never tried again by running the handler again: ``RecentIds`` remembers the
message, returned unrun until SQS's own redrive moves it.
"""

from __future__ import annotations

import re
import threading
from typing import TYPE_CHECKING

from .transports import OutgoingMessage, QueueInfo

if TYPE_CHECKING:
    from .message import Message

MAX_ATTRIBUTES = 10  # SQS's limit of message attributes per message


def dead_letter_copy(
    message: Message, exc: BaseException, info: QueueInfo
) -> tuple[OutgoingMessage | None, list[str]]:
    """The copy ``Reject`` sends, and the names of the notes it had to leave out or cut.

    The group id kept (a FIFO queue's, or a fair queue's tenant), a deduplication id only
    where SQS takes one, on a FIFO queue. SQS counts attributes against the size limit, so
    the notes are cut, then left out, to fit the dead-letter queue's limit; None when even
    the message as it came does not fit there.
    """
    fifo = info.fifo
    bare = OutgoingMessage(
        body=message.sent_body,  # an offloaded body's pointer, with its size attribute
        message_attributes=dict(message.raw_message_attributes),
        group_id=message.group_id,
        deduplication_id=message.message_id if fifo else None,
    )
    room = info.maximum_message_size - bare.size
    if room < 0:
        return None, []
    source = ("sqsworker-source-message-id", message.message_id)
    notes = [("sqsworker-error", attribute_text(f"{type(exc).__name__}: {exc}")[:1024]), source]
    attributes = dict(bare.message_attributes)
    changed = []
    for name, text in notes:
        fits = room - _cost(name, "")
        if name != source[0] and len(attributes) + 2 <= MAX_ATTRIBUTES:
            fits -= _cost(*source)  # the error is cut before the short source id is left out
        if len(attributes) >= MAX_ATTRIBUTES or fits <= 0:
            changed.append(name)
            continue
        if len(text.encode()) > fits:
            text = text.encode()[:fits].decode(errors="ignore")
            changed.append(name)
        attributes[name] = {"DataType": "String", "StringValue": text}
        room -= _cost(name, text)
    return OutgoingMessage(
        bare.body, attributes, group_id=bare.group_id, deduplication_id=bare.deduplication_id
    ), changed


def _cost(name: str, value: str) -> int:
    """The bytes a String attribute adds to a message's size, as SQS counts them."""
    return len(name.encode()) + len("String") + len(value.encode())


def attribute_text(text: str) -> str:
    """``text`` with the characters SQS refuses in an attribute value replaced (it takes
    tab, newline, carriage return, and #x20 to #xD7FF, #xE000 to #xFFFD, #x10000 up)."""
    return _REFUSED.sub("\ufffd", text)


_REFUSED = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
# Codes of a send SQS refused for the message itself: sending it again cannot succeed.
REFUSED_CONTENT = frozenset(
    {
        "InvalidParameterValue",
        "InvalidMessageContents",
        "MessageTooLong",
        "InvalidAttributeValue",
        "InvalidAttributeName",
        "BatchRequestTooLong",
    }
)


class RecentIds:
    """A set of the latest ``size`` ids added, safe between threads."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._ids: dict[str, None] = {}
        self._lock = threading.Lock()

    def add(self, item: str) -> None:
        with self._lock:
            self._ids[item] = None
            if len(self._ids) > self.size:
                del self._ids[next(iter(self._ids))]

    def __contains__(self, item: object) -> bool:
        return item in self._ids
