"""The commands that operate queues: ``queues``, ``send``, ``peek``, ``redrive``, ``purge``.

Argument parsing and the terminal live here (rich's tables and progress bars; plain
columns and no bars when stdout is not a terminal); what each command does to SQS is
in ``operate.py``. Exit codes as for ``run``: 0 done, 1 SQS or the endpoint failed
(or some messages were not sent or moved), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from rich import box
from rich.console import Console
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from . import operate
from .cli import EXIT_FORCED, EXIT_STARTUP, EXIT_USAGE, Signals, fail
from .config import BUCKET_NAME
from .errors import ConfigError, PayloadUnavailable, StartupError, TransportError
from .operate import Queues, QueueStatus
from .producer import Producer, SendError
from .transports import Envelope, QueueInfo

PROGRESS_FROM = 100  # messages: fewer are sent or moved without a progress bar
BODY_SHOWN = 300  # characters of a body that peek shows
TASK_POLL = 1.0  # seconds between looks at SQS's message move task


def add_commands(commands: Any) -> None:
    """Add the queue commands to ``sqsworker``'s subcommand parser."""

    def command(name: str, help: str, description: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = commands.add_parser(
            name, help=help, description=description
        )
        parser.add_argument("--region", default=None, help="AWS region (default: boto3's)")
        parser.add_argument(
            "--endpoint-url",
            default=None,
            help="SQS endpoint (default: boto3's, e.g. from AWS_ENDPOINT_URL_SQS)",
        )
        return parser

    queues = command(
        "queues",
        "list queues: depth, in flight, dead-letter queue (queues create NAME makes one)",
        "List the queues whose name starts with PREFIX: messages visible, in flight and "
        "delayed, the dead-letter queue and its depth, maxReceiveCount, visibility timeout. "
        "SQS's counts are approximate.",
    )
    queues.epilog = (
        "sqsworker queues create NAME [--fifo] [--dead-letter-queue NAME [--max-receives N]] "
        "[--visibility-timeout S] creates a queue (sqsworker queues create --help)."
    )
    queues.add_argument("prefix", nargs="?", default="", metavar="PREFIX")
    queues.add_argument("--json", action="store_true", help="one JSON object per queue")
    queues.add_argument(
        "--watch",
        nargs="?",
        type=float,
        const=2.0,
        default=None,
        metavar="SECONDS",
        help="refresh every SECONDS (default 2) until Ctrl-C",
    )

    send = command(
        "send",
        "send messages",
        "Send messages to QUEUE: each BODY argument, else each line of --file (JSON lines: "
        "one JSON body per line), else each line of standard input. Sent 10 per request. "
        "Every message is checked before the first is sent.",
    )
    send.add_argument("queue", metavar="QUEUE", help="name, URL or ARN")
    send.add_argument("bodies", nargs="*", metavar="BODY")
    send.add_argument("--file", default=None, help="a JSON-lines file: one message body a line")
    send.add_argument(
        "--attribute",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a message attribute (repeat; NAME:Number=VALUE for a number)",
    )
    send.add_argument(
        "--group-id",
        default=None,
        help="the message group: required on a FIFO queue; a fair queue's tenant on a standard one",
    )
    send.add_argument("--dedup-id", default=None, help="FIFO: the deduplication id")
    send.add_argument("--delay", type=int, default=0, help="seconds before delivery (0-900)")
    send.add_argument("--idempotency-key", default=None, help="set the idempotency-key attribute")
    send.add_argument(
        "--payload-bucket",
        default=os.environ.get("SQSWORKER_PAYLOAD_BUCKET") or None,
        metavar="BUCKET",
        help="put bodies over --payload-threshold in this S3 bucket and send a pointer, as "
        "AWS's extended clients do (default: $SQSWORKER_PAYLOAD_BUCKET)",
    )
    send.add_argument(
        "--payload-threshold",
        type=int,
        default=None,
        metavar="BYTES",
        help="offload messages larger than this, attributes counted (default: the queue's "
        "MaximumMessageSize; 262144 is the extended clients' own)",
    )

    peek = command(
        "peek",
        "show messages, and hand them back at once",
        "Show up to N messages of QUEUE and make each visible again at once. A peek is a "
        "receive: it adds one to each message's receive count and hides it for a moment. "
        "On a queue with a dead-letter queue it is refused unless --force.",
    )
    peek.add_argument("queue", metavar="QUEUE", help="name, URL or ARN")
    peek.add_argument("-n", type=int, default=10, help="how many messages at most [10]")
    peek.add_argument("--force", action="store_true", help="peek a queue that has a DLQ")
    peek.add_argument("--json", action="store_true", help="the messages as JSON")

    redrive = command(
        "redrive",
        "move a dead-letter queue's messages back",
        "Move the messages of the dead-letter queue DLQ back to the queue they came from "
        "(or --to QUEUE), by SQS's own message move task where the endpoint has it, else "
        "here: receive, send, then delete only what was sent (a crash in between can leave "
        "a copy in both queues). Ctrl-C stops the move.",
    )
    redrive.add_argument("dlq", metavar="DLQ", help="the dead-letter queue: name, URL or ARN")
    redrive.add_argument("--to", default=None, metavar="QUEUE", help="where to move them")
    redrive.add_argument("--rate", type=int, default=None, help="messages per second (1-500)")
    redrive.add_argument("--dry-run", action="store_true", help="count, move nothing")
    redrive.add_argument(
        "--client-side",
        action="store_true",
        help="move the messages here even where SQS could move them",
    )

    purge = command(
        "purge",
        "delete every message of a queue",
        "Delete every message of QUEUE (PurgeQueue). Asks first, unless --yes. SQS allows "
        "one purge per queue every 60 seconds, and takes up to 60 seconds to finish one.",
    )
    purge.add_argument("queue", metavar="QUEUE", help="name, URL or ARN")
    purge.add_argument("--yes", action="store_true", help="do not ask")


def create_parser() -> argparse.ArgumentParser:
    """``sqsworker queues create``'s own parser: ``queues`` takes a PREFIX, so ``create``
    is read before it (``cli.main``)."""
    parser = argparse.ArgumentParser(
        prog="sqsworker queues create",
        description="Create the queue NAME (a FIFO queue with --fifo, its name ending in "
        ".fifo) and, with --dead-letter-queue, that queue too unless it exists, with a "
        "redrive policy: after --max-receives receives SQS moves a message there. A queue "
        "that exists with the same attributes is left as it is.",
    )
    parser.add_argument("name", metavar="NAME", help="e.g. orders, or payments.fifo")
    parser.add_argument("--fifo", action="store_true", help="a FIFO queue (NAME ends in .fifo)")
    parser.add_argument(
        "--dead-letter-queue",
        default=None,
        metavar="NAME",
        help="the dead-letter queue, created unless it exists (e.g. orders-dlq)",
    )
    parser.add_argument(
        "--max-receives",
        type=int,
        default=None,
        metavar="N",
        help=f"receives before a message moves to the dead-letter queue (1-1000) "
        f"[{operate.default_max_receives(False)}; {operate.default_max_receives(True)} on a "
        "FIFO queue: a message handed back behind a failing one of its group uses up "
        "receives, docs/fifo.md]",
    )
    parser.add_argument(
        "--visibility-timeout",
        type=int,
        default=None,
        metavar="S",
        help="the queue's default visibility timeout in seconds (0-43200) [SQS's: 30]",
    )
    parser.add_argument("--region", default=None, help="AWS region (default: boto3's)")
    parser.add_argument(
        "--endpoint-url",
        default=None,
        help="SQS endpoint (default: boto3's, e.g. from AWS_ENDPOINT_URL_SQS)",
    )
    parser.set_defaults(command="queues create")
    return parser


def run_command(args: argparse.Namespace) -> int:
    """Run one queue command; every error is one sentence and an exit code."""
    commands: dict[str, Callable[[Queues, argparse.Namespace, Console], int]] = {
        "queues create": _create,
        "queues": _queues,
        "send": _send,
        "peek": _peek,
        "redrive": _redrive,
        "purge": _purge,
    }
    # No markup: bodies, attributes and SQS's messages are printed as they are.
    console = Console(file=sys.stdout, highlight=False, markup=False, soft_wrap=True)
    if not console.is_terminal:
        console.width = 1000  # a pipe or a file: whole values, never cut to 80 columns
    try:
        queues = Queues.connect(endpoint_url=args.endpoint_url, region=args.region)
        try:
            return commands[args.command](queues, args, console)
        finally:
            queues.close()
    except ConfigError as exc:
        fail(str(exc))
        return EXIT_USAGE
    except (StartupError, TransportError, PayloadUnavailable) as exc:
        fail(str(exc))
        return EXIT_STARTUP
    except KeyboardInterrupt:  # peek hands its messages back before this
        fail("interrupted")
        return EXIT_FORCED


def _messages(count: int) -> str:
    return f"{count} message" if count == 1 else f"{count} messages"


# -- queues -------------------------------------------------------------------------------


def _queues(queues: Queues, args: argparse.Namespace, console: Console) -> int:
    if args.json:
        for row in queues.status(args.prefix):
            print(json.dumps(row.as_dict()))
        return 0
    if args.watch is None:
        _print_table(_status_table(queues.status(args.prefix), console), console)
        console.print(_STATUS_NOTE)
        return 0
    if args.watch <= 0:
        raise ConfigError(f"--watch {args.watch:g} must be a number of seconds above 0")
    signals = Signals()
    signals.install()

    def table() -> Table:
        drawn = _status_table(queues.status(args.prefix), console, fifo_column=False)
        drawn.caption = f"{datetime.now():%H:%M:%S}; every {args.watch:g} s; Ctrl-C stops"
        return drawn

    if not console.is_terminal:  # a pipe or a file: one table after another
        while not signals.received.is_set():
            console.print(table())
            console.file.flush()
            signals.received.wait(args.watch)
        return 0
    with Live(console=console, auto_refresh=False) as live:
        while not signals.received.is_set():
            live.update(table(), refresh=True)
            signals.received.wait(args.watch)
    return 0


_STATUS_NOTE = (
    "Counts are SQS's approximations (a few seconds behind). SQS's API has no age of the "
    "oldest message: CloudWatch's ApproximateAgeOfOldestMessage has it."
)


# Headers of two lines and gaps of two spaces: the table fits 80 columns (a queue's name
# folds on a narrow terminal rather than end in "…": two queues must not look alike).
_NAMES = ("queue", "DLQ")
_COLUMNS = ("queue", "visible", "in\nflight", "delayed", "DLQ", "in\nDLQ", "max\nreceives")
_COLUMNS_AFTER = ("vis.\ntimeout",)


def _status_table(rows: list[QueueStatus], console: Console, fifo_column: bool = True) -> Table:
    """The queues as a table; without ``fifo_column`` (``--watch``), no FIFO column: a FIFO
    queue's name ends in .fifo anyway."""
    table = _table(console)
    for name in (*_COLUMNS, *_COLUMNS_AFTER, *(("FIFO",) if fifo_column else ())):
        if name in _NAMES:
            table.add_column(name, overflow="fold", min_width=10)
        else:
            table.add_column(name, justify="right", no_wrap=True)
    for row in rows:
        table.add_row(
            row.name,
            str(row.visible),
            str(row.in_flight),
            str(row.delayed),
            row.dead_letter_queue or "-",
            "-" if row.dead_letter_visible is None else str(row.dead_letter_visible),
            "-" if row.max_receive_count is None else str(row.max_receive_count),
            f"{row.visibility_timeout} s",
            *(("yes" if row.fifo else "no",) if fifo_column else ()),
        )
    if not rows:
        table.caption = "no queues"
    return table


def _print_table(table: Table, console: Console) -> None:
    """``table``, its lines without trailing spaces where they are read as text (a pipe,
    a file): the two-line headers pad their first line."""
    if console.is_terminal:
        console.print(table)
        return
    with console.capture() as captured:
        console.print(table)
    for line in captured.get().splitlines():
        console.print(line.rstrip())


def _table(console: Console) -> Table:
    """Boxed on a terminal; plain columns for scripts and pipes."""
    if console.is_terminal:
        return Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
    return Table(box=None, show_edge=False, pad_edge=False)


# -- queues create ------------------------------------------------------------------------


def _create(queues: Queues, args: argparse.Namespace, console: Console) -> int:
    made = queues.create(
        args.name,
        fifo=args.fifo,
        dead_letter_queue=args.dead_letter_queue,
        max_receives=args.max_receives,
        visibility_timeout=args.visibility_timeout,
    )
    info = made.queue
    kind = "FIFO queue" if info.fifo else "queue"
    done = "created the" if made.created else "the"
    left = "" if made.created else " exists already, as asked"
    console.print(
        f"{done} {kind} {info.name}{left} (visibility timeout {info.visibility_timeout} s): "
        f"{info.url}"
    )
    if made.dead_letter_queue is not None:
        dlq = made.dead_letter_queue
        console.print(
            f"its dead-letter queue: {dlq.queue.name} ({'created' if dlq.created else 'existed'})"
            f", after {info.max_receive_count} receives"
        )
    return 0


# -- send ---------------------------------------------------------------------------------

SHOWN_FAILURES = 10  # messages not sent named one a line; the rest counted


def _send(queues: Queues, args: argparse.Namespace, console: Console) -> int:
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
    try:
        with _progress(console, "sending", len(messages)) as advance:
            report = producer.deliver(messages, advance)
        sent, offloaded = report.sent, report.offloaded
    except SendError as exc:
        failed = exc.failed
        sent = sum(i is not None for i in exc.message_ids)
        offloaded = 0
    finally:
        producer.close()
    if offloaded:
        console.print(f"put {offloaded} of {len(messages)} bodies in s3://{args.payload_bucket}")
    for index, code, text in failed[:SHOWN_FAILURES]:
        console.print(f"message {index + 1} was not sent: {code}: {text}")
    if len(failed) > SHOWN_FAILURES:
        console.print(f"... and {len(failed) - SHOWN_FAILURES} more not sent")
    console.print(f"sent {_messages(sent)} to {queue.info.name}", end="")
    console.print(f"; {len(failed)} not sent" if failed else "")
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


def _peek(queues: Queues, args: argparse.Namespace, console: Console) -> int:
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


def _redrive(queues: Queues, args: argparse.Namespace, console: Console) -> int:
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


def _purge(queues: Queues, args: argparse.Namespace, console: Console) -> int:
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
