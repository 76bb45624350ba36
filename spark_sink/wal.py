"""The write-ahead log: what each batch's partitions received, so a replay returns it again.

SQS cannot replay a receive, and Spark may ask for the rows of a batch again
(a task retried, a query restarted from its checkpoint). So every partition of
every batch writes what it received to a slot of the log, ``<seq>/part-<n>.json``,
before it returns a row, and a second read of the same slot returns the slot
instead of receiving. A slot is written once: two attempts racing for one slot
have one winner, and the loser reads the winner's.

Two places hold a log, named by ``walPath``:

- ``s3://bucket/prefix`` (``S3Log``): one object per slot, created only if absent
  (``PutObject`` with ``If-None-Match: *``), so the driver and executors of a
  cluster share it through S3's API with nothing else mounted;
- an absolute local folder (``LocalLog``): local mode, or a mount every executor
  shares (NFS, EFS); a slot is written aside, then hard-linked into place. The
  driver leaves a marker there that each task must find before it receives: a
  folder on each executor's own disk is refused rather than silently lost.

The driver reads the slots of the batches it planned by name (never by listing
S3 while they run; it lists once, at start, what an earlier driver left), keeps
their messages invisible until their batch commits, then deletes the messages
and the batch's slots.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Container, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from sqsworker.config import BUCKET_NAME
from sqsworker.transports import Envelope

log = structlog.get_logger("spark_sink")

MARKERS = "_drivers"  # a local log's markers, one per query start
LOOK_SHARE = 16  # on S3 the driver looks for a planned slot every visibilityTimeout / 16
LOOK_S3_MIN, LOOK_S3_MAX = 0.05, 1.0  # ... but not more often than this, nor more rarely


class LogUnusable(ValueError):
    """The log's place cannot work for this query; the message says why and how to fix it."""


@dataclass(frozen=True)
class Slot:
    """One partition of one batch: the messages it received, and when (epoch seconds):
    ``received_at`` its first receive that returned messages began, ``began`` (one for
    each message, when given) the receive that returned that message; ``queue`` the URL
    of the queue they came from (empty in a slot written before it was recorded)."""

    seq: int
    partition: int
    received_at: float
    messages: tuple[Envelope, ...]
    began: tuple[float, ...] = ()
    queue: str = ""

    def leases(self) -> list[tuple[float, list[Envelope]]]:
        """The messages grouped by when their receive began, each lease counted from it."""
        groups: dict[float, list[Envelope]] = {}
        began = self.began if len(self.began) == len(self.messages) else ()
        for n, envelope in enumerate(self.messages):
            groups.setdefault(began[n] if began else self.received_at, []).append(envelope)
        return sorted(groups.items(), key=lambda group: group[0])

    @property
    def key(self) -> tuple[int, int]:
        return (self.seq, self.partition)

    def dumps(self) -> str:
        return json.dumps(
            {
                "seq": self.seq,
                "partition": self.partition,
                "queue": self.queue,
                "received_at": self.received_at,
                "began": list(self.began),
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
            },
            default=_bytes_out,  # a Binary attribute's value
        )

    @classmethod
    def loads(cls, text: str | bytes) -> Slot:
        raw: dict[str, Any] = json.loads(text, object_hook=_bytes_in)
        return cls(
            seq=int(raw["seq"]),
            partition=int(raw["partition"]),
            received_at=float(raw["received_at"]),
            messages=tuple(Envelope(**m) for m in raw["messages"]),
            began=tuple(float(b) for b in raw.get("began", ())),
            queue=str(raw.get("queue", "")),
        )

    def refuse_other_queue(self, queue: str, wal_path: str) -> None:
        """Raise ``LogUnusable`` if this slot's messages came from another queue than
        ``queue``: the log is another query's."""
        if self.queue and self.queue != queue:
            raise LogUnusable(
                f"the sqs option 'walPath' ({wal_path}) holds the write-ahead log of queue "
                f"{self.queue}, not of {queue}: give each query a walPath of its own, as "
                f"each has a checkpoint of its own"
            )


BYTES = "__bytes__"  # in a slot, what stands for bytes: {"__bytes__": base64}


def _bytes_out(value: object) -> dict[str, str]:
    """Bytes (SQS gives a Binary attribute's value so) in JSON."""
    if isinstance(value, bytes | bytearray):
        return {BYTES: base64.b64encode(value).decode()}
    raise TypeError(f"a slot cannot hold {type(value).__name__}")


def _bytes_in(value: dict[str, Any]) -> Any:
    if len(value) == 1 and isinstance(value.get(BYTES), str):
        return base64.b64decode(value[BYTES])
    return value


def slot_name(seq: int, partition: int) -> str:
    return f"{seq:012d}/part-{partition:05d}.json"


