"""``sqsworker queues``: the queues as a table (or JSON lines), once or every few
seconds; and ``sqsworker queues create``. What they ask of SQS is in ``operate/``."""

from __future__ import annotations

import argparse
import json
from datetime import datetime

from rich import box
from rich.console import Console
from rich.live import Live
from rich.table import Table

from ..errors import ConfigError
from ..exits import Signals
from ..operate import Queues, QueueStatus


def show(queues: Queues, args: argparse.Namespace, console: Console) -> int:
    """``sqsworker queues [PREFIX]``: one table, JSON lines, or a table every --watch
    seconds until Ctrl-C."""
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


def create(queues: Queues, args: argparse.Namespace, console: Console) -> int:
    """``sqsworker queues create NAME``: the queue and its dead-letter queue, and what
    was made now or existed."""
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
