"""What SQS's answers mean: the messages a receive returned, the entries a batch call
settled, and an answer in no shape SQS gives (a proxy's, a stub's), told apart from one
that is. Shared by the transport's calls on threads and on an event loop."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import TransportError
from . import UNANSWERED, BatchResult, EntryFailure, Envelope


def error_code(raw: object) -> str:
    """SQS's error code without the "AWS.SimpleQueueService." prefix some endpoints add."""
    return str(raw or "").removeprefix("AWS.SimpleQueueService.")


def envelopes(response: Mapping[str, Any]) -> list[Envelope]:
    """The messages of a ReceiveMessage answer."""
    messages = response.get("Messages", [])
    if not isinstance(messages, list) or not all(map(_a_message, messages)):
        # What it returned stays hidden for the visibility timeout, then comes back.
        raise unreadable("ReceiveMessage", f"Messages: {messages!r}")
    # A message named again in one answer (SQS never does so) counts once, as a batch
    # entry does: its first naming.
    named: dict[str, Any] = {}
    for m in messages:
        named.setdefault(m["ReceiptHandle"], m)
    return [
        Envelope(
            message_id=m["MessageId"],
            receipt_handle=m["ReceiptHandle"],
            body=m.get("Body", ""),
            attributes=dict(m.get("Attributes", {})),
            message_attributes=dict(m.get("MessageAttributes", {})),
        )
        for m in named.values()
    ]


def _a_message(m: object) -> bool:
    """Whether ``m`` is a message as SQS answers one (the lean client hands on the JSON
    as it came: a null is None there, where botocore leaves the key out)."""
    return (
        isinstance(m, Mapping)
        and isinstance(m.get("MessageId"), str)
        and isinstance(m.get("ReceiptHandle"), str)
        and isinstance(m.get("Body", ""), str)
        and isinstance(m.get("Attributes", {}), Mapping)
        and isinstance(m.get("MessageAttributes", {}), Mapping)
    )


def unreadable(action: str, detail: str) -> TransportError:
    """An answer in no shape SQS gives (a proxy's or a stub's): SQS may have acted or not,
    as when the answer is lost; tried again."""
    return TransportError(
        f"{action} was answered with what SQS never answers ({detail[:200]}): check that "
        "the endpoint is SQS",
        code=UNANSWERED,
        retryable=True,
    )


def batch_result(
    action: str, response: Mapping[str, Any], ids: Sequence[str], sends: bool = False
) -> BatchResult:
    """A batch call's answer, over the entries of ``ids`` alone. One it names neither
    successful nor failed, or both, or (``sends``) successful without a MessageId failed
    (``UNANSWERED``, SQS's fault: tried again), never counted done: botocore reads a 200
    whose body is no JSON (a captive portal, a broken proxy) as an answer naming no entry,
    and a renewal, delete or send taken as done then would be a lease lapsing unseen, a
    message run again, or a message lost. Entries of no id of the call, and an id named
    again, are not read: the callers find each entry by its id. An entry that is no object
    with a text Id (botocore's parser fails on some such) fails the call (``unreadable``)."""
    asked = set(ids)
    succeeded: dict[str, Mapping[str, Any]] = {}
    unsure: dict[str, str] = {}  # id -> why it counts as not answered
    for entry in entries(action, response, "Successful", asked):
        if entry["Id"] in succeeded or entry["Id"] in unsure:
            continue  # named again: its first naming counts
        if sends and not isinstance(entry.get("MessageId"), str):
            unsure[entry["Id"]] = "the answer named it sent without a MessageId"
        else:
            succeeded[entry["Id"]] = entry
    failed: dict[str, EntryFailure] = {}
    for entry in entries(action, response, "Failed", asked):
        failed.setdefault(
            entry["Id"],
            EntryFailure(
                id=entry["Id"],
                code=error_code(entry.get("Code")),
                message=str(entry.get("Message", "")),
                sender_fault=entry.get("SenderFault") is True,
            ),
        )
    for entry_id in failed.keys() & (succeeded.keys() | unsure.keys()):
        succeeded.pop(entry_id, None)  # which one holds is not known
        del failed[entry_id]
        unsure[entry_id] = "the answer named it both successful and failed"
    for entry_id in ids:
        if entry_id not in succeeded and entry_id not in failed:
            unsure.setdefault(entry_id, "the answer named it neither successful nor failed")
    result = BatchResult(succeeded=list(succeeded), failed=list(failed.values()))
    result.failed += [EntryFailure(i, UNANSWERED, why, False) for i, why in unsure.items()]
    if sends:
        result.message_ids = {i: e["MessageId"] for i, e in succeeded.items()}
    return result


def entries(
    action: str, response: Mapping[str, Any], key: str, ids: set[str]
) -> list[Mapping[str, Any]]:
    """The answer's entries under ``key`` that name one of ``ids``."""
    entries = response.get(key, [])
    if not isinstance(entries, list) or not all(
        isinstance(e, Mapping) and isinstance(e.get("Id"), str) for e in entries
    ):
        raise unreadable(action, f"{key}: {entries!r}")
    return [e for e in entries if e["Id"] in ids]