def parse_name(name: str) -> tuple[int, int] | None:
    """``(seq, partition)`` of a slot's name (``slot_name``); None for anything else."""
    folder, _, file = name.rpartition("/")
    folder = folder.rpartition("/")[2]
    number = file.removeprefix("part-").removesuffix(".json")
    if len(folder) != 12 or not folder.isdigit() or not file.endswith(".json"):
        return None
    if not file.startswith("part-") or not number.isdigit():
        return None
    return int(folder), int(number)


class WriteAheadLog(ABC):
    """Where the slots are; each method says who calls it (executors, or the driver)."""

    def __init__(self) -> None:
        self._unreadable: set[str] = set()  # reported once each

    # -- executors ---------------------------------------------------------------------

    @abstractmethod
    def read(self, seq: int, partition: int) -> Slot | None:
        """The slot, if it was written."""

    @abstractmethod
    def write(self, slot: Slot) -> Slot:
        """Record ``slot`` unless its place is taken; returns the slot that is recorded
        (``slot`` itself when it is the one recorded, even if found already there)."""

    def confirm(self, marker: str | None) -> None:  # noqa: B027 (most places need no check)
        """Raise ``LogUnusable`` if this process does not see the log the driver made."""

    # -- the driver --------------------------------------------------------------------

    def look_every(self, visibility_timeout: int) -> float:
        """Seconds between the driver's looks for a planned slot not written yet."""
        return 0.02

    def prepare(self) -> str | None:
        """At the query's start: refuse a place that cannot work; the marker tasks check."""
        return None

    def refuse_other_queue(self, queue: str) -> None:
        """At the query's start: raise ``LogUnusable`` if a slot left in the log holds
        messages of another queue (a listing, and one slot read)."""
        for seq, partition in self.names():
            slot = self._readable(seq, partition)
            if slot is not None:
                slot.refuse_other_queue(queue, self.place())
                return

    @abstractmethod
    def place(self) -> str:
        """The log's place, as ``walPath`` names it."""

    def find(self, keys: Iterable[tuple[int, int]]) -> list[Slot]:
        """Those of the slots named by ``keys`` that are written (read by name)."""
        found = []
        for seq, partition in sorted(keys):
            slot = self._readable(seq, partition)
            if slot is not None:
                found.append(slot)
        return found

    @abstractmethod
    def names(self) -> list[tuple[int, int]]:
        """Every slot written (a listing: the driver's start only)."""

    def slots(self, skip: Container[tuple[int, int]] = ()) -> list[Slot]:
        """Every slot written, but those ``skip`` names: those are not read."""
        return self.find(key for key in self.names() if key not in skip)

    @abstractmethod
    def drop(self, keys: Iterable[tuple[int, int]]) -> None:
        """Remove the slots named by ``keys``: their batches are committed."""

    def _readable(self, seq: int, partition: int) -> Slot | None:
        try:
            return self.read(seq, partition)
        except (ValueError, KeyError, TypeError) as exc:  # not what write() wrote
            where = self.where(seq, partition)
            if where not in self._unreadable:
                self._unreadable.add(where)
                log.error(
                    "a write-ahead log slot cannot be read; its messages' leases "
                    "are not kept, and a replay of its batch fails",
                    path=where,
                    error=f"{type(exc).__name__}: {exc}",
                )
            return None

    @abstractmethod
    def where(self, seq: int, partition: int) -> str:
        """The slot's full name, for messages."""


