"""Operating queues: what ``sqsworker queues``, ``send``, ``peek``, ``redrive`` and
``purge`` do, without the terminal (``cli.py`` draws the tables and progress bars).

Every SQS call goes through the boto3 transport, so these commands follow the same
credential, region and endpoint rules as ``sqsworker run``, and their errors read
the same. Input that cannot work raises ``ConfigError`` before anything is sent,
received or deleted.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import json
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError, QueueNotFound, StartupError, TransportError
from .keys import KEY_ATTRIBUTE
from .payloads import check_offloadable
from .transports import GROUP_ID, Envelope, OutgoingMessage, QueueInfo
from .transports.sqs import SQSTransport

MAX_BATCH = 10
MAX_VISIBILITY = 43_200
MAX_RECEIVES_LIMIT = 1000  # a redrive policy's maxReceiveCount: 1 to 1000
DEFAULT_MAX_RECEIVES = 3
FIFO_SUFFIX = ".fifo"
QUEUE_NAME = re.compile(r"[A-Za-z0-9_-]{1,80}")
MAX_REQUEST_BYTES = 1_048_576  # SendMessageBatch: the whole request's payload
MAX_DELAY = 900
MAX_MOVE_RATE = 500  # StartMessageMoveTask's MaxNumberOfMessagesPerSecond
PEEK_HOLD = 20  # seconds a peeked message would stay hidden if the hand-back failed
MOVE_HOLD = 60  # seconds a message being moved by hand stays hidden in the DLQ
# Answers of an endpoint that has no StartMessageMoveTask (moto answers 500).
UNSUPPORTED_CODES = frozenset(
    {"InvalidAction", "UnsupportedOperation", "NotImplemented", "UnknownOperationException", "500"}
)


@dataclass(frozen=True)
class QueueStatus:
    """One row of ``sqsworker queues``. SQS's counts are approximate (eventually
    consistent, a few seconds behind); SQS's API has no age of the oldest message
    (that is CloudWatch's ApproximateAgeOfOldestMessage)."""

    name: str
    url: str
    visible: int
    in_flight: int
    delayed: int
    fifo: bool
    visibility_timeout: int
    dead_letter_queue: str | None = None
    dead_letter_visible: int | None = None
    max_receive_count: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(frozen=True)
class Created:
    """What ``Queues.create`` did: the queue, whether it was made now (else it existed
    with the attributes asked for), and the same of its dead-letter queue."""

    queue: QueueInfo
    created: bool
    dead_letter_queue: Created | None = None


def default_max_receives(fifo: bool) -> int:
    """A new queue's maxReceiveCount unless one is given. On a FIFO queue a message handed
    back behind a failing one of its group uses up receives without running
    (docs/fifo.md): twice the attempts wanted, so it does not reach the dead-letter
    queue unrun alongside the failing one."""
    return DEFAULT_MAX_RECEIVES * 2 if fifo else DEFAULT_MAX_RECEIVES


def dead_letter_name(name: str) -> str:
    """``orders`` -> ``orders-dlq``, ``payments.fifo`` -> ``payments-dlq.fifo``."""
    fifo = name.endswith(FIFO_SUFFIX)
    return name.removesuffix(FIFO_SUFFIX) + "-dlq" + (FIFO_SUFFIX if fifo else "")


def check_queue_name(name: str, fifo: bool, what: str) -> None:
    """``ConfigError`` unless ``name`` is a queue name SQS accepts, of the kind ``fifo``."""
    base = name.removesuffix(FIFO_SUFFIX)
    if not QUEUE_NAME.fullmatch(base) or len(name) > 80:
        raise ConfigError(
            f"{what} {name!r} is not a queue name SQS accepts: up to 80 letters, digits, '-' "
            "and '_', '.fifo' included for a FIFO queue"
        )
    if fifo and not name.endswith(FIFO_SUFFIX):
        raise ConfigError(
            f"{what} {name!r} would be a FIFO queue, and a FIFO queue's name ends in .fifo: "
            f"name it {name}.fifo"
        )
    if not fifo and name.endswith(FIFO_SUFFIX):
        raise ConfigError(
            f"{what} {name!r} ends in .fifo, which only a FIFO queue's name may: a standard "
            f"queue's dead-letter queue is a standard queue (e.g. {base})"
        )


@dataclass
class SendReport:
    sent: int = 0
    failed: list[tuple[int, str, str]] = field(default_factory=list)  # index, code, message


@dataclass
class MoveReport:
    """What a move here did (a move by SQS reports through ListMessageMoveTasks)."""

    moved: int = 0
    failed: int = 0  # not copied: still in the DLQ only
    in_both: int = 0  # copied, but their delete from the DLQ failed
    status: str = "COMPLETED"  # or FAILED, or CANCELLED (Ctrl-C)
    error: str | None = None  # the failed call that stopped the move


class Queues:
    """The queues of one account and region, reached as ``sqsworker run`` reaches them."""

    def __init__(self, sqs: SQSTransport) -> None:
        self.sqs = sqs
        self._urls: dict[str, str] = {}  # by ARN, for dead-letter queues outside a listing

    @classmethod
    def connect(cls, *, endpoint_url: str | None = None, region: str | None = None) -> Queues:
        return cls(SQSTransport.connect_client(endpoint_url=endpoint_url, region=region))

    def open(self, queue: str) -> SQSTransport:
        """``queue`` (name, URL or ARN), or one sentence saying why it cannot be used (and,
        for a name misspelt, the name nearest it)."""
        try:
            return self.sqs.open(queue)
        except QueueNotFound as exc:
            near = self._nearest(queue)
            if near is None:
                raise
            raise QueueNotFound(f"{exc}; did you mean {near}?") from None

    def _nearest(self, queue: str) -> str | None:
        name = queue.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1]
        try:  # the first page is enough to catch a typo
            urls = self.sqs.request("ListQueues", MaxResults=1000).get("QueueUrls", [])
        except TransportError:
            return None
        names = [url.rstrip("/").rsplit("/", 1)[-1] for url in urls]
        near = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
        return near[0] if near else None

    def close(self) -> None:
        self.sqs.close()

    # -- queues ----------------------------------------------------------------------

    def status(self, prefix: str = "") -> list[QueueStatus]:
        urls = self._list(prefix)
        raw = {url: self._attributes(url) for url in urls}
        by_arn = {attrs.get("QueueArn"): url for url, attrs in raw.items()}
        rows = []
        for url, attrs in raw.items():
            redrive = json.loads(attrs["RedrivePolicy"]) if attrs.get("RedrivePolicy") else {}
            dlq_arn = redrive.get("deadLetterTargetArn")
            dlq_visible = None
            if dlq_arn:
                dlq_url = by_arn.get(dlq_arn) or self._url_of_arn(dlq_arn)
                if dlq_url is not None:
                    dlq_attrs = raw.get(dlq_url) or self._attributes(dlq_url)
                    dlq_visible = int(dlq_attrs.get("ApproximateNumberOfMessages", 0))
            rows.append(
                QueueStatus(
                    name=url.rstrip("/").rsplit("/", 1)[-1],
                    url=url,
                    visible=int(attrs.get("ApproximateNumberOfMessages", 0)),
                    in_flight=int(attrs.get("ApproximateNumberOfMessagesNotVisible", 0)),
                    delayed=int(attrs.get("ApproximateNumberOfMessagesDelayed", 0)),
                    fifo=attrs.get("FifoQueue", "false").lower() == "true",
                    visibility_timeout=int(attrs.get("VisibilityTimeout", 30)),
                    dead_letter_queue=dlq_arn.rsplit(":", 1)[-1] if dlq_arn else None,
                    dead_letter_visible=dlq_visible,
                    max_receive_count=int(redrive["maxReceiveCount"]) if redrive else None,
                )
            )
        return sorted(rows, key=lambda row: row.name)

    def _list(self, prefix: str) -> list[str]:
        kwargs = {"QueueNamePrefix": prefix} if prefix else {}
        return _all_pages(self.sqs, "ListQueues", "QueueUrls", **kwargs)

    def _attributes(self, url: str) -> dict[str, str]:
        try:
            answer = self.sqs.request("GetQueueAttributes", QueueUrl=url, AttributeNames=["All"])
        except TransportError as exc:
            if exc.code in ("QueueDoesNotExist", "NonExistentQueue"):
                return {}  # deleted since it was listed
            raise
        return dict(answer.get("Attributes", {}))

    def _url_of_arn(self, arn: str) -> str | None:
        if arn not in self._urls:  # a queue's URL does not change: ask once
            try:
                self._urls[arn] = self.sqs.open(arn).info.url  # no nearest-name lookup
            except StartupError:
                return None
        return self._urls[arn]

    # -- create -----------------------------------------------------------------------

    def create(
        self,
        name: str,
        *,
        fifo: bool = False,
        dead_letter_queue: str | None = None,
        max_receives: int | None = None,
        visibility_timeout: int | None = None,
    ) -> Created:
        """Create the queue ``name`` (FIFO if ``fifo`` or its name ends in ``.fifo``) and,
        with ``dead_letter_queue``, that queue too unless it exists, with a redrive policy
        of ``max_receives`` (default: ``default_max_receives``). A queue that exists with
        these attributes is left as it is; with others, ``ConfigError``."""
        fifo = fifo or name.endswith(FIFO_SUFFIX)
        check_queue_name(name, fifo, "the queue")
        if visibility_timeout is not None and not 0 <= visibility_timeout <= MAX_VISIBILITY:
            raise ConfigError(
                f"--visibility-timeout {visibility_timeout} is out of range: SQS takes 0 to "
                "43200 seconds"
            )
        if max_receives is not None and dead_letter_queue is None:
            raise ConfigError(
                "--max-receives needs --dead-letter-queue NAME: the queue a message moves to "
                "after that many receives"
            )
        if max_receives is not None and not 1 <= max_receives <= MAX_RECEIVES_LIMIT:
            raise ConfigError(
                f"--max-receives {max_receives} is out of range: SQS takes 1 to "
                f"{MAX_RECEIVES_LIMIT}"
            )
        attributes = {"FifoQueue": "true"} if fifo else {}
        if visibility_timeout is not None:
            attributes["VisibilityTimeout"] = str(visibility_timeout)
        dlq: Created | None = None
        if dead_letter_queue is not None:
            if dead_letter_queue == name:
                raise ConfigError(
                    f"--dead-letter-queue names {name} itself: name another queue (e.g. "
                    f"{dead_letter_name(name)})"
                )
            check_queue_name(dead_letter_queue, fifo, "--dead-letter-queue")
            dlq = self._created(dead_letter_queue, {"FifoQueue": "true"} if fifo else {})
            if dlq.queue.fifo != fifo:
                kind = "a FIFO queue" if dlq.queue.fifo else "a standard queue"
                raise ConfigError(
                    f"the dead-letter queue {dead_letter_queue} is {kind}, and a "
                    f"{'FIFO' if fifo else 'standard'} queue's must be of its kind"
                )
            max_receives = max_receives or default_max_receives(fifo)
            attributes["RedrivePolicy"] = json.dumps(
                {"deadLetterTargetArn": dlq.queue.arn, "maxReceiveCount": max_receives}
            )
        made = self._created(name, attributes)
        return Created(made.queue, made.created, dlq)

    def _created(self, name: str, attributes: dict[str, str]) -> Created:
        """``name`` created with ``attributes``, or as it is if it exists with them."""
        try:
            self.sqs.open(name)
            existed = True
        except QueueNotFound:
            existed = False
        try:
            url = self.sqs.request("CreateQueue", QueueName=name, Attributes=attributes)
        except TransportError as exc:
            if exc.code in ("QueueAlreadyExists", "QueueNameExists"):
                raise ConfigError(
                    f"the queue {name} exists with other attributes than these ("
                    + ", ".join(f"{k}={v}" for k, v in attributes.items() if k != "FifoQueue")
                    + "): change them with SetQueueAttributes (the AWS console or CLI), or "
                    "choose another name"
                ) from None
            raise
        return Created(self.sqs.open(str(url["QueueUrl"])).info, not existed)

    # -- purge ------------------------------------------------------------------------

    def purge(self, queue: SQSTransport) -> None:
        try:
            queue.request("PurgeQueue", QueueUrl=queue.info.url)
        except TransportError as exc:
            if exc.code == "PurgeQueueInProgress":
                raise TransportError(
                    f"{queue.info.name} was purged less than 60 seconds ago, and SQS allows one "
                    "purge per queue every 60 seconds: try again in a minute",
                    code=exc.code,
                ) from None
            raise

    # -- dead-letter queues -----------------------------------------------------------

    def sources_of(self, dlq: SQSTransport) -> list[str]:
        """The URLs of the queues whose redrive policy names ``dlq``."""
        return _all_pages(dlq, "ListDeadLetterSourceQueues", "queueUrls", QueueUrl=dlq.info.url)


