"""The boto3 transport: the only module of sqsworker that talks to AWS.

boto3's conventions hold: the default credential chain, AWS_REGION /
AWS_DEFAULT_REGION, AWS_ENDPOINT_URL and AWS_ENDPOINT_URL_SQS. botocore's own
retries are turned off so that every attempt is one counted request; transient
faults (throttling, 5xx, connection resets, timeouts) are retried here, after
0.1, 0.2, 0.4 ... s (at most 2) and up to 0.1 s more at random (except a receive:
one attempt, so the caller knows when the request that returned a message began),
and every botocore error leaves this module as an sqsworker error.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import random
import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionError,
    ConnectTimeoutError,
    EndpointConnectionError,
    HTTPClientError,
    NoCredentialsError,
    NoRegionError,
    PartialCredentialsError,
)

from ..config import MAX_WAIT_TIME, SQS_CLIENTS
from ..errors import CredentialsError, QueueNotFound, StartupError, TransportError
from . import (
    UNANSWERED,
    BatchResult,
    EntryFailure,
    Envelope,
    OutgoingMessage,
    QueueCounts,
    QueueInfo,
    check_batch,
)
from .answers import batch_result, envelopes, error_code, unreadable

if TYPE_CHECKING:
    from .lean import LeanSQS

T = TypeVar("T")

# A failed call's retries: after 0.1 s, doubling to at most 2 s, each up to 0.1 s later at
# random (so that workers refused together do not come back together).
RETRY_FIRST, RETRY_MOST, RETRY_JITTER = 0.1, 2.0, 0.1

# Which client sends the hot calls (receive, delete, change visibility, send batches):
# "lean" (signed JSON requests, transports/lean.py) or "boto3" (botocore's client for all).
DEFAULT_SQS_CLIENT = "lean"

THROTTLING_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "RequestThrottled",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "ServiceUnavailable",
        "InternalError",
        "InternalFailure",
        "KMS.ThrottlingException",
    }
)
# Connection errors before a request left: SQS never saw it. (Not a proxy's error: urllib3
# 1.26 calls any socket error on a proxied connection so, one after the request went too.)
UNSENT = (EndpointConnectionError, ConnectTimeoutError)
QUEUE_MISSING_CODES = frozenset({"QueueDoesNotExist", "NonExistentQueue"})
# Sender faults in a batch that one bad entry can cause: the batch is split to find it.
ENTRY_FAULT_CODES = frozenset(
    {"InvalidParameterValue", "ReceiptHandleIsInvalid", "MessageNotInflight"}
)


def translate(exc: Exception, action: str) -> Exception:
    """Turn a botocore error into the sqsworker error that says what it means."""
    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        return CredentialsError(
            "no usable AWS credentials were found: set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, choose a profile with AWS_PROFILE, or run with an IAM role"
        )
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = error_code(error.get("Code"))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        retryable = code in THROTTLING_CODES or status >= 500
        return TransportError(
            f"{action} failed: {code}: {error.get('Message', '')}",
            code=code,
            retryable=retryable,
            unapplied=400 <= status < 500,  # refused or throttled; a 5xx may have acted
        )
    if isinstance(exc, ConnectionError | HTTPClientError):
        return TransportError(
            f"{action} failed: {exc}",
            code="ConnectionError",
            retryable=True,
            unapplied=isinstance(exc, UNSENT),  # else sent, its answer lost: maybe acted on
        )
    return TransportError(f"{action} failed: {exc}", code=type(exc).__name__)


class SQSTransport:
    def __init__(
        self,
        client: Any,
        info: QueueInfo,
        *,
        requests: Counter[str] | None = None,
        request_errors: Counter[tuple[str, str]] | None = None,
        attempts: int = 4,
        owns_client: bool = True,
        lean: LeanSQS | None = None,
    ) -> None:
        self.client = client
        self.lean = lean
        self.info = info
        self.requests: Counter[str] = requests if requests is not None else Counter()
        self.request_errors: Counter[tuple[str, str]] = (
            request_errors if request_errors is not None else Counter()
        )
        self.attempts = attempts
        self._owns_client = owns_client

    @classmethod
    def connect(
        cls,
        queue: str,
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        max_connections: int = 10,
        attempts: int = 4,
        sqs_client: str | None = None,
    ) -> SQSTransport:
        """Open ``queue`` (name, URL or ARN); fail with one clear sentence if it cannot work.

        ``sqs_client``: "lean" or "boto3" (``DEFAULT_SQS_CLIENT`` if None), the client of
        the hot calls."""
        client, lean = _client(endpoint_url, region, max_connections, sqs_client)
        probe = cls(client, _placeholder(queue), attempts=attempts, lean=lean)
        return probe._bind(queue, owns_client=True)

    @classmethod
    def connect_client(
        cls,
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        sqs_client: str | None = None,
    ) -> SQSTransport:
        """A transport bound to no queue yet: for account-wide calls, and ``open()``."""
        client, lean = _client(endpoint_url, region, 10, sqs_client)
        return cls(client, _placeholder(""), lean=lean)

    @classmethod
    def reopen(
        cls,
        info: QueueInfo,
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        sqs_client: str | None = None,
        max_connections: int = 10,
    ) -> SQSTransport:
        """The queue ``info`` describes, without asking SQS again (a copy in another process).
        ``max_connections``: at least the calls the caller has under way at once (a call
        beyond the pool opens a connection of its own and closes it after).

        The lean client learns the endpoint and the signing scope from a request botocore
        resolves and signs but does not send (``LeanSQS.prime``): the first calls are
        lean, and spend no request."""
        client, lean = _client(endpoint_url, region, max_connections, sqs_client)
        if lean is not None:
            lean.prime()
        return cls(client, info, lean=lean)

    def _bind(self, queue: str, *, owns_client: bool) -> SQSTransport:
        where = f"{self.client.meta.endpoint_url} (region {self.client.meta.region_name})"
        try:
            url = self._queue_url(queue)
            response = self._call(
                "GetQueueAttributes",
                self.client.get_queue_attributes,
                QueueUrl=url,
                AttributeNames=["All"],
            )
            raw = self._named(response, "GetQueueAttributes", "Attributes")
        except TransportError as exc:
            if exc.code in QUEUE_MISSING_CODES:
                raise QueueNotFound(
                    f"queue {queue!r} does not exist at {where}: create it, or check the queue "
                    "name, the region and the endpoint URL"
                ) from None
            if exc.code == "ConnectionError":
                raise StartupError(
                    f"could not reach SQS at {where}: {exc}; check the endpoint URL and network"
                ) from None
            raise StartupError(f"cannot use queue {queue!r} at {where}: {exc}") from None
        info = _queue_info(url, raw)
        return SQSTransport(
            self.client,
            info,
            requests=self.requests,
            request_errors=self.request_errors,
            attempts=self.attempts,
            owns_client=owns_client,
            lean=self.lean,
        )

    def _queue_url(self, queue: str) -> str:
        if queue.startswith(("https://", "http://")):
            named = _AWS_QUEUE_URL.match(queue)
            region = self.client.meta.region_name
            if named and named["region"] != region:
                raise StartupError(
                    f"the queue URL {queue} is in region {named['region']}, but the client is "
                    f"in {region}: set AWS_REGION={named['region']} or pass --region "
                    f"{named['region']}"
                )
            return queue
        kwargs: dict[str, str] = {}
        if queue.startswith("arn:"):
            parts = queue.split(":")
            if len(parts) != 6 or parts[2] != "sqs":
                raise StartupError(f"{queue!r} is not an SQS queue ARN")
            kwargs["QueueOwnerAWSAccountId"] = parts[4]
            queue = parts[5]
        response = self._call("GetQueueUrl", self.client.get_queue_url, QueueName=queue, **kwargs)
        return str(self._named(response, "GetQueueUrl", "QueueUrl"))

    def _named(self, response: Mapping[str, Any], action: str, key: str) -> Any:
        """``response[key]``; an answer without it (a 200 that is no SQS answer, a proxy's
        page botocore reads as an empty one) is a passing fault, never a KeyError."""
        if key not in response:
            raise TransportError(
                f"{action} was answered without {key}: check that "
                f"{self.client.meta.endpoint_url} is an SQS endpoint",
                code=UNANSWERED,
                retryable=True,
            )
        return response[key]

    def request(self, action: str, /, attempts: int | None = None, **kwargs: Any) -> Any:
        """Any SQS action by its API name (``"ListQueues"``), retried and translated as the
        transport's own calls are."""
        method = getattr(self.client, re.sub(r"(?<!^)(?=[A-Z])", "_", action).lower())
        return self._call(action, method, attempts, **kwargs)

    def _call(
        self, action: str, method: Callable[..., T], attempts: int | None = None, /, **kwargs: Any
    ) -> T:
        tries = Tries(self, action, attempts)
        while True:
            tries.begin()
            try:
                return method(**kwargs)
            except FAULTS as exc:
                delay = tries.failed(exc)
            time.sleep(delay)

    def _hot(self, action: str, method: Callable[..., T]) -> Callable[..., T]:
        """The lean client's ``action`` once it knows where and how to send, else botocore's."""
        lean = self.lean
        if lean is None or not lean.ready:
            return method
        return lambda **kwargs: lean.call(action, kwargs)  # type: ignore[return-value]

    # -- Transport -------------------------------------------------------------

    def receive(
        self,
        max_messages: int,
        wait_seconds: int,
        visibility_timeout: int,
        attempt_id: str | None = None,
    ) -> list[Envelope]:
        kwargs = self.receive_params(max_messages, wait_seconds, visibility_timeout, attempt_id)
        # One attempt: the caller dates the leases of what it returns from the start of
        # the attempt, so a retry must be the caller's (the worker's receive loop backs off).
        response = self._call(
            "ReceiveMessage", self._hot("ReceiveMessage", self.client.receive_message), 1, **kwargs
        )
        return envelopes(response)

    def receive_params(
        self, max_messages: int, wait_seconds: int, visibility_timeout: int, attempt_id: str | None
    ) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "QueueUrl": self.info.url,
            "MaxNumberOfMessages": max_messages,
            "WaitTimeSeconds": wait_seconds,
            "VisibilityTimeout": visibility_timeout,
            "MessageSystemAttributeNames": ["All"],
            "MessageAttributeNames": ["All"],
        }
        if attempt_id is not None and self.info.fifo:
            kwargs["ReceiveRequestAttemptId"] = attempt_id
        return kwargs

    def delete_batch(self, entries: Sequence[tuple[str, str]]) -> BatchResult:
        check_batch([entry_id for entry_id, _ in entries])
        response = self._call(
            "DeleteMessageBatch",
            self._hot("DeleteMessageBatch", self.client.delete_message_batch),
            QueueUrl=self.info.url,
            Entries=[{"Id": i, "ReceiptHandle": h} for i, h in entries],
        )
        return batch_result("DeleteMessageBatch", response, [i for i, _ in entries])

    def change_visibility_batch(self, entries: Sequence[tuple[str, str, int]]) -> BatchResult:
        check_batch([entry_id for entry_id, _, _ in entries])
        try:
            response = self._call(
                "ChangeMessageVisibilityBatch",
                self._hot(
                    "ChangeMessageVisibilityBatch", self.client.change_message_visibility_batch
                ),
                QueueUrl=self.info.url,
                Entries=_visibility_entries(entries),
            )
        except TransportError as exc:
            # Some endpoints refuse the whole call for one bad entry (e.g. past the 12-hour
            # cap). Split it, so the entry's neighbours are not refused with it.
            if exc.code not in ENTRY_FAULT_CODES:
                raise
            if len(entries) == 1:
                return BatchResult(failed=[EntryFailure(entries[0][0], exc.code, str(exc))])
            result = BatchResult()
            for entry in entries:
                part = self.change_visibility_batch([entry])
                result.succeeded += part.succeeded
                result.failed += part.failed
            return result
        return batch_result("ChangeMessageVisibilityBatch", response, [i for i, _, _ in entries])

    def send_batch(self, messages: Sequence[OutgoingMessage]) -> BatchResult:
        check_batch([str(i) for i in range(len(messages))])
        entries: list[dict[str, Any]] = []
        for index, message in enumerate(messages):
            entry: dict[str, Any] = {"Id": str(index), "MessageBody": message.body}
            if message.message_attributes:
                entry["MessageAttributes"] = dict(message.message_attributes)
            if message.delay_seconds:
                entry["DelaySeconds"] = message.delay_seconds
            if message.group_id is not None:
                entry["MessageGroupId"] = message.group_id
            if message.deduplication_id is not None:
                entry["MessageDeduplicationId"] = message.deduplication_id
            entries.append(entry)
        response = self._call(
            "SendMessageBatch",
            self._hot("SendMessageBatch", self.client.send_message_batch),
            QueueUrl=self.info.url,
            Entries=entries,
        )
        ids = [entry["Id"] for entry in entries]
        return batch_result("SendMessageBatch", response, ids, sends=True)

    def counts(self) -> QueueCounts:
        names = [
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed",
        ]
        response = self._call(
            "GetQueueAttributes",
            self.client.get_queue_attributes,
            QueueUrl=self.info.url,
            AttributeNames=names,
        )
        raw = self._named(response, "GetQueueAttributes", "Attributes")
        visible, in_flight, delayed = (int(raw.get(n, 0)) for n in names)
        return QueueCounts(visible, in_flight, delayed)

    # -- the hot calls, for code on an event loop -----------------------------------

    def receives_on_loop(self) -> bool:
        """Whether ``receive_async`` waits on no thread (the lean client, no proxy)."""
        lean = self.lean
        return lean is not None and lean.ready and lean.wire is not None

    async def receive_async(
        self,
        max_messages: int,
        wait_seconds: int,
        visibility_timeout: int,
        attempt_id: str | None = None,
    ) -> list[Envelope]:
        """``receive``, awaited: on the lean client's connections of the running loop."""
        kwargs = self.receive_params(max_messages, wait_seconds, visibility_timeout, attempt_id)
        method = self._hot_async("ReceiveMessage", self.client.receive_message)
        return envelopes(await self._call_async("ReceiveMessage", method, 1, **kwargs))

    async def delete_batch_async(self, entries: Sequence[tuple[str, str]]) -> BatchResult:
        check_batch([entry_id for entry_id, _ in entries])
        response = await self._call_async(
            "DeleteMessageBatch",
            self._hot_async("DeleteMessageBatch", self.client.delete_message_batch),
            QueueUrl=self.info.url,
            Entries=[{"Id": i, "ReceiptHandle": h} for i, h in entries],
        )
        return batch_result("DeleteMessageBatch", response, [i for i, _ in entries])

    async def change_visibility_batch_async(
        self, entries: Sequence[tuple[str, str, int]]
    ) -> BatchResult:
        check_batch([entry_id for entry_id, _, _ in entries])
        action = "ChangeMessageVisibilityBatch"
        try:
            response = await self._call_async(
                action,
                self._hot_async(action, self.client.change_message_visibility_batch),
                QueueUrl=self.info.url,
                Entries=_visibility_entries(entries),
            )
        except TransportError as exc:
            if exc.code not in ENTRY_FAULT_CODES:  # else split, as change_visibility_batch
                raise
            if len(entries) == 1:
                return BatchResult(failed=[EntryFailure(entries[0][0], exc.code, str(exc))])
            result = BatchResult()
            for entry in entries:
                part = await self.change_visibility_batch_async([entry])
                result.succeeded += part.succeeded
                result.failed += part.failed
            return result
        return batch_result(action, response, [i for i, _, _ in entries])

    def close_on_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Close ``loop``'s connections (on its thread, as it ends)."""
        if self.lean is not None:
            self.lean.close_loop_wire(loop)

    async def _call_async(
        self,
        action: str,
        method: Callable[..., Awaitable[T]],
        attempts: int | None = None,
        /,
        **kwargs: Any,
    ) -> T:
        tries = Tries(self, action, attempts)
        while True:
            tries.begin()
            try:
                return await method(**kwargs)
            except FAULTS as exc:
                delay = tries.failed(exc)
            await asyncio.sleep(delay)

    def _hot_async(self, action: str, method: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
        """The lean client's ``action`` on the running loop once it knows where and how
        to send, else botocore's call on a thread."""
        lean = self.lean
        if lean is not None and lean.ready:
            return lambda **kwargs: lean.call_async(action, kwargs)

        def on_thread(**kwargs: Any) -> Awaitable[Any]:
            call = functools.partial(method, **kwargs)
            return asyncio.get_running_loop().run_in_executor(None, call)

        return on_thread

    def open(self, queue: str) -> SQSTransport:
        return self._bind(queue, owns_client=False)

    def close(self) -> None:
        if self._owns_client:
            self.client.close()
            if self.lean is not None and self.lean.wire is not None:
                self.lean.wire.close()


_log = logging.getLogger("sqsworker.transport")

# What a try of a call may raise: botocore's faults, and its parser's on an answer of JSON
# in no shape SQS answers with.
FAULTS = (ClientError, BotoCoreError, AttributeError, TypeError, KeyError, ValueError, IndexError)


class Tries:
    """One call's tries (``attempts``, else the transport's): each counted, a failure
    translated, and retried after a backoff while it is retryable and tries are left. A
    call is ``unapplied`` only while no try of it may have been acted on."""

    def __init__(self, transport: SQSTransport, action: str, attempts: int | None) -> None:
        self.transport, self.action = transport, action
        self.attempts = attempts or transport.attempts
        self.attempt = 0
        self.reached = False  # a try may have been acted on: so may the call

    def begin(self) -> None:
        self.attempt += 1
        self.transport.requests[self.action] += 1

    def failed(self, exc: Exception) -> float:
        """The seconds to wait before the next try; raises the error when none is left."""
        action, errors = self.action, self.transport.request_errors
        if isinstance(exc, ClientError | BotoCoreError):
            error = translate(exc, action)
            code = getattr(error, "code", None) or type(error).__name__
            errors[action, code] += 1
            if isinstance(error, TransportError):
                self.reached = self.reached or not error.unapplied
                error.unapplied = not self.reached
            if not (isinstance(error, TransportError) and error.retryable):
                raise error from exc
        else:  # botocore's parser on a 200 of JSON in no shape SQS answers with
            error = unreadable(action, repr(exc))
            self.reached = True
            errors[action, UNANSWERED] += 1
        if self.attempt >= self.attempts:
            raise error from exc
        delay: float = min(RETRY_FIRST * 2.0 ** (self.attempt - 1), RETRY_MOST)
        delay += random.uniform(0, RETRY_JITTER)
        _log.warning(
            "SQS request failed; retrying (attempt %d) in %.2f s: %s", self.attempt, delay, error
        )
        return delay


_AWS_QUEUE_URL = re.compile(r"https://sqs\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(\.cn)?/")


def _client(
    endpoint_url: str | None, region: str | None, max_connections: int, sqs_client: str | None
) -> tuple[Any, LeanSQS | None]:
    """botocore's client, and the lean client of the hot calls riding on it (unless
    ``sqs_client`` is "boto3")."""
    sqs_client = sqs_client or DEFAULT_SQS_CLIENT
    if sqs_client not in SQS_CLIENTS:
        raise StartupError(
            f"the SQS client must be one of {', '.join(SQS_CLIENTS)}; got {sqs_client!r}"
        )
    config = Config(
        # one HTTP attempt per call ("max_attempts" would not count the first): retried
        # here instead, each attempt counted
        retries={"total_max_attempts": 1, "mode": "standard"},
        connect_timeout=5,
        read_timeout=MAX_WAIT_TIME + 10,  # longer than the longest long poll
        max_pool_connections=max_connections,
    )
    # boto3 reads AWS_DEFAULT_REGION; most AWS tools (and the Lambda runtime) set AWS_REGION.
    region = region or os.environ.get("AWS_REGION") or None
    session = boto3.session.Session()
    try:
        client = session.client("sqs", endpoint_url=endpoint_url, region_name=region, config=config)
    except NoRegionError:
        raise StartupError(
            "no AWS region was set: set AWS_REGION (or AWS_DEFAULT_REGION) or pass --region"
        ) from None
    except ValueError as exc:  # botocore's words for a malformed endpoint URL
        raise StartupError(f"the endpoint URL {endpoint_url!r} is not usable: {exc}") from None
    if sqs_client == "boto3":
        return client, None
    from .lean import LeanSQS

    # The session's credentials are the ones the client signs with (botocore's chain,
    # refreshed); frozen afresh for every lean request.
    return client, LeanSQS(client, session.get_credentials())


def _placeholder(queue: str) -> QueueInfo:
    return QueueInfo(url="", name=queue, arn="")


def _queue_info(url: str, raw: Mapping[str, str]) -> QueueInfo:
    redrive = json.loads(raw["RedrivePolicy"]) if raw.get("RedrivePolicy") else {}
    arn = raw.get("QueueArn", "")
    return QueueInfo(
        url=url,
        name=url.rstrip("/").rsplit("/", 1)[-1],
        arn=arn,
        fifo=raw.get("FifoQueue", "false").lower() == "true" or url.endswith(".fifo"),
        visibility_timeout=int(raw.get("VisibilityTimeout", 30)),
        maximum_message_size=int(raw.get("MaximumMessageSize", 1_048_576)),
        dead_letter_arn=redrive.get("deadLetterTargetArn"),
        max_receive_count=int(redrive["maxReceiveCount"]) if redrive else None,
        content_deduplication=raw.get("ContentBasedDeduplication", "false").lower() == "true",
    )


def _visibility_entries(entries: Sequence[tuple[str, str, int]]) -> list[dict[str, Any]]:
    return [{"Id": i, "ReceiptHandle": h, "VisibilityTimeout": s} for i, h, s in entries]