class LocalLog(WriteAheadLog):
    """A folder every process of the query sees: local disk in local mode, or a mount."""

    def __init__(self, root: str) -> None:
        super().__init__()
        self.root = Path(root)

    def path(self, seq: int, partition: int) -> Path:
        return self.root / slot_name(seq, partition)

    def place(self) -> str:
        return str(self.root)

    def where(self, seq: int, partition: int) -> str:
        return str(self.path(seq, partition))

    def read(self, seq: int, partition: int) -> Slot | None:
        try:
            return Slot.loads(self.path(seq, partition).read_text())
        except FileNotFoundError:
            return None

    def write(self, slot: Slot) -> Slot:
        final = self.path(slot.seq, slot.partition)
        final.parent.mkdir(parents=True, exist_ok=True)
        aside = final.with_name(f".{final.name}.{uuid.uuid4().hex}")
        with open(aside, "w") as out:
            out.write(slot.dumps())
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(aside, final)  # atomic, and refuses an existing name: one winner
        except FileExistsError:  # on NFS, also a retried link whose answer was lost: ours
            recorded = Slot.loads(final.read_text())
            return slot if recorded == slot else recorded
        finally:
            aside.unlink()
        return slot

    def prepare(self) -> str:
        try:
            (self.root / MARKERS).mkdir(parents=True, exist_ok=True)
            marker = uuid.uuid4().hex
            (self.root / MARKERS / marker).touch()
        except OSError as exc:
            raise LogUnusable(
                f"the sqs option 'walPath' ({self.root}) cannot be written by the driver: "
                f"{exc.strerror or exc}"
            ) from None
        return marker

    def confirm(self, marker: str | None) -> None:
        if marker is not None and not (self.root / MARKERS / marker).exists():
            raise LogUnusable(
                f"the sqs option 'walPath' ({self.root}) is not the driver's folder on this "
                f"executor: the marker the driver left there at start is missing, so each "
                f"executor would keep its own log and the driver would see none of it; give "
                f"a folder every executor mounts (NFS, EFS) or s3://bucket/prefix"
            )

    def names(self) -> list[tuple[int, int]]:
        found = []
        for path in sorted(self.root.glob("[0-9]" * 12 + "/part-*.json")):
            key = parse_name(f"{path.parent.name}/{path.name}")
            if key is not None:
                found.append(key)
        return found

    def drop(self, keys: Iterable[tuple[int, int]]) -> None:
        folders = set()
        for seq, partition in keys:
            self.path(seq, partition).unlink(missing_ok=True)
            folders.add(self.path(seq, partition).parent)
        for folder in folders:
            # gone already, or something else is in it (an aside file): left
            with contextlib.suppress(OSError):
                folder.rmdir()

    def drop_through(self, seq: int) -> None:
        """Remove every slot of every batch up to ``seq``."""
        self.drop(key for key in self.names() if key[0] <= seq)


