"""The commands that operate queues: ``queues``, ``send``, ``peek``, ``redrive``, ``purge``.

This package is their terminal side: the arguments each takes and the dispatch (here),
the queue tables (``queues.py``: ``queues``, ``queues create``) and the commands on
messages (``messages.py``: ``send``, ``peek``, ``redrive``, ``purge``), drawn with rich's
tables and progress bars (plain columns and no bars when stdout is not a terminal). What
each command does to SQS is in ``operate/``. Exit codes as for ``run`` (``exits.py``):
0 done, 1 SQS or the endpoint failed (or some messages were not sent or moved), 2 bad
usage.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

from rich.console import Console

from .. import operate
from ..errors import ConfigError, PayloadUnavailable, StartupError, TransportError
from ..exits import EXIT_FORCED, EXIT_STARTUP, EXIT_USAGE, fail
from ..operate import Queues
from . import messages, queues


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
        "queues create": queues.create,
        "queues": queues.show,
        "send": messages.send,
        "peek": messages.peek,
        "redrive": messages.redrive,
        "purge": messages.purge,
    }
    # No markup: bodies, attributes and SQS's messages are printed as they are.
    console = Console(file=sys.stdout, highlight=False, markup=False, soft_wrap=True)
    if not console.is_terminal:
        console.width = 1000  # a pipe or a file: whole values, never cut to 80 columns
    try:
        account = Queues.connect(endpoint_url=args.endpoint_url, region=args.region)
        try:
            return commands[args.command](account, args, console)
        finally:
            account.close()
    except ConfigError as exc:
        fail(str(exc))
        return EXIT_USAGE
    except (StartupError, TransportError, PayloadUnavailable) as exc:
        fail(str(exc))
        return EXIT_STARTUP
    except KeyboardInterrupt:  # peek hands its messages back before this
        fail("interrupted")
        return EXIT_FORCED