def _all_pages(sqs: SQSTransport, action: str, key: str, **kwargs: Any) -> list[str]:
    """Every item under ``key`` of a paged SQS list action, page after page."""
    items: list[str] = []
    kwargs["MaxResults"] = 1000
    while True:
        page = sqs.request(action, **kwargs)
        items += page.get(key, [])
        if not page.get("NextToken"):
            return items
        kwargs["NextToken"] = page["NextToken"]


# -- send -------------------------------------------------------------------------------


_ATTRIBUTE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,256}")
# The characters SQS accepts in a body or attribute value (the rest are refused).
_REFUSED_CHARACTER = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def parse_attribute(text: str) -> tuple[str, dict[str, str]]:
    """``NAME=VALUE`` (a String) or ``NAME:Number=VALUE`` as an SQS message attribute,
    checked as SQS checks it."""
    name, equals, value = text.partition("=")
    if not equals or not name:
        raise ConfigError(f"the attribute {text!r} has no '=': write it as NAME=VALUE")
    name, _, kind = name.partition(":")
    kind = kind or "String"
    if kind.split(".", 1)[0] not in ("String", "Number"):
        raise ConfigError(
            f"the attribute {text!r} has the type {kind!r}: use String or Number "
            "(NAME=VALUE or NAME:Number=VALUE)"
        )
    if (
        not _ATTRIBUTE_NAME.fullmatch(name)
        or name.startswith(".")
        or name.endswith(".")
        or ".." in name
        or name.lower().startswith(("aws.", "amazon."))
    ):
        raise ConfigError(
            f"the attribute name {name!r} is not one SQS accepts: use letters, digits, "
            "'_', '-' and '.' (not first, last or doubled), not starting with AWS. or Amazon."
        )
    if not value:
        raise ConfigError(f"the attribute {name!r} has no value: SQS refuses an empty one")
    if kind.startswith("Number"):
        try:
            float(value)
        except ValueError:
            raise ConfigError(f"the attribute {name!r} is a Number, but {value!r} is not") from None
    return name, {"DataType": kind, "StringValue": value}


