"""Idempotency: a redelivered message never repeats a completed side effect.

Before a handler runs, the worker claims the message's key (``keys.py``) in the
store (``stores/``):

- no live record: the key is taken IN_PROGRESS, with a lease that ends when the
  message's visibility lease does; the lease thread renews both together, so a
  crashed worker's claim lapses exactly when SQS hands its message to another;
- COMPLETED: a duplicate, deleted without running the handler;
- IN_PROGRESS under another claim: the message is returned to the queue until
  that claim's lease ends, and checked again then;
- a live record with another payload hash: a conflict.

After success the record becomes COMPLETED for ``--idempotency-ttl``; after a
failure it is released, so the retry can run. A handler writing to the store's
own database can commit its writes and the completion in one transaction
(``message.transaction()``): then even a kill between the effect and the delete
cannot repeat the effect.
"""

from __future__ import annotations

import enum
import os
import socket
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .clock import Clock
from .keys import KeyPolicy, digest
from .stores import Lease, State, Store, TransactionalStore, open_store

if TYPE_CHECKING:
    from .config import WorkerConfig
    from .message import Message


class Verdict(enum.Enum):
    RUN = "run"
    DUPLICATE = "duplicate"  # completed before: delete without running
    BUSY = "busy"  # in progress under another claim: look again later
    CONFLICT = "conflict"  # the key is live with another payload


@dataclass(frozen=True)
class Admission:
    verdict: Verdict
    retry_in: float = 0.0  # for BUSY: seconds until the other claim's lease ends


class Claim:
    """A message's hold on its key: what renewals, completion and transactions need."""

    def __init__(self, guard: Idempotency, key: str, owner: str, digest: str) -> None:
        self.guard = guard
        self.key = key  # as the policy derived it
        self.record_key = f"{guard.namespace}/{key}"  # as the store holds it
        self.owner = owner
        self.digest = digest
        self.committed = False  # completed inside message.transaction()

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        store = self.guard.store
        if not isinstance(store, TransactionalStore):
            raise RuntimeError(
                f"message.transaction() needs a SQL idempotency store, and {store.url} is not "
                "one: run with --idempotency-store sqlite:///PATH.db"
            )
        if self.committed:
            raise RuntimeError("message.transaction() commits once per message; it already did")
        expires_at = self.guard.clock.time() + self.guard.ttl
        with store.transaction(self.record_key, self.owner, expires_at) as connection:
            yield connection
        self.committed = True


class Idempotency:
    def __init__(
        self, store: Store, policy: KeyPolicy, *, ttl: float, clock: Clock, namespace: str
    ) -> None:
        self.store = store
        self.policy = policy
        self.ttl = ttl
        self.clock = clock
        self.namespace = namespace  # the queue's name: keys of different queues never meet
        self._owner_prefix = f"{socket.gethostname()}/{os.getpid()}"

    @classmethod
    def open(cls, config: WorkerConfig, clock: Clock, namespace: str) -> Idempotency:
        """The store ``config`` names. Raises ``StartupError`` when it cannot be used."""
        assert config.idempotency_store is not None
        # DynamoDB's endpoint is boto3's (AWS_ENDPOINT_URL_DYNAMODB) or the URL's ?endpoint=.
        store = open_store(config.idempotency_store, region=config.region)
        return cls(
            store,
            config.idempotency_key,
            ttl=config.idempotency_ttl,
            clock=clock,
            namespace=namespace,
        )

    def admit(self, message: Message) -> Admission:
        """Claim the message's key. Raises ``IdempotencyKeyError`` or ``StoreError``."""
        key = self.policy(message)
        message.idempotency_key = key  # in every log line about it from now on
        claim = Claim(self, key, f"{self._owner_prefix}/{uuid.uuid4().hex[:12]}", digest(message))
        now = self.clock.time()
        record = self.store.claim(
            claim.record_key, claim.owner, claim.digest, now + message.lease.seconds_left, now
        )
        if record is None:
            message.idempotency = claim  # ours to renew, complete or release
            return Admission(Verdict.RUN)
        if record.digest != claim.digest:
            return Admission(Verdict.CONFLICT)
        if record.state is State.COMPLETED:
            return Admission(Verdict.DUPLICATE)
        return Admission(Verdict.BUSY, retry_in=record.expires_at - now)

    def renew(self, messages: Sequence[Message]) -> list[Message]:
        """Move the claims of messages whose lease was just renewed; returns those lost."""
        now = self.clock.time()
        claimed: dict[str, Message] = {}
        leases: list[Lease] = []
        for message in messages:
            claim = message.idempotency  # read once: a handler thread may release it meanwhile
            if claim is not None and not claim.committed:
                claimed[claim.record_key] = message
                expires_at = now + message.lease.seconds_left
                leases.append(Lease(claim.record_key, claim.owner, expires_at))
        if not leases:
            return []
        return [claimed[key] for key in self.store.renew(leases)]

    def complete(self, message: Message) -> bool:
        """Mark the key done after success; False if another claim had taken it meanwhile."""
        claim = message.idempotency
        if claim is None or claim.committed:
            return True
        now = self.clock.time()
        return self.store.complete(claim.record_key, claim.owner, claim.digest, now + self.ttl, now)

    def release(self, message: Message) -> None:
        """Forget the claim after a failure, so the retry can run."""
        claim = message.idempotency
        if claim is not None and not claim.committed:
            message.idempotency = None
            self.store.release(claim.record_key, claim.owner)

    def close(self) -> None:
        self.store.close()
