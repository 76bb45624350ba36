"""The queues of one account and region, as ``sqsworker queues`` and ``purge`` see
them: listed with their depths and dead-letter queues, created with a redrive policy,
purged; and the names a queue and its dead-letter queue may have."""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, QueueNotFound, StartupError, TransportError
from ..transports import QueueInfo
from ..transports.sqs import SQSTransport

MAX_VISIBILITY = 43_200
MAX_RECEIVES_LIMIT = 1000  # a redrive policy's maxReceiveCount: 1 to 1000
DEFAULT_MAX_RECEIVES = 3
FIFO_SUFFIX = ".fifo"
QUEUE_NAME = re.compile(r"[A-Za-z0-9_-]{1,80}")


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