def outgoing(
    info: QueueInfo,
    bodies: Iterable[str],
    *,
    attributes: Sequence[str] = (),
    group_id: str | None = None,
    dedup_id: str | None = None,
    delay: int = 0,
    idempotency_key: str | None = None,
    offload_over: int | None = None,
) -> list[OutgoingMessage]:
    """The messages to send, every one checked against what ``info``'s queue accepts.

    ``offload_over``: messages larger than this many bytes will have their body put in
    S3 (``Payloads.offload``), so they may be larger than the queue takes.
    """
    message_attributes = dict(parse_attribute(a) for a in attributes)
    if idempotency_key is not None:
        message_attributes[KEY_ATTRIBUTE] = {"DataType": "String", "StringValue": idempotency_key}
    if len(message_attributes) > 10:
        raise ConfigError(
            f"{len(message_attributes)} message attributes were given; SQS takes at most 10"
        )
    if group_id is not None and not GROUP_ID.match(group_id):
        raise ConfigError(
            f"--group-id {group_id!r} is not one SQS takes: 1 to 128 letters, digits or "
            "punctuation, no spaces"
        )
    if info.fifo:
        if group_id is None:
            raise ConfigError(
                f"{info.name} is a FIFO queue: pass --group-id (the message group, e.g. an "
                "order or customer id)"
            )
        if dedup_id is None and not info.content_deduplication:
            raise ConfigError(
                f"{info.name} is a FIFO queue without content-based deduplication: pass "
                "--dedup-id, or enable ContentBasedDeduplication on the queue"
            )
        if delay:
            raise ConfigError(
                f"{info.name} is a FIFO queue, which has no per-message delay: drop --delay "
                "(or set the queue's DelaySeconds)"
            )
    elif dedup_id is not None:
        raise ConfigError(f"{info.name} is a standard queue: --dedup-id is for FIFO queues")
    if not 0 <= delay <= MAX_DELAY:
        raise ConfigError(f"--delay {delay} is out of range: SQS delays 0 to 900 seconds")
    messages = [
        OutgoingMessage(
            body,
            message_attributes=message_attributes,
            delay_seconds=delay,
            group_id=group_id,
            deduplication_id=dedup_id,
        )
        for body in bodies
    ]
    if dedup_id is not None and len(messages) > 1:
        raise ConfigError(
            f"--dedup-id names one message, and {len(messages)} were given: SQS would keep "
            "the first and drop the rest as duplicates; send them one at a time"
        )
    for index, message in enumerate(messages, 1):
        _check(index, message, info, offload_over)
    return messages


