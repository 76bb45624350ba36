"""Where an offloaded message's body is: the S3 pointer in the wire format of AWS's
extended clients (payloads.py says more), read from a message's body and attributes."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import PayloadMissing

POINTER_CLASS = "software.amazon.payloadoffloading.PayloadS3Pointer"
LEGACY_POINTER_CLASS = "com.amazon.sqs.javamessaging.MessageS3Pointer"
SIZE_ATTRIBUTE = "ExtendedPayloadSize"
LEGACY_SIZE_ATTRIBUTE = "SQSLargePayloadSize"
KEY_ATTRIBUTE = "S3Key"  # a sender's own object key, as the extended clients take it


@dataclass(frozen=True)
class Pointer:
    bucket: str
    key: str

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


def is_offloaded(message_attributes: Mapping[str, Any]) -> bool:
    """True when a message says its body is in S3: it has the size attribute."""
    return SIZE_ATTRIBUTE in message_attributes or LEGACY_SIZE_ATTRIBUTE in message_attributes


def pointer_of(body: str, message_attributes: Mapping[str, Any]) -> Pointer | None:
    """Where an offloaded message's body is; None for a message that carries its body.

    A message is offloaded when it has the size attribute; then a body that is not a
    pointer raises ``PayloadMissing``.
    """
    if not is_offloaded(message_attributes):
        return None
    try:
        kind, place = json.loads(body)
        bucket, key = place["s3BucketName"], place["s3Key"]
    except Exception:  # any body a producer sent: nesting deep enough is a RecursionError
        bucket = key = kind = None
    if kind not in (POINTER_CLASS, LEGACY_POINTER_CLASS) or not (
        isinstance(bucket, str) and isinstance(key, str) and bucket and key
    ):
        raise PayloadMissing(
            f"the message has the {SIZE_ATTRIBUTE} attribute of an offloaded body, but its "
            f"body is not an S3 pointer ({body[:120]!r})"
        )
    return Pointer(bucket, key)
