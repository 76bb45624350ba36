"""The commands on messages: ``send``, ``peek``, ``redrive`` and ``purge``, as the
terminal shows them (a progress bar for large jobs); what they do to SQS is in
``operate/``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .. import operate
from ..config import BUCKET_NAME
from ..errors import ConfigError
from ..exits import EXIT_USAGE, Signals, fail
from ..operate import Queues
from ..producer import Producer, SendError
from ..transports import Envelope, QueueInfo

PROGRESS_FROM = 100  # messages: fewer are sent or moved without a progress bar
BODY_SHOWN = 300  # characters of a body that peek shows
TASK_POLL = 1.0  # seconds between looks at SQS's message move task


def _messages(count: int) -> str:
    return f"{count} message" if count == 1 else f"{count} messages"


# -- send ---------------------------------------------------------------------------------

SHOWN_FAILURES = 10  # messages not sent named one a line; the rest counted


def send(queues: Queues, args: argparse.Namespace, console: Console) -> int:
    """``sqsworker send``: check every message, then send them (bodies over the threshold
    to S3); exit 1 if some were not sent."""
    queue = queues.open(args.queue)
    threshold = _payload_threshold(args, queue.info)
    messages = operate.outgoing(
        queue.info,
        _bodies(args),
        attributes=args.attribute,
        group_id=args.group_id,
        dedup_id=args.dedup_id,
        delay=args.delay,
        idempotency_key=args.idempotency_key,
        offload_over=threshold,
    )
    if not messages:
        raise ConfigError("there was no message to send: the input had no bodies")
    if args.idempotency_key is not None and len(messages) > 1:
        console.print(
            f"note: the {len(messages)} messages share the idempotency key "
            f"{args.idempotency_key!r}: a worker with an idempotency store runs one of them"
        )
    producer = Producer(
        queue.info.name,
        transport=queue,
        payload_bucket=args.payload_bucket,
        payload_threshold=threshold,
        region=args.region,
    )
    failed: list[tuple[int, str, str]] = []
    unconfirmed: frozenset[int] = frozenset()  # of those failed, the ones SQS may have taken
    try:
        with _progress(console, "sending", len(messages)) as advance:
            report = producer.deliver(messages, advance)
        sent, offloaded = report.sent, report.offloaded
    except SendError as exc:
        failed, unconfirmed = exc.failed, exc.unconfirmed
        sent = sum(i is not None for i in exc.message_ids)
        offloaded = 0
    finally:
        producer.close()
    if offloaded:
        console.print(f"put {offloaded} of {len(messages)} bodies in s3://{args.payload_bucket}")
    for index, code, text in failed[:SHOWN_FAILURES]:
        # SQS did not say either way: it may be in the queue, and sending it again may copy it
        verdict = "may not have been sent" if index in unconfirmed else "was not sent"
        console.print(f"message {index + 1} {verdict}: {code}: {text}")
    if len(failed) > SHOWN_FAILURES:
        console.print(f"... and {len(failed) - SHOWN_FAILURES} more")
    console.print(f"sent {_messages(sent)} to {queue.info.name}", end="")
    told = []
    if len(failed) > len(unconfirmed):
        told.append(f"{len(failed) - len(unconfirmed)} not sent")
    if unconfirmed:
        told.append(f"{len(unconfirmed)} maybe sent")
    console.print("; " + ", ".join(told) if told else "")
    return 1 if failed else 0


def _payload_threshold(args: argparse.Namespace, info: QueueInfo) -> int | None:
    """Bytes over which a message's body goes to S3; None when no bucket was given."""
    if args.payload_bucket is None:
        if args.payload_threshold is not None:
            raise ConfigError("--payload-threshold needs --payload-bucket: where to put bodies")
        return None
    if not BUCKET_NAME.match(args.payload_bucket):
        raise ConfigError(
            f"--payload-bucket {args.payload_bucket!r} is not an S3 bucket name: 3-63 "
            "lowercase letters, digits, dots and hyphens"
        )
    threshold: int | None = args.payload_threshold
    if threshold is None:
        return info.maximum_message_size
    if not 0 <= threshold <= info.maximum_message_size:
        raise ConfigError(
            f"--payload-threshold {threshold} is out of range: from 0 (every body to S3) to "
            f"{info.maximum_message_size:,}, the most {info.name} takes"
        )
    return threshold


