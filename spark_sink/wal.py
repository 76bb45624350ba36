"""The write-ahead log: what each batch's partitions received, so a replay returns it again.

SQS cannot replay a receive, and Spark may ask for the rows of a batch again
(a task retried, a query restarted from its checkpoint). So every partition of
every batch writes what it received to ``<walPath>/<seq>/part-<n>.json`` before
it returns a row, and a second read of the same slot returns the file instead of
receiving. The file appears atomically and only once (written aside, then
hard-linked into place): two attempts racing for one slot have one winner.

The driver reads the same files to keep the messages invisible until their batch
commits, then deletes the messages and the batch's folder. The folder must be on
storage the driver and every executor see as a POSIX filesystem: local disk in
local mode; NFS, EFS or a FUSE mount in a cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Container
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from sqsworker.transports import Envelope

log = structlog.get_logger("spark_sink")


@dataclass(frozen=True)
class Slot:
    """One partition of one batch: the messages it received, and when (epoch seconds)."""

    seq: int
    partition: int
    received_at: float
    messages: tuple[Envelope, ...]

    def dumps(self) -> str:
        return json.dumps(
            {
                "seq": self.seq,
                "partition": self.partition,
                "received_at": self.received_at,
                "messages": [
                    {
                        "message_id": e.message_id,
                        "receipt_handle": e.receipt_handle,
                        "body": e.body,
                        "attributes": dict(e.attributes),
                        "message_attributes": {k: dict(v) for k, v in e.message_attributes.items()},
                    }
                    for e in self.messages
                ],
            }
        )

    @classmethod
    def loads(cls, text: str) -> Slot:
        raw: dict[str, Any] = json.loads(text)
        return cls(
            seq=int(raw["seq"]),
            partition=int(raw["partition"]),
            received_at=float(raw["received_at"]),
            messages=tuple(Envelope(**m) for m in raw["messages"]),
        )


class WriteAheadLog:
    def __init__(self, root: str) -> None:
        self.root = Path(root)
        self._unreadable: set[Path] = set()  # reported once each

    def path(self, seq: int, partition: int) -> Path:
        return self.root / f"{seq:012d}" / f"part-{partition:05d}.json"

    def read(self, seq: int, partition: int) -> Slot | None:
        try:
            return Slot.loads(self.path(seq, partition).read_text())
        except FileNotFoundError:
            return None

    def write(self, slot: Slot) -> Slot:
        """Record ``slot`` unless its place is taken; returns the slot that is recorded."""
        final = self.path(slot.seq, slot.partition)
        final.parent.mkdir(parents=True, exist_ok=True)
        aside = final.with_name(f".{final.name}.{uuid.uuid4().hex}")
        with open(aside, "w") as out:
            out.write(slot.dumps())
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(aside, final)  # atomic, and refuses an existing name: one winner
        except FileExistsError:
            return Slot.loads(final.read_text())
        finally:
            aside.unlink()
        return slot

    def slots(self, skip: Container[tuple[int, int]] = ()) -> list[Slot]:
        """Every slot on disk (the batches not yet committed), but those ``skip`` names
        by ``(seq, partition)``: those files are not read."""
        found = []
        for folder in sorted(self.root.glob("[0-9]" * 12)):
            for path in sorted(folder.glob("part-*.json")):
                number = path.stem.removeprefix("part-")
                if not number.isdigit() or (int(folder.name), int(number)) in skip:
                    continue  # not a slot's file, or one already known
                try:
                    found.append(Slot.loads(path.read_text()))
                except FileNotFoundError:  # its batch was committed meanwhile
                    continue
                except (ValueError, KeyError, TypeError) as exc:  # not what write() wrote
                    if path not in self._unreadable:
                        self._unreadable.add(path)
                        log.error(
                            "a write-ahead log file cannot be read; its messages' leases "
                            "are not kept, and a replay of its batch fails",
                            path=str(path),
                            error=f"{type(exc).__name__}: {exc}",
                        )
        return found

    def drop_through(self, seq: int) -> None:
        """Forget every batch up to ``seq``: they are committed."""
        for folder in self.root.glob("[0-9]" * 12):
            if int(folder.name) <= seq:
                shutil.rmtree(folder, ignore_errors=True)
