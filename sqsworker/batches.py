"""What a batch handler reports, and each message's outcome from it.

A batch handler returns ``None`` (every message succeeded) or a ``BatchResult`` naming
the messages that failed; raising ``BatchFailure`` says the same. Any other exception
fails the whole batch: each message takes that exception's path (``Retry``, ``Reject``,
or the backoff). A failed message is named by the ``Message`` itself or its id; with an
exception of its own it takes that exception's path, else it is retried after the
backoff. A report that names a message not in the batch fails the whole batch: the
handler's idea of what it did is not to be trusted then.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .message import Message

# Messages (or their ids), or each mapped to the exception it failed with.
Failed = Iterable[Any] | Mapping[Any, BaseException | None]


class BatchReportError(Exception):
    """A batch handler's report that cannot be trusted (of the wrong type, or naming a
    message not in the batch): the whole batch fails, and is retried after the backoff
    whatever ``--non-retryable`` says, as Lambda retries such a batch."""


class BatchItemFailed(Exception):
    """A message its batch handler reported failed without saying why: retried after the
    backoff, like any other failure."""


class BatchResult:
    """The messages of a batch that failed; the others succeeded (and are deleted).

    ``failed`` holds messages or message ids, or maps each to the exception it failed
    with (``Reject`` to dead-letter it now, ``Retry`` to retry it after a delay, ``None``
    or any other exception for the backoff)."""

    def __init__(self, failed: Failed = ()) -> None:
        self.failed: dict[str, BaseException | None] = {}
        items = failed.items() if isinstance(failed, Mapping) else ((f, None) for f in failed)
        for item, error in items:
            self.failed[_id_of(item)] = error

    def __repr__(self) -> str:
        return f"BatchResult(failed={sorted(self.failed)})"


class BatchFailure(Exception):
    """Raise from a batch handler to say which of its messages failed, as returning a
    ``BatchResult(failed)`` would; the others succeeded."""

    def __init__(self, failed: Failed, reason: str = "") -> None:
        self.result = BatchResult(failed)
        super().__init__(reason or f"{len(self.result.failed)} message(s) of the batch failed")


def outcomes(
    messages: Sequence[Message], returned: object, raised: BaseException | None
) -> list[BaseException | None]:
    """Each message's outcome, in order: None for success, else what it failed with."""
    if raised is not None and not isinstance(raised, BatchFailure):
        return [raised] * len(messages)
    result = raised.result if isinstance(raised, BatchFailure) else returned
    if result is None:
        return [None] * len(messages)
    wrong: Exception
    if not isinstance(result, BatchResult):
        wrong = BatchReportError(
            f"the batch handler returned {type(result).__name__}, not None or a "
            "sqsworker.BatchResult: the whole batch fails"
        )
        return [wrong] * len(messages)
    ids = {m.message_id for m in messages}
    unknown = sorted(set(result.failed) - ids)
    if unknown:
        wrong = BatchReportError(
            f"the batch handler reported {', '.join(map(repr, unknown[:3]))} failed, which "
            "is not a message of its batch: the whole batch fails"
        )
        return [wrong] * len(messages)
    reported = BatchItemFailed("reported failed by its batch handler")
    return [
        (result.failed[m.message_id] or reported) if m.message_id in result.failed else None
        for m in messages
    ]


def _id_of(item: object) -> str:
    message_id = getattr(item, "message_id", item)
    if not isinstance(message_id, str) or not message_id:
        raise TypeError(f"a failed message is a sqsworker.Message or its id, not {item!r}")
    return message_id