def _bodies(args: argparse.Namespace) -> list[str]:
    if args.bodies and args.file:
        raise ConfigError("give message bodies as arguments or with --file, not both")
    if args.bodies:
        return list(args.bodies)
    if args.file:
        return _json_lines(args.file)
    if sys.stdin.isatty():
        raise ConfigError(
            "there is no message to send: give bodies as arguments, a JSON-lines file with "
            "--file, or lines on standard input"
        )
    try:
        lines = [line.rstrip("\r\n") for line in sys.stdin if line.strip()]
        for line in lines:
            line.encode()  # undecodable bytes arrive as lone surrogates
    except UnicodeError:
        raise ConfigError("standard input is not UTF-8 text: send UTF-8 message bodies") from None
    return lines


def _json_lines(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as file:
            lines = file.readlines()
    except OSError as exc:
        raise ConfigError(f"cannot read --file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"--file {path} is not UTF-8 text: give a JSON-lines file") from None
    bodies = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"line {number} of {path} is not JSON ({exc.msg}): each line of --file is "
                "one JSON message body"
            ) from None
        bodies.append(line.strip())
    return bodies


@contextmanager
def _progress(console: Console, what: str, total: int | None) -> Iterator[Callable[[int], None]]:
    """A progress bar on a terminal for large jobs; otherwise nothing."""
    if not console.is_terminal or (total is not None and total < PROGRESS_FROM):
        yield lambda done: None
        return
    columns = (TextColumn(what), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task(what, total=total)
        yield lambda done: progress.advance(task, done)


# -- peek ---------------------------------------------------------------------------------


def peek(queues: Queues, args: argparse.Namespace, console: Console) -> int:
    """``sqsworker peek``: show up to -n messages, each visible again at once, and why
    each of a dead-letter queue is there."""
    if not 1 <= args.n <= 100:
        raise ConfigError(f"-n {args.n} is out of range: peek shows 1 to 100 messages")
    queue = queues.open(args.queue)
    refusal = operate.refuse_peek(queue.info)
    if refusal and not args.force:
        raise ConfigError(refusal)
    messages = operate.peek(queue, args.n)
    reasons = operate.dead_letter_reasons(queues, queue, messages)
    if args.json:
        shown = [{**_as_dict(m), **_reason(reasons, m)} for m in messages]
        print(json.dumps(shown, indent=2))
        return 0
    if not messages:
        console.print(f"no message of {queue.info.name} was visible to receive")
        return 0
    console.print(
        f"{_messages(len(messages))} of {queue.info.name}, "
        "each visible again now. A peek is a receive: each receive count went up by one."
    )
    for envelope in messages:
        console.print()
        rows = _shown(envelope, reasons.get(envelope.message_id))
        width = max(len(name) for name, _ in rows)
        for name, value in rows:
            console.print(f"{name:<{width}}  {value}")
    return 0


def _reason(reasons: dict[str, str], envelope: Envelope) -> dict[str, str]:
    reason = reasons.get(envelope.message_id)
    return {"dead_letter_reason": reason} if reason else {}


def _shown(envelope: Envelope, reason: str | None = None) -> list[tuple[str, str]]:
    attributes = envelope.attributes
    rows = [
        ("message id", envelope.message_id),
        ("receive count", attributes.get("ApproximateReceiveCount", "?")),
        ("sent", _when(attributes.get("SentTimestamp"))),
    ]
    if reason:
        rows.append(("why here", reason))
    if "MessageGroupId" in attributes:
        rows.append(("group", attributes["MessageGroupId"]))
    for name, value in envelope.message_attributes.items():
        shown = value.get("StringValue", f"<{len(value.get('BinaryValue', b''))} bytes>")
        label = {
            "sqsworker-error": "handler error",
            "sqsworker-source-message-id": "source message id",
        }.get(name, f"attribute {name}")
        rows.append((label, str(shown)))
    body = envelope.body
    if len(body) > BODY_SHOWN:
        body = body[:BODY_SHOWN] + f"... ({len(body):,} characters)"
    rows.append(("body", body))
    return rows


def _when(millis: str | None) -> str:
    try:
        return datetime.fromtimestamp(int(millis or "") / 1000, UTC).strftime(
            "%Y-%m-%d %H:%M:%S UTC"
        )
    except (ValueError, OverflowError, OSError):  # left out, or not a time
        return "?"


def _as_dict(envelope: Envelope) -> dict[str, Any]:
    return {
        "message_id": envelope.message_id,
        "body": envelope.body,
        "attributes": dict(envelope.attributes),
        "message_attributes": {
            name: {k: v for k, v in value.items() if k != "BinaryValue"}
            for name, value in envelope.message_attributes.items()
        },
    }


# -- redrive ------------------------------------------------------------------------------


def redrive(queues: Queues, args: argparse.Namespace, console: Console) -> int:
    """``sqsworker redrive``: move a dead-letter queue's messages back, by SQS's move
    task (followed to its end) or here with a progress bar; Ctrl-C stops either."""
    dlq = queues.open(args.dlq)
    to = queues.open(args.to) if args.to else None
    redrive = operate.Redrive(queues, dlq, to, rate=args.rate)
    pending = redrive.pending()
    where = f"from {dlq.info.name} to {redrive.destination_name}"
    if args.dry_run:
        console.print(f"would move about {_messages(pending)} {where} (nothing was moved)")
        return 0
    signals = Signals()
    signals.install()
    handle = None if args.client_side else redrive.start()
    if handle is not None:
        return _watch_task(redrive, handle, where, signals, console)
    redrive.check_here()
    if not args.client_side:
        console.print(
            "this endpoint has no message move task (StartMessageMoveTask): moving the "
            "messages here instead"
        )
    with _progress(console, "moving", pending if pending >= PROGRESS_FROM else None) as step:
        report = redrive.move_here(step, signals.received.is_set, limit=pending)
    console.print(f"moved {_messages(report.moved)} {where}", end="")
    if report.status == "CANCELLED":
        console.print("; stopped by Ctrl-C (the rest are still in the DLQ)")
    elif report.failed or report.in_both:
        console.print(
            f"; stopped: {report.failed} could not be sent and stay in the DLQ, "
            f"{report.in_both} were sent but could not be deleted and are in both queues"
        )
    else:
        console.print()
    if report.error:
        fail(report.error)
    left = redrive.pending() if report.status == "COMPLETED" else 0
    if left:
        console.print(
            f"about {_messages(left)} still in {dlq.info.name} (they arrived during the move, "
            "or SQS's count was behind): run redrive again to move them"
        )
    return 0 if report.status == "COMPLETED" else 1


def _watch_task(
    redrive: operate.Redrive,
    handle: str,
    where: str,
    signals: Signals,
    console: Console,
) -> int:
    """Follow SQS's move task to its end; Ctrl-C cancels it."""
    task: dict[str, Any] = {}
    with _progress(console, "moving", None) as advance:
        shown = 0
        while True:
            task = redrive.task(handle)
            moved = int(task.get("ApproximateNumberOfMessagesMoved", 0))
            advance(moved - shown)
            shown = moved
            if task.get("Status") != "RUNNING":
                break
            if signals.received.is_set():
                moved = redrive.cancel(handle)
                console.print(f"cancelled the move task after about {_messages(moved)} {where}")
                return 1
            signals.received.wait(TASK_POLL)
    status = task.get("Status", "UNKNOWN")
    moved = int(task.get("ApproximateNumberOfMessagesMoved", 0))
    if status == "COMPLETED":
        console.print(f"SQS moved about {_messages(moved)} {where}")
        return 0
    reason = task.get("FailureReason", "")
    console.print(f"the move task ended {status} after about {_messages(moved)} {where}: {reason}")
    return 1


# -- purge --------------------------------------------------------------------------------


def purge(queues: Queues, args: argparse.Namespace, console: Console) -> int:
    """``sqsworker purge``: delete every message of a queue, once the user typed its name
    (or passed --yes)."""
    queue = queues.open(args.queue)
    counts = queue.counts()
    if not args.yes:
        if not sys.stdin.isatty():
            raise ConfigError(
                f"purge deletes every message of {queue.info.name}: confirm with --yes"
            )
        try:
            answer = console.input(
                f"Delete every message of {queue.info.name} (about {counts.total}), for "
                "good? Type the queue's name to confirm: "
            )
        except (EOFError, KeyboardInterrupt):
            answer = ""
        if answer.strip() != queue.info.name:
            console.print("nothing was purged")
            return EXIT_USAGE
    queues.purge(queue)
    console.print(
        f"purged {queue.info.name} (about {_messages(counts.total)}); SQS takes up to 60 s to "
        "finish, and allows the next purge of this queue after 60 s"
    )
    return 0
