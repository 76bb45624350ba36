"""An embedded SQS-compatible endpoint (moto's server) for development, demos and tests."""

from __future__ import annotations

import functools
import json
import logging
import socket
import threading
import time
from types import TracebackType
from typing import Any

import boto3

from .errors import ConfigError

REGION = "us-east-1"
START_LIMIT = 30  # seconds for moto's server to start serving
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local"}


class LocalSQS:
    """moto's SQS server on ``host:port`` (port 0 picks a free one), started and stopped here."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        try:
            from moto.server import ThreadedMotoServer
        except ImportError:
            raise ConfigError(
                "the embedded SQS needs moto's server: install it with "
                "pip install 'sqsworker[local]'"
            ) from None
        # No line per request, and no traceback for an action moto lacks (it answers 500).
        logging.getLogger("werkzeug").setLevel(logging.CRITICAL)
        _one_call_at_a_time()
        _quick_with_a_backlog()
        self._server = ThreadedMotoServer(ip_address=host, port=port, verbose=False)
        self.host = host
        self.port = port
        self.endpoint_url = ""

    def start(self) -> LocalSQS:
        """Serve; ``OSError`` if the port is taken or the server does not come up.

        moto's server binds in its own thread and its ``start()`` waits for it without a
        bound, so a bind that fails there would wait forever: the port is probed first
        (also for port 0: an unknown host fails here), and the wait is bounded (the port
        can still be taken between the probe and the bind).
        """
        with socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((self.host, self.port))
        starting = threading.Thread(target=self._server.start, daemon=True)
        starting.start()
        starting.join(START_LIMIT)
        if starting.is_alive():
            raise OSError(f"the server did not start within {START_LIMIT} s")
        _, port = self._server.get_host_and_port()
        self.port = port
        self.endpoint_url = f"http://{self.host}:{port}"
        return self

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> LocalSQS:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def env(self) -> dict[str, str]:
        """The environment a worker or boto3 client needs to reach this endpoint.

        moto's server also speaks DynamoDB and S3, so a ``dynamodb://`` idempotency store
        and offloaded bodies (``--payload-bucket``) work here.
        """
        return {
            "AWS_ENDPOINT_URL_SQS": self.endpoint_url,
            "AWS_ENDPOINT_URL_DYNAMODB": self.endpoint_url,
            "AWS_ENDPOINT_URL_S3": self.endpoint_url,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_REGION": REGION,
            **CREDENTIALS,
        }

    def client(self) -> Any:
        return boto3.client(
            "sqs",
            endpoint_url=self.endpoint_url,
            region_name=REGION,
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        )

    def create_queue(
        self,
        name: str,
        *,
        max_receive_count: int | None = 3,
        visibility_timeout: int = 30,
        **attributes: str,
    ) -> str:
        """Create ``name`` and, unless ``max_receive_count`` is None, its ``-dlq`` with a redrive
        policy. Returns the queue URL."""
        client = self.client()
        fifo = name.endswith(".fifo")
        base = {"VisibilityTimeout": str(visibility_timeout), **attributes}
        if fifo:
            base["FifoQueue"] = "true"
        if max_receive_count is not None:
            dlq_name = name.removesuffix(".fifo") + "-dlq" + (".fifo" if fifo else "")
            dlq_url = client.create_queue(
                QueueName=dlq_name, Attributes={"FifoQueue": "true"} if fifo else {}
            )["QueueUrl"]
            arn = client.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])[
                "Attributes"
            ]["QueueArn"]
            base["RedrivePolicy"] = json.dumps(
                {"deadLetterTargetArn": arn, "maxReceiveCount": max_receive_count}
            )
        return str(client.create_queue(QueueName=name, Attributes=base)["QueueUrl"])


_backend_lock = threading.Lock()
_BLOCKED_PAUSE = 0.05  # seconds between looks while every visible message's group is held
_LOOK_EVERY = 1.0  # seconds a long poll waits between looks at most, as moto's own does


def _one_call_at_a_time() -> None:
    """Make moto's SQS receives, deletes and visibility changes atomic, as SQS's are.

    moto's backend takes no lock: two long polls served on two threads can both see a
    message visible before either marks it received, and both return it (seen with two
    workers on a loaded machine: one message run twice at one receive count). Each of
    these calls now runs under one lock.

    moto's long poll also decides which FIFO groups are in flight once, when it begins,
    and keeps that view while it waits: a poll woken by new messages then took the later
    messages of a group another poll had just received, and a worker ran them first.
    So the long poll is ours: each look is one receive without waiting, under the lock,
    with the groups in flight as they are now; between looks it waits for a message to
    be sent, a second at most.
    """
    from moto.sqs import models

    if getattr(models.SQSBackend, "_sqsworker_atomic", False):
        return

    def atomic(method: Any) -> Any:
        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> Any:
            with _backend_lock:
                return method(*args, **kwargs)

        return call

    look = atomic(models.SQSBackend.receive_message)

    def receive_message(
        backend: Any,
        queue_name: str,
        count: int,
        wait_seconds_timeout: int,
        visibility_timeout: int,
        message_attribute_names: list[str] | None = None,
    ) -> list[Any]:
        deadline = time.monotonic() + wait_seconds_timeout
        while True:
            got = look(backend, queue_name, count, 0, visibility_timeout, message_attribute_names)
            left = deadline - time.monotonic()
            if got or left <= 0:
                return list(got)
            began = time.monotonic()
            # moto wakes a waiting poll only for a message sent: one visible again (a lease
            # ran out, a hand-back, a delay ended) is seen at the next look, within a second.
            backend.get_queue(queue_name).wait_for_messages(min(left, _LOOK_EVERY))
            if time.monotonic() - began < _BLOCKED_PAUSE:
                # Messages are visible but none could be had (their FIFO groups are in
                # flight): moto's wait returns at once, so pause instead of spinning.
                time.sleep(min(_BLOCKED_PAUSE, max(0.0, deadline - time.monotonic())))

    for name in ("delete_message", "change_message_visibility"):
        setattr(models.SQSBackend, name, atomic(getattr(models.SQSBackend, name)))
    models.SQSBackend.receive_message = receive_message  # type: ignore[method-assign,assignment]
    models.SQSBackend._sqsworker_atomic = True  # type: ignore[attr-defined]


def _entry_error(entry: dict[str, Any], code: str, text: str) -> dict[str, Any]:
    return {"Id": entry["Id"], "SenderFault": True, "Code": code, "Message": text}


def _quick_with_a_backlog() -> None:
    """Make moto's receive cost about the same with thousands of messages queued as with ten.

    For each message it returns, moto checks the retention period by computing every
    attribute of the queue, three of them by scanning all its messages, and it reads
    the clock through two datetime conversions each time it asks whether a message is
    visible. With 2,000 messages queued one receive took 3.3 s (20 ms with 100). Now the
    retention period is read directly and the clock is ``time.time()``. A batch delete
    looked through the queue twice for each entry; now once for the batch. A send
    computed every attribute to read ``ContentBasedDeduplication`` (2,000 messages took
    4.7 s to send); now the three counts, which no send reads, are skipped there. A batch
    visibility change looked through the queue for each entry (about 1 ms of a 7 ms call
    with 600 messages in flight); now once for the batch. What moto decides is unchanged.
    """
    from moto.sqs import models
    from moto.sqs.constants import MAXIMUM_VISIBILITY_TIMEOUT
    from moto.sqs.exceptions import InvalidParameterValue, ReceiptHandleIsInvalid

    if getattr(models, "_sqsworker_quick", False):
        return
    original = models.unix_time  # type: ignore[attr-defined]

    def unix_time(dt: Any = None) -> float:
        return time.time() if dt is None else original(dt)

    def unix_time_millis(dt: Any = None) -> float:
        return unix_time(dt) * 1000.0

    def retained(backend: Any, queue_name: str, message: Any) -> bool:
        retention = int(backend.get_queue(queue_name).message_retention_period)
        return bool(retention + message.sent_timestamp / 1000 > time.time())

    def delete_message_batch(
        backend: Any, queue_name: str, receipts: list[dict[str, Any]]
    ) -> tuple[list[str], list[dict[str, Any]]]:
        with _backend_lock:
            queue = backend.get_queue(queue_name)
            wanted = {r["ReceiptHandle"] for r in receipts} - queue.deleted_messages
            if wanted:
                kept = []
                for message in queue._messages:
                    if message.receipt_handle not in wanted and wanted.isdisjoint(
                        message._old_receipt_handles
                    ):
                        kept.append(message)
                    else:  # deleted, as moto's own delete does it
                        queue.pending_messages.discard(message)
                        queue.deleted_messages.update(message.all_receipt_handles)
                queue._messages = kept
            deleted = queue.deleted_messages
            return [r["Id"] for r in receipts if r["ReceiptHandle"] in deleted], [
                _entry_error(
                    r,
                    "ReceiptHandleIsInvalid",
                    f'The input receipt handle "{r["ReceiptHandle"]}" is not a valid '
                    "receipt handle.",
                )
                for r in receipts
                if r["ReceiptHandle"] not in deleted
            ]

    def change_message_visibility_batch(
        backend: Any, queue_name: str, entries: list[dict[str, Any]]
    ) -> tuple[list[str], list[dict[str, Any]]]:
        with _backend_lock:
            queue = backend.get_queue(queue_name)
            wanted = {e.get("ReceiptHandle") for e in entries}
            holder: dict[str, Any] = {}
            for message in queue._messages:
                if message.receipt_handle in wanted or not wanted.isdisjoint(
                    message._old_receipt_handles
                ):
                    for handle in message.all_receipt_handles:
                        holder.setdefault(handle, message)
            succeeded, failed = [], []
            invalid = getattr(ReceiptHandleIsInvalid(), "message", "")
            for entry in entries:
                try:
                    timeout = int(entry["VisibilityTimeout"])
                except (KeyError, TypeError, ValueError):
                    timeout = MAXIMUM_VISIBILITY_TIMEOUT + 1
                if timeout > MAXIMUM_VISIBILITY_TIMEOUT:
                    failed.append(
                        _entry_error(entry, "InvalidParameterValue", "Visibility timeout invalid")
                    )
                    continue
                message = holder.get(entry["ReceiptHandle"])
                if message is None:
                    failed.append(_entry_error(entry, "ReceiptHandleIsInvalid", invalid))
                    continue
                # as moto's own change: the 12 hours since sent, then the change
                if time.time() * 1000 + timeout * 1000 - message.sent_timestamp > 43200 * 1000:
                    raise InvalidParameterValue(
                        f"Value {timeout} for parameter VisibilityTimeout is invalid. Reason: "
                        "Total VisibilityTimeout for the message is beyond the limit [43200 "
                        "seconds]"
                    )
                message.change_visibility(timeout)
                if message.visible and message in queue.pending_messages:
                    queue.pending_messages.remove(message)
                succeeded.append(entry["Id"])
            return succeeded, failed

    sending = threading.local()  # this thread is in a send: no count is read

    def uncounted_in_a_send(count: property) -> property:
        def get(queue: Any) -> int:
            return 0 if getattr(sending, "now", False) else int(count.fget(queue))  # type: ignore[misc]

        return property(get)

    send_message = models.SQSBackend.send_message

    def send(*args: Any, **kwargs: Any) -> Any:
        sending.now = True
        try:
            return send_message(*args, **kwargs)
        finally:
            sending.now = False

    for name in ("", "_not_visible", "_delayed"):
        count = f"approximate_number_of_messages{name}"
        setattr(models.Queue, count, uncounted_in_a_send(getattr(models.Queue, count)))
    models.unix_time = unix_time  # type: ignore[attr-defined]
    models.unix_time_millis = unix_time_millis  # type: ignore[attr-defined]
    backend = models.SQSBackend
    backend.is_message_valid_based_on_retention_period = retained  # type: ignore[method-assign,assignment]
    backend.delete_message_batch = delete_message_batch  # type: ignore[method-assign,assignment]
    backend.change_message_visibility_batch = change_message_visibility_batch  # type: ignore[method-assign,assignment]
    backend.send_message = send  # type: ignore[method-assign]
    models._sqsworker_quick = True  # type: ignore[attr-defined]