def _check(
    index: int, message: OutgoingMessage, info: QueueInfo, offload_over: int | None = None
) -> None:
    if not message.body:
        raise ConfigError(f"message {index} is empty: SQS does not accept an empty body")
    for text in [
        message.body,
        *(str(v.get("StringValue", "")) for v in message.message_attributes.values()),
    ]:
        refused = _REFUSED_CHARACTER.search(text)
        if refused:
            raise ConfigError(
                f"message {index} holds a character SQS refuses (U+{ord(refused[0]):04X} at "
                f"position {refused.start() + 1}): SQS takes Unicode text without control "
                "characters other than tab and line breaks"
            )
    size = message.size
    if offload_over is not None and size > offload_over:
        try:
            check_offloadable(message)
        except ConfigError as exc:
            raise ConfigError(f"message {index} cannot be offloaded to S3: {exc}") from None
    elif size > info.maximum_message_size:
        raise ConfigError(
            f"message {index} is {size:,} bytes with its attributes; {info.name} takes at "
            f"most {info.maximum_message_size:,}: send a smaller body, or put bodies this "
            "large in S3 with --payload-bucket BUCKET"
        )


def batches(messages: Sequence[OutgoingMessage]) -> Iterator[list[OutgoingMessage]]:
    """Batches of at most 10 messages and 1 MiB in all, in order."""
    batch: list[OutgoingMessage] = []
    size = 0
    for message in messages:
        length = message.size
        if batch and (len(batch) == MAX_BATCH or size + length > MAX_REQUEST_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(message)
        size += length
    if batch:
        yield batch


def send(
    queue: SQSTransport,
    messages: Sequence[OutgoingMessage],
    progress: Callable[[int], None] = lambda sent: None,
) -> SendReport:
    """Send ``messages`` in batches; every entry SQS refused is reported by its index."""
    report = SendReport()
    first = 0
    for batch in batches(messages):
        try:
            result = queue.send_batch(batch)
        except TransportError as exc:
            if not report.sent:
                raise
            raise TransportError(
                f"{exc}; {report.sent} of {len(messages)} messages were sent before it "
                f"(messages 1 to {first}; message {first + 1} and on were not)",
                code=exc.code,
            ) from exc
        report.sent += len(result.succeeded)
        for failure in result.failed:
            report.failed.append((first + int(failure.id) + 1, failure.code, failure.message))
        first += len(batch)
        progress(len(batch))
    return report


# -- peek -------------------------------------------------------------------------------


def refuse_peek(info: QueueInfo) -> str | None:
    """Why a peek of ``info``'s queue could do harm (None when it cannot)."""
    if info.dead_letter_arn is None:
        return None
    dlq = info.dead_letter_arn.rsplit(":", 1)[-1]
    return (
        f"a peek is a receive: on {info.name} it adds one to each message's receive count, "
        f"and a message at its maxReceiveCount ({info.max_receive_count}) would move to {dlq}. "
        "Peek the dead-letter queue instead, or pass --force"
    )


def peek(queue: SQSTransport, count: int, *, wait: int = 1) -> list[Envelope]:
    """Receive up to ``count`` messages and hand every one back at once (visible again)."""
    seen: list[Envelope] = []
    try:
        while len(seen) < count:
            got = queue.receive(min(MAX_BATCH, count - len(seen)), wait, PEEK_HOLD)
            if not got:
                break
            seen += got
    finally:
        hand_back(queue, seen)
    return seen


REJECTED_ATTRIBUTE = "sqsworker-error"  # set by a worker on the copy of a rejected message
SOURCE_ARN = "DeadLetterQueueSourceArn"  # set by SQS on a message it moved (not by moto)


def dead_letter_reasons(
    queues: Queues, dlq: SQSTransport, messages: Sequence[Envelope]
) -> dict[str, str]:
    """Why each of ``messages``, received from ``dlq``, is there, by message id: a worker
    rejected it (it carries the error), or SQS moved it from a source queue after that
    queue's maxReceiveCount receives. Empty when ``dlq`` is no queue's dead-letter queue
    and no message says where it came from."""
    sources: dict[str, QueueInfo] = {}  # by ARN
    for url in queues.sources_of(dlq):
        info = queues.sqs.open(url).info
        sources[info.arn] = info
    reasons = {}
    for message in messages:
        if REJECTED_ATTRIBUTE in message.message_attributes:
            reasons[message.message_id] = (
                "a worker rejected it (the handler error below) and sent it here at once"
            )
            continue
        arn = message.attributes.get(SOURCE_ARN)
        if arn and arn not in sources:
            with contextlib.suppress(StartupError):  # deleted since: its name still says
                sources[arn] = queues.sqs.open(arn).info
        from_ = [sources[arn]] if arn in sources else list(sources.values())
        if not from_:
            if arn:
                reasons[message.message_id] = f"SQS moved it from {arn.rsplit(':', 1)[-1]}"
            continue
        received = message.attributes.get("ApproximateReceiveCount", "?")
        if len(from_) == 1:
            where = f"{from_[0].name}, whose maxReceiveCount is {from_[0].max_receive_count}"
        else:
            names = ", ".join(info.name for info in from_)
            limits = ", ".join(str(info.max_receive_count) for info in from_)
            where = f"one of {names} (maxReceiveCount {limits})"
        reasons[message.message_id] = (
            f"SQS moved it from {where}: received {received} times, this peek included"
        )
    return reasons


def hand_back(queue: SQSTransport, messages: Sequence[Envelope]) -> None:
    for first in range(0, len(messages), MAX_BATCH):
        part = messages[first : first + MAX_BATCH]
        queue.change_visibility_batch([(str(i), m.receipt_handle, 0) for i, m in enumerate(part)])


# -- redrive ----------------------------------------------------------------------------


class Redrive:
    """Move a dead-letter queue's messages back: by SQS (StartMessageMoveTask) where the
    endpoint has it, else here (receive, send, then delete only what was sent)."""

    def __init__(
        self,
        queues: Queues,
        dlq: SQSTransport,
        destination: SQSTransport | None,
        *,
        rate: int | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if rate is not None and not 1 <= rate <= MAX_MOVE_RATE:
            raise ConfigError(f"--rate {rate} is out of range: SQS moves 1 to 500 messages/s")
        if destination is not None and destination.info.arn == dlq.info.arn:
            raise ConfigError(
                f"--to names {dlq.info.name} itself: name the queue the messages go back to"
            )
        self.queues = queues
        self.dlq = dlq
        self.rate = rate
        self.sleep = sleep
        sources = queues.sources_of(dlq)
        if not sources:
            raise ConfigError(
                f"{dlq.info.name} is not the dead-letter queue of any queue: redrive moves "
                "messages out of a dead-letter queue; name the queue's DLQ"
            )
        if destination is None and len(sources) == 1:
            destination = queues.open(sources[0])
        self.destination = destination
        self.sources = sources
        self._earlier = 0  # the newest StartedTimestamp of the tasks before ours

    @property
    def destination_name(self) -> str:
        if self.destination is not None:
            return self.destination.info.name
        return "the queues they came from"

    def pending(self) -> int:
        return self.dlq.counts().visible

    # -- by SQS -------------------------------------------------------------------------

    def start(self) -> str | None:
        """Start SQS's move task; its handle, or None when the endpoint has no move tasks."""
        try:
            tasks = self._tasks()
        except TransportError as exc:
            if exc.code in UNSUPPORTED_CODES:
                return None  # nothing was started: the move can go here
            raise
        running = next((t for t in tasks if t.get("Status") == "RUNNING"), None)
        if running is not None:
            raise ConfigError(
                f"a redrive of {self.dlq.info.name} is already running (SQS allows one per "
                f"queue; {running.get('ApproximateNumberOfMessagesMoved', 0)} moved so far): "
                "wait for it to finish, or cancel it with Ctrl-C where it was started"
            )
        self._earlier = max((int(t.get("StartedTimestamp", 0)) for t in tasks), default=0)
        kwargs: dict[str, Any] = {"SourceArn": self.dlq.info.arn}
        if self.destination is not None:
            kwargs["DestinationArn"] = self.destination.info.arn
        if self.rate is not None:
            kwargs["MaxNumberOfMessagesPerSecond"] = self.rate
        # One attempt: a retried start could find its own first attempt running.
        try:
            answer = self.dlq.request("StartMessageMoveTask", 1, **kwargs)
        except TransportError as exc:
            raise TransportError(
                f"{exc}; --client-side moves the messages here instead", code=exc.code
            ) from exc
        return str(answer["TaskHandle"])

    def task(self, handle: str) -> dict[str, Any]:
        """Our task as ListMessageMoveTasks shows it: by its handle while it runs; once it
        ended SQS shows no handle, so the task started after every one seen before ours.
        Not listed yet: taken as running."""
        tasks = self._tasks()
        for task in tasks:
            if task.get("TaskHandle") == handle:
                return task
        ours = [t for t in tasks if int(t.get("StartedTimestamp", 0)) > self._earlier]
        if not ours:
            return {"Status": "RUNNING"}
        return max(ours, key=lambda t: int(t.get("StartedTimestamp", 0)))

    def cancel(self, handle: str) -> int:
        answer = self.dlq.request("CancelMessageMoveTask", TaskHandle=handle)
        return int(answer.get("ApproximateNumberOfMessagesMoved", 0))

    def _tasks(self) -> list[dict[str, Any]]:
        answer = self.dlq.request("ListMessageMoveTasks", 1, SourceArn=self.dlq.info.arn)
        return list(answer.get("Results", []))

    # -- here ---------------------------------------------------------------------------

    def check_here(self) -> None:
        """Refuse a move here that could not tell where each message goes."""
        if self.destination is None:
            raise ConfigError(
                f"{self.dlq.info.name} is the dead-letter queue of {len(self.sources)} queues; "
                "this endpoint cannot route each message back to its own: name one with --to"
            )

    def move_here(
        self,
        progress: Callable[[int], None] = lambda moved: None,
        stop: Callable[[], bool] = lambda: False,
        limit: int | None = None,
    ) -> MoveReport:
        """Receive from the DLQ, send to the destination, delete what was sent: at most
        ``limit`` messages (the DLQ's count at the start, so messages that come back to the
        DLQ during the move are not moved round again), until the DLQ answers empty,
        ``stop()`` says so, or a call fails. A crash between a send and its delete leaves
        the message in both queues."""
        self.check_here()
        assert self.destination is not None
        report = MoveReport()
        began = time.monotonic()
        received = 0
        while not stop():
            want = MAX_BATCH if limit is None else min(MAX_BATCH, limit - received)
            if want <= 0:
                break
            try:
                got = self.dlq.receive(want, 1, MOVE_HOLD)
            except TransportError as exc:
                report.status, report.error = "FAILED", str(exc)
                break
            if not got:
                break
            received += len(got)
            moved, kept, error = self._move(got)
            report.moved += moved
            report.failed += len(got) - moved
            report.in_both += kept
            progress(moved)
            if moved < len(got) or kept or error:
                report.status, report.error = "FAILED", error
                break
            if self.rate is not None:  # no faster than --rate on average
                ahead = report.moved / self.rate - (time.monotonic() - began)
                if ahead > 0:
                    self.sleep(ahead)
        else:  # stop() said so (Ctrl-C): what was received is moved or handed back
            report.status = "CANCELLED"
        return report

    def _move(self, messages: Sequence[Envelope]) -> tuple[int, int, str | None]:
        """Send copies of ``messages`` on, then delete those SQS acknowledged; the rest are
        handed back at once. Returns how many were copied, how many of those are still in
        the DLQ too (their delete failed), and the error that stopped it, if one did."""
        assert self.destination is not None
        fifo = self.destination.info.fifo
        copies = [
            OutgoingMessage(
                m.body,
                message_attributes=m.message_attributes,
                # A fair queue's tenant stays with its message; a FIFO queue needs a group.
                group_id=m.attributes.get("MessageGroupId") or ("redrive" if fifo else None),
                # Not the message's own deduplication id: SQS would drop a copy sent within
                # 5 minutes of the original as a duplicate, and the delete would then lose
                # it. One id per receive: a retry of this send is still deduplicated.
                deduplication_id=hashlib.sha256(m.receipt_handle.encode()).hexdigest()
                if fifo
                else None,
            )
            for m in messages
        ]
        sent: list[int] = []
        error = None
        first = 0
        try:
            for part in batches(copies):  # large bodies: more than one request
                result = self.destination.send_batch(part)
                sent += [first + int(i) for i in result.succeeded]
                first += len(part)
        except TransportError as exc:
            error = str(exc)
        copied = [messages[i] for i in sorted(sent)]
        with contextlib.suppress(TransportError):  # else visible again after MOVE_HOLD
            hand_back(self.dlq, [m for i, m in enumerate(messages) if i not in sent])
        if not copied:
            return 0, 0, error
        try:
            deleted = self.dlq.delete_batch(
                [(str(i), m.receipt_handle) for i, m in enumerate(copied)]
            )
            kept = len(deleted.failed)
        except TransportError as exc:  # each copy was sent: they are in both queues
            kept, error = len(copied), error or str(exc)
        return len(copied), kept, error
