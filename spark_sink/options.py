"""The options of ``format("sqs")``, checked once, with one sentence for each mistake."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass

from sqsworker.config import BUCKET_NAME, MAX_VISIBILITY, MAX_WAIT_TIME

from .wal import LogUnusable, parse_place


class SQSOptionError(ValueError):
    """An option of the sqs source or sink cannot work; the message says how to fix it."""


@dataclass(frozen=True)
class SourceOptions:
    queue: str
    wal_path: str
    region: str | None = None
    endpoint_url: str | None = None
    max_messages_per_batch: int = 1000
    num_partitions: int = 2
    visibility_timeout: int = 120
    wait_time_seconds: int = 1
    receives_in_flight: int = 8  # a partition's receives under way at once, after its first
    # Offloaded bodies are fetched from S3; given, the only bucket they are fetched from.
    payload_bucket: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        _refuse_unknown(options, SOURCE_OPTIONS)
        given = {k.lower(): v for k, v in options.items()}  # Spark's options ignore case
        queue = _required(given, "queue", "the queue's name or URL", "orders")
        wal_path = _required(
            given,
            "walPath",
            "s3://bucket/prefix, or a folder the driver and every executor share; one per query",
            "s3://my-bucket/orders-query/wal",
        )
        try:
            parse_place(wal_path)
        except LogUnusable as exc:
            raise SQSOptionError(str(exc)) from None
        visibility = _int(given, "visibilityTimeout", 120, 1, MAX_VISIBILITY)
        wait = _int(given, "waitTimeSeconds", 1, 0, MAX_WAIT_TIME)
        if wait * 6 > visibility:
            # A lease counts from when its receive began, and a first receive waits up to
            # waitTimeSeconds: the driver renews at half the timeout, and needs a sixth.
            raise SQSOptionError(
                f"the sqs option 'waitTimeSeconds' ({wait}) must be at most a sixth of "
                f"'visibilityTimeout' ({visibility}), or a receive's wait uses up the "
                f"lease: use waitTimeSeconds {visibility // 6} or a longer visibilityTimeout"
            )
        return cls(
            queue=queue,
            wal_path=wal_path,
            payload_bucket=_bucket(given),
            region=given.get("region") or None,
            endpoint_url=given.get("endpointurl") or None,
            max_messages_per_batch=_int(given, "maxMessagesPerBatch", 1000, 1, 1_000_000),
            num_partitions=_int(given, "numPartitions", 2, 1, 1000),
            visibility_timeout=visibility,
            wait_time_seconds=wait,
            receives_in_flight=_int(given, "receivesInFlight", 8, 1, 16),
        )


@dataclass(frozen=True)
class SinkOptions:
    queue: str
    region: str | None = None
    endpoint_url: str | None = None
    # Bodies over the threshold (bytes, attributes counted; None: the queue's
    # MaximumMessageSize) go to this S3 bucket, and the message is a pointer to them.
    payload_bucket: str | None = None
    payload_threshold: int | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        given = {k.lower(): v for k, v in options.items()}
        bucket = _bucket(given)
        threshold = None
        if "payloadthreshold" in given:
            if bucket is None:
                raise SQSOptionError(
                    "the sqs option 'payloadThreshold' needs 'payloadBucket': where to put "
                    "the bodies over it"
                )
            threshold = _int(given, "payloadThreshold", 0, 0, 1_048_576)
        return cls(
            queue=_required(given, "queue", "the queue's name or URL", "orders"),
            region=given.get("region") or None,
            endpoint_url=given.get("endpointurl") or None,
            payload_bucket=bucket,
            payload_threshold=threshold,
        )


SOURCE_OPTIONS = (
    "queue",
    "walPath",
    "region",
    "endpointUrl",
    "maxMessagesPerBatch",
    "numPartitions",
    "visibilityTimeout",
    "waitTimeSeconds",
    "receivesInFlight",
    "payloadBucket",
)


def _refuse_unknown(options: Mapping[str, str], known: tuple[str, ...]) -> None:
    """An option nobody reads is a mistake said nowhere (a misspelt visibilityTimeout
    keeps the default lease): refused, with the likeliest meant."""
    names = {name.lower(): name for name in known}
    for given in options:
        if given.lower() in names:
            continue
        close = difflib.get_close_matches(given.lower(), list(names), n=1)
        meant = f" (did you mean {names[close[0]]!r}?)" if close else ""
        raise SQSOptionError(
            f"the sqs source has no option {given!r}{meant}; its options are {', '.join(known)}"
        )


def _bucket(given: Mapping[str, str]) -> str | None:
    bucket = (given.get("payloadbucket") or "").strip() or None
    if bucket is not None and not BUCKET_NAME.match(bucket):
        raise SQSOptionError(
            f"the sqs option 'payloadBucket' must be an S3 bucket name (3-63 lowercase "
            f"letters, digits, dots and hyphens); got {bucket!r}"
        )
    return bucket


def _required(given: Mapping[str, str], name: str, what: str, example: str) -> str:
    value = (given.get(name.lower()) or "").strip()
    if not value:
        raise SQSOptionError(
            f"the sqs option {name!r} is missing: give {what}, e.g. .option({name!r}, {example!r})"
        )
    return value


def _int(given: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = given.get(name.lower())
    if raw is None:
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise SQSOptionError(
            f"the sqs option {name!r} must be a whole number from {low} to {high}; got {raw!r}"
        ) from None
    if not low <= value <= high:
        raise SQSOptionError(
            f"the sqs option {name!r} must be from {low} to {high}; got {value}"
            + (" (SQS's 12-hour limit)" if high == MAX_VISIBILITY else "")
        )
    return value
