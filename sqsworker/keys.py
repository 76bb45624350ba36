"""Idempotency keys: the name of the side effect a message asks for.

Two messages with the same key ask for the same effect, so the second must not
repeat it. A ``KeyPolicy`` derives the key from a message; ``--idempotency-key``
picks one:

- ``auto`` (the default): the message attribute ``idempotency-key``; else, on a
  FIFO queue, the MessageDeduplicationId; else the MessageId;
- ``attribute:NAME``: the message attribute NAME, which every message must carry;
- ``json:EXPRESSION``: a JMESPath expression into the JSON body, e.g.
  ``json:order.id``;
- ``call:MODULE:ATTR``, or any callable given to ``@sqsworker.handler``: a function
  of the message returning the key.

A message whose key cannot be derived raises ``IdempotencyKeyError``, a
``Reject``: the same message can never yield a key, so it goes to the
dead-letter queue instead of being retried.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import jmespath
import jmespath.exceptions

from .errors import IdempotencyKeyError

if TYPE_CHECKING:
    from .message import Message

KEY_ATTRIBUTE = "idempotency-key"
MAX_KEY_LENGTH = 1024  # characters: well inside DynamoDB's 2 KiB partition key


class KeyPolicy(Protocol):
    def __call__(self, message: Message) -> str: ...


@dataclass(frozen=True)
class DefaultKey:
    """The ``idempotency-key`` attribute, else the FIFO deduplication id, else the message id."""

    def __call__(self, message: Message) -> str:
        if KEY_ATTRIBUTE in message.message_attributes:
            return AttributeKey(KEY_ATTRIBUTE)(message)
        # A FIFO queue's name ends in .fifo. Elsewhere a deduplication id means nothing
        # (SQS refuses one on a standard queue; moto keeps it): two messages sent with
        # one by mistake are two messages.
        if message.queue.endswith(".fifo") and message.deduplication_id:
            return message.deduplication_id
        return message.message_id

    def __str__(self) -> str:
        return "auto"


@dataclass(frozen=True)
class AttributeKey:
    name: str

    def __call__(self, message: Message) -> str:
        value = message.message_attributes.get(self.name)
        if value is None:
            raise IdempotencyKeyError(
                f"message {message.message_id} has no message attribute {self.name!r}, "
                "which --idempotency-key requires"
            )
        if isinstance(value, bytes):
            raise IdempotencyKeyError(
                f"message {message.message_id} has a Binary attribute {self.name!r}; "
                "an idempotency key must be a String or Number attribute"
            )
        return checked(value, message, f"attribute {self.name!r}")

    def __str__(self) -> str:
        return f"attribute:{self.name}"


@dataclass(frozen=True)
class JsonPathKey:
    expression: str

    def __post_init__(self) -> None:
        try:
            jmespath.compile(self.expression)
        except jmespath.exceptions.JMESPathError as exc:
            raise ValueError(
                f"has a JSON path that is not a JMESPath expression ({exc}); "
                "write it like json:order.id"
            ) from None

    def __call__(self, message: Message) -> str:
        try:
            body = json.loads(message.body)
        except Exception as exc:  # not JSON, or JSON nested past what the parser can read
            what = "is not JSON" if isinstance(exc, ValueError) else "nests JSON too deep to read"
            raise IdempotencyKeyError(
                f"message {message.message_id} has a body that {what}, so the idempotency "
                f"key {self.expression!r} cannot be read from it"
            ) from None
        value = jmespath.search(self.expression, body)
        if isinstance(value, bool) or not isinstance(value, str | int):
            found = "nothing" if value is None else f"a {type(value).__name__}"
            raise IdempotencyKeyError(
                f"the idempotency key {self.expression!r} of message {message.message_id} "
                f"is {found}; it must be a string or a whole number"
            )
        return checked(str(value), message, f"JSON path {self.expression!r}")

    def __str__(self) -> str:
        return f"json:{self.expression}"


@dataclass(frozen=True)
class CallableKey:
    func: Callable[[Message], Any]

    def __call__(self, message: Message) -> str:
        try:
            value = self.func(message)
        except Exception as exc:
            raise IdempotencyKeyError(
                f"the idempotency key function {self} raised on message {message.message_id}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if not isinstance(value, str):
            raise IdempotencyKeyError(
                f"the idempotency key function {self} returned a {type(value).__name__} for "
                f"message {message.message_id}; it must return a string"
            )
        return checked(value, message, f"function {self}")

    def __str__(self) -> str:
        module = getattr(self.func, "__module__", "?")
        return f"call:{module}:{getattr(self.func, '__qualname__', self.func)}"


def checked(key: str, message: Message, source: str) -> str:
    if not key:
        raise IdempotencyKeyError(
            f"the idempotency key of message {message.message_id} ({source}) is empty"
        )
    if len(key) > MAX_KEY_LENGTH:
        raise IdempotencyKeyError(
            f"the idempotency key of message {message.message_id} ({source}) is "
            f"{len(key)} characters long; the limit is {MAX_KEY_LENGTH}"
        )
    return key


def derive(policy: KeyPolicy, message: Message) -> str:
    """The message's key by ``policy``: ``IdempotencyKeyError`` (a ``Reject``) whatever the
    cause when it cannot be had, so no body a producer sends makes a key raise anything else."""
    try:
        key = policy(message)
        key.encode()  # a lone surrogate (JSON's "\ud800") is no text a store can hold
        return key
    except UnicodeEncodeError:
        raise IdempotencyKeyError(
            f"the idempotency key {policy} of message {message.message_id} is not valid "
            "Unicode text (it holds a lone surrogate), so no store can hold it"
        ) from None
    except IdempotencyKeyError:
        raise
    except Exception as exc:
        raise IdempotencyKeyError(
            f"the idempotency key {policy} of message {message.message_id} could not be "
            f"derived: {type(exc).__name__}: {str(exc)[:200]}"
        ) from None


def parse(raw: str) -> KeyPolicy:
    """``auto``, ``attribute:NAME``, ``json:EXPRESSION`` or ``call:MODULE:ATTR``."""
    text = raw.strip()
    kind, _, rest = text.partition(":")
    if text == "auto":
        return DefaultKey()
    if kind == "attribute" and rest:
        return AttributeKey(rest)
    if kind == "json" and rest:
        return JsonPathKey(rest)
    if kind == "call" and rest:
        from .importer import import_from_string

        func = import_from_string(rest)
        if not callable(func):
            raise ValueError(f"names {rest!r}, which is not a function of one message")
        return CallableKey(func)
    raise ValueError("must be auto, attribute:NAME, json:EXPRESSION or call:MODULE:ATTR")


def as_policy(value: KeyPolicy | str) -> KeyPolicy:
    """What ``@sqsworker.handler(idempotency_key=...)`` accepts: a policy string or a callable."""
    if isinstance(value, str):
        return parse(value)
    if isinstance(value, DefaultKey | AttributeKey | JsonPathKey | CallableKey):
        return value
    if callable(value):
        return CallableKey(value)
    raise ValueError("must be a policy string (auto, attribute:NAME, ...) or a function")


def digest(message: Message) -> str:
    """A hash of the payload: two messages with one key and different bodies conflict."""
    return hashlib.sha256(message.body.encode()).hexdigest()[:32]
