"""Bodies too large for SQS, kept in S3, in the wire format of AWS's extended clients.

A sender puts the body in S3 and sends in its place a pointer,
``["software.amazon.payloadoffloading.PayloadS3Pointer", {"s3BucketName": B, "s3Key": K}]``,
with the message attribute ``ExtendedPayloadSize`` (a Number: the body's bytes). AWS's
Java and Python extended clients write and read exactly this (their older releases the
attribute ``SQSLargePayloadSize`` and the class ``com.amazon.sqs.javamessaging.MessageS3Pointer``,
read here too), so messages pass both ways between them and sqsworker.

The worker fetches a pointed-to body on the handler thread, before the idempotency key
is derived and the handler runs; ``message.body`` is then the body the sender sent.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import defaultdict, deque
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import structlog

from .errors import ConfigError, PayloadMissing, PayloadUnavailable
from .events import Observer
from .pointers import (  # the wire format's names, read here too
    KEY_ATTRIBUTE,
    LEGACY_SIZE_ATTRIBUTE,
    POINTER_CLASS,
    SIZE_ATTRIBUTE,
    Pointer,
)
from .pointers import (
    LEGACY_POINTER_CLASS as LEGACY_POINTER_CLASS,
)
from .pointers import (
    is_offloaded as is_offloaded,
)
from .pointers import (
    pointer_of as pointer_of,
)
from .transports import OutgoingMessage

if TYPE_CHECKING:
    from .message import Message

MAX_ATTRIBUTES = 10  # SQS's limit of message attributes per message
# S3's answers that mean the object will not appear by asking again.
_GONE_CODES = frozenset({"NoSuchKey", "NoSuchBucket", "404", "InvalidBucketName"})
_DELETE_CHUNK = 1000  # keys a DeleteObjects request takes

log = structlog.get_logger("sqsworker.payloads")


class Payloads:
    """Offloaded bodies in S3 for one process: fetched for handlers, stored for senders,
    removed after their messages are deleted when asked to.

    ``bucket``: where senders put bodies, and, when given, the only bucket the worker
    fetches from (a pointer elsewhere is refused: a producer cannot make the worker read
    any object its role can). ``client``: an S3 client (boto3's, made on first use: it
    honours ``AWS_ENDPOINT_URL_S3``).
    """

    def __init__(
        self, *, bucket: str | None = None, region: str | None = None, client: Any = None
    ) -> None:
        self.bucket = bucket
        self._region = region
        self._client = client
        self._owns_client = client is None
        self._lock = threading.Lock()
        self._remover: threading.Thread | None = None
        # (bucket, keys) of each removal asked for and not begun. Guarded by _lock.
        self._removals: deque[tuple[str, list[str]]] = deque()
        self._removing = 0  # objects the removal under way names
        self._changed = threading.Condition(self._lock)

    @property
    def client(self) -> Any:
        with self._lock:
            if self._client is None:
                import boto3
                from botocore.config import Config

                self._client = boto3.client(
                    "s3",
                    region_name=self._region,
                    # A fetch runs on a handler thread whose lease is being renewed: bounded,
                    # it ends in a failure that is retried rather than a thread held forever.
                    config=Config(
                        retries={"mode": "standard"},
                        max_pool_connections=50,
                        connect_timeout=10,
                        read_timeout=60,
                    ),
                )
            return self._client

    # -- the worker's side -----------------------------------------------------------------

    def fetch(self, pointer: Pointer) -> str:
        """The body ``pointer`` stands for: ``PayloadMissing`` when it cannot be had,
        ``PayloadUnavailable`` when S3 did not answer (worth a retry)."""
        if self.bucket is not None and pointer.bucket != self.bucket:
            raise PayloadMissing(
                f"the message's body is in bucket {pointer.bucket!r}, and this worker reads "
                f"offloaded bodies from {self.bucket!r} only (--payload-bucket)"
            )
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            answer = self.client.get_object(Bucket=pointer.bucket, Key=pointer.key)
            data: bytes = answer["Body"].read()
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in _GONE_CODES:
                raise PayloadMissing(f"the body {pointer} is gone from S3 ({code})") from None
            raise PayloadUnavailable(f"could not fetch the body {pointer}: {exc}") from None
        except BotoCoreError as exc:
            raise PayloadUnavailable(f"could not fetch the body {pointer}: {exc}") from None
        try:
            return data.decode()
        except UnicodeDecodeError:
            raise PayloadMissing(f"the message's body {pointer} is not UTF-8 text") from None

    def remove_later(self, pointers: Iterable[Pointer]) -> None:
        """Delete these objects from S3 on a thread of their own: their messages are
        deleted, and nothing will read them again. A failure is logged, not retried (an
        object left behind costs storage only; an S3 lifecycle rule clears it)."""
        by_bucket: dict[str, list[str]] = defaultdict(list)
        for pointer in pointers:
            by_bucket[pointer.bucket].append(pointer.key)
        if not by_bucket:
            return
        with self._lock:
            if self._remover is None:
                # A daemon: a removal under way at exit (S3 unreachable) never holds it up.
                self._remover = threading.Thread(
                    target=self._remove_all, name="sqsworker-payloads", daemon=True
                )
                self._remover.start()
            for bucket, keys in by_bucket.items():
                for first in range(0, len(keys), _DELETE_CHUNK):
                    self._removals.append((bucket, keys[first : first + _DELETE_CHUNK]))
            self._changed.notify_all()

    def _remove_all(self) -> None:
        while True:
            with self._lock:
                while not self._removals:
                    self._changed.wait()
                bucket, keys = self._removals.popleft()
                self._removing = len(keys)
            self._remove(bucket, keys)
            with self._lock:
                self._removing = 0
                self._changed.notify_all()

    def _remove(self, bucket: str, keys: list[str]) -> None:
        try:
            answer = self.client.delete_objects(
                Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys], "Quiet": True}
            )
            errors = answer.get("Errors", [])
        except Exception as exc:  # logged: the objects stay, which loses nothing
            errors = [{"Key": k, "Code": type(exc).__name__, "Message": str(exc)} for k in keys]
        for error in errors:
            log.warning(
                "offloaded body not removed",
                bucket=bucket,
                key=error.get("Key"),
                reason=f"{error.get('Code')}: {error.get('Message')}",
            )

    def close(self, timeout: float | None = None) -> None:
        """Wait for the removals asked for (each one S3 request), ``timeout`` seconds at
        most when given: those not done by then are logged and left to the bucket's
        lifecycle rule. Then close the client made here."""
        with self._lock:
            self._changed.wait_for(lambda: not (self._removals or self._removing), timeout)
            left = self._removing + sum(len(keys) for _, keys in self._removals)
            self._removals.clear()
        if left:
            log.warning(
                "offloaded bodies not removed by the shutdown's deadline: left in S3 for the "
                "bucket's lifecycle rule to clear",
                objects=left,
            )
            return  # a removal under way still uses the client; the process ends it
        with self._lock:
            client, self._client = (self._client, None) if self._owns_client else (None, None)
        if client is not None:
            client.close()

    # -- the sender's side -----------------------------------------------------------------

    def offload(self, message: OutgoingMessage, threshold: int) -> OutgoingMessage:
        """``message`` as it is when it takes at most ``threshold`` bytes; else its body
        put in S3 (``bucket``) and the message a pointer to it."""
        if message.size <= threshold:
            return message
        if self.bucket is None:
            raise ConfigError("offloading a body to S3 needs a bucket: pass --payload-bucket")
        try:
            check_offloadable(message)
        except ConfigError as exc:
            raise ConfigError(f"a message cannot be offloaded to S3: {exc}") from None
        data = message.body.encode()
        chosen = message.message_attributes.get(KEY_ATTRIBUTE, {}).get("StringValue")
        key = str(chosen) if chosen else str(uuid.uuid4())
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.put_object(Bucket=self.bucket, Key=key, Body=data)
        except (BotoCoreError, ClientError) as exc:
            raise PayloadUnavailable(
                f"could not put a message's body in s3://{self.bucket}/{key}: {exc}"
            ) from None
        attributes = {
            **message.message_attributes,
            SIZE_ATTRIBUTE: {"DataType": "Number", "StringValue": str(len(data))},
        }
        body = json.dumps([POINTER_CLASS, {"s3BucketName": self.bucket, "s3Key": key}])
        return replace(message, body=body, message_attributes=attributes)


class RemoveAfterDelete(Observer):
    """``--delete-payloads``: an offloaded body is removed from S3 once SQS deleted its
    message, for the messages the worker said it is done with (``expect``): handled, or
    dropped as duplicates. A rejected message's body stays: the copy in the dead-letter
    queue points to it. Marked before the delete is asked for, so no answer comes first.
    """

    def __init__(self, payloads: Payloads) -> None:
        self.payloads = payloads
        self._lock = threading.Lock()
        self._expected: dict[Message, Pointer] = {}

    @property
    def pending(self) -> int:
        """Messages expected, whose delete SQS has not confirmed yet."""
        with self._lock:
            return len(self._expected)

    def expect(self, message: Message) -> None:
        pointer = message.offloaded_to
        if pointer is not None:
            with self._lock:
                self._expected[message] = pointer

    def deleted(self, messages: Sequence[Message]) -> None:
        with self._lock:
            pointers = [p for m in messages if (p := self._expected.pop(m, None)) is not None]
        self.payloads.remove_later(pointers)

    def delete_failed(self, message: Message, reason: str, will_retry: bool) -> None:
        if not will_retry:  # the message may come again: it needs its body
            self.forget(message)

    def lease_lost(self, message: Message, reason: str) -> None:
        self.forget(message)

    def deleted_after_lease_lost(self, message: Message) -> None:
        # SQS may have delivered it again meanwhile: its body now belongs to whoever holds
        # that delivery, so it stays in S3, and is forgotten here.
        self.forget(message)

    def forget(self, message: Message) -> None:
        """Its body stays: the message comes back (or may)."""
        with self._lock:
            self._expected.pop(message, None)


def check_offloadable(message: OutgoingMessage) -> None:
    """``ConfigError`` when ``message`` cannot carry a pointer: it already names itself
    offloaded, or it has no room for the size attribute."""
    attributes = message.message_attributes
    for reserved in (SIZE_ATTRIBUTE, LEGACY_SIZE_ATTRIBUTE):
        if reserved in attributes:
            raise ConfigError(
                f"it has the attribute {reserved}, which marks a body already offloaded: remove it"
            )
    if len(attributes) >= MAX_ATTRIBUTES:
        raise ConfigError(
            f"it has {len(attributes)} attributes, and its pointer needs one more "
            f"({SIZE_ATTRIBUTE}) within SQS's {MAX_ATTRIBUTES}: send it with at most "
            f"{MAX_ATTRIBUTES - 1}"
        )