class S3Log(WriteAheadLog):
    """``s3://bucket/prefix``: one object per slot, through S3's API (boto3; its endpoint
    from ``AWS_ENDPOINT_URL_S3`` when set)."""

    def __init__(self, bucket: str, prefix: str, region: str | None = None) -> None:
        super().__init__()
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.region = region
        self._client: Any = None
        self.requests = 0  # S3 requests this process made through this log

    @property
    def client(self) -> Any:
        if self._client is None:
            import boto3
            from botocore.config import Config

            self._client = boto3.client(
                "s3",
                region_name=self.region,
                config=Config(retries={"mode": "standard"}, connect_timeout=10, read_timeout=30),
            )
        return self._client

    def key(self, seq: int, partition: int) -> str:
        return (
            f"{self.prefix}/{slot_name(seq, partition)}"
            if self.prefix
            else slot_name(seq, partition)
        )

    def where(self, seq: int, partition: int) -> str:
        return f"s3://{self.bucket}/{self.key(seq, partition)}"

    def place(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def read(self, seq: int, partition: int) -> Slot | None:
        from botocore.exceptions import ClientError

        self.requests += 1
        try:
            answer = self.client.get_object(Bucket=self.bucket, Key=self.key(seq, partition))
        except ClientError as exc:
            if _code(exc) in ("NoSuchKey", "404"):
                return None
            raise
        return Slot.loads(answer["Body"].read())

    def write(self, slot: Slot) -> Slot:
        from botocore.exceptions import ClientError

        body = slot.dumps().encode()
        for attempt in range(10):
            self.requests += 1
            try:
                self.client.put_object(
                    Bucket=self.bucket,
                    Key=self.key(slot.seq, slot.partition),
                    Body=body,
                    ContentType="application/json",
                    IfNoneMatch="*",  # one winner: S3 refuses a key that exists
                )
                return slot
            except ClientError as exc:
                code = _code(exc)
                if code == "ConditionalRequestConflict":  # a racing write under way: again
                    time.sleep(0.05 * (attempt + 1))
                    continue
                if code not in ("PreconditionFailed", "412"):
                    raise
            recorded = self.read(slot.seq, slot.partition)
            if recorded is not None:
                # Ours, when S3 stored our first try but its answer was lost (a 500, a
                # timeout) and boto3 sent it again: not another attempt's win.
                return slot if recorded == slot else recorded
        raise RuntimeError(f"writing {self.where(slot.seq, slot.partition)} kept conflicting")

    def names(self) -> list[tuple[int, int]]:
        found = []
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=f"{self.prefix}/" if self.prefix else ""
        )
        for page in pages:
            self.requests += 1
            for item in page.get("Contents", []):
                key = parse_name(str(item["Key"]))
                if key is not None:
                    found.append(key)
        return sorted(found)

    def drop(self, keys: Iterable[tuple[int, int]]) -> None:
        names = [{"Key": self.key(seq, partition)} for seq, partition in sorted(set(keys))]
        for start in range(0, len(names), 1000):  # DeleteObjects takes 1,000 keys a call
            self.requests += 1
            answer = self.client.delete_objects(
                Bucket=self.bucket, Delete={"Objects": names[start : start + 1000], "Quiet": True}
            )
            if answer.get("Errors"):
                first = answer["Errors"][0]
                raise RuntimeError(
                    f"S3 kept {len(answer['Errors'])} slots of the log: "
                    f"{first.get('Key')}: {first.get('Code')} {first.get('Message')}"
                )

    def look_every(self, visibility_timeout: int) -> float:
        return min(LOOK_S3_MAX, max(LOOK_S3_MIN, visibility_timeout / LOOK_SHARE))

    def prepare(self) -> None:
        """Refuse a bucket that does not exist, cannot be written, or does not honour
        conditional writes (without them two attempts at a slot could both win)."""
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

        where = f"s3://{self.bucket}/{self.prefix}"
        probe = (
            f"{self.prefix}/_probe-{uuid.uuid4().hex}"
            if self.prefix
            else (f"_probe-{uuid.uuid4().hex}")
        )
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            if _code(exc) in ("404", "NoSuchBucket"):
                raise LogUnusable(
                    f"the sqs option 'walPath' ({where}) names a bucket that does not exist: "
                    f"create bucket {self.bucket!r} or name another"
                ) from None
            raise LogUnusable(
                f"the sqs option 'walPath' ({where}) cannot be used: S3 answered "
                f"{_code(exc)} for bucket {self.bucket!r} (the driver and executors need "
                f"s3:GetObject, s3:PutObject, s3:DeleteObject and s3:ListBucket on it)"
            ) from None
        except NoCredentialsError:
            raise LogUnusable(
                f"the sqs option 'walPath' ({where}) cannot be used: no AWS credentials were "
                f"found (the driver and every executor need them: environment, profile, "
                f"instance or pod role)"
            ) from None
        except BotoCoreError as exc:
            raise LogUnusable(
                f"the sqs option 'walPath' ({where}) cannot be reached: {exc}"
            ) from None
        try:
            self.client.put_object(Bucket=self.bucket, Key=probe, Body=b"", IfNoneMatch="*")
            try:
                self.client.put_object(Bucket=self.bucket, Key=probe, Body=b"", IfNoneMatch="*")
            except ClientError as exc:
                if _code(exc) not in ("PreconditionFailed", "412"):
                    raise
            else:
                raise LogUnusable(
                    f"the sqs option 'walPath' ({where}) is on storage that does not honour "
                    f"conditional writes (PutObject with If-None-Match: *), so two attempts "
                    f"at one slot could both win: use Amazon S3 or a store that honours them"
                )
        except ClientError as exc:
            raise LogUnusable(
                f"the sqs option 'walPath' ({where}) cannot be written: S3 answered "
                f"{_code(exc)} (the driver and executors need s3:PutObject, s3:GetObject, "
                f"s3:DeleteObject and s3:ListBucket there)"
            ) from None
        finally:
            with contextlib.suppress(ClientError, BotoCoreError):
                self.client.delete_object(Bucket=self.bucket, Key=probe)
        return None

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def _code(exc: Any) -> str:
    error = exc.response.get("Error", {})
    return str(error.get("Code") or exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode"))


def parse_place(wal_path: str) -> tuple[str, str, str]:
    """``("s3", bucket, prefix)`` or ``("local", folder, "")`` for a ``walPath``; raises
    ``LogUnusable`` with one sentence for anything else."""
    path = wal_path.strip()
    scheme, sep, rest = path.partition("://")
    if not sep:
        if not os.path.isabs(path):
            raise LogUnusable(
                f"the sqs option 'walPath' must be an absolute folder or s3://bucket/prefix; "
                f"got {wal_path!r}, a relative path, which each executor would resolve in "
                f"its own working folder"
            )
        return "local", path, ""
    scheme = scheme.lower()
    if scheme == "file":
        if not rest.startswith("/"):
            raise LogUnusable(
                f"the sqs option 'walPath' must be file:///absolute/folder; got {wal_path!r}"
            )
        return "local", rest, ""
    if scheme == "s3":
        bucket, _, prefix = rest.partition("/")
        if not BUCKET_NAME.match(bucket):
            raise LogUnusable(
                f"the sqs option 'walPath' must be s3://bucket/prefix with an S3 bucket name "
                f"(3-63 lowercase letters, digits, dots and hyphens); got {wal_path!r}"
            )
        return "s3", bucket, prefix.strip("/")
    hint = " (the log goes through S3's own API: write s3://)" if scheme in ("s3a", "s3n") else ""
    raise LogUnusable(
        f"the sqs option 'walPath' must be s3://bucket/prefix or an absolute local folder; "
        f"got {wal_path!r}, whose scheme {scheme!r} it cannot use{hint}"
    )


def open_log(wal_path: str, region: str | None = None) -> WriteAheadLog:
    kind, where, prefix = parse_place(wal_path)
    if kind == "s3":
        return S3Log(where, prefix, region)
    return LocalLog(where)
