"""Handlers the end-to-end tests run in real `sqsworker run` processes.

``work``: each run appends lines to the ledger file named by $LEDGER (appends of
one short line are atomic, so several processes can share it): "start KIND ID
RECEIVE PID" and "done KIND ID RECEIVE PID". The body's "sleep" is seconds to
take; kind "fail" always raises, "fail_once" raises on the first receive.
``work_too`` is the same, for a second queue served by the same process;
``work_async`` the same as an ``async def``, sleeping with ``asyncio.sleep``;
``work_in_thread`` an ``async def`` sleeping in ``asyncio.to_thread(time.sleep, ...)``.

``typed`` and ``typed_async``: given the body as a pydantic model (``Order``) or a
dataclass (``OrderData``) and, the second, the message: "done KIND ID ...".

``collector``: appends "gc YOUNG FROZEN": the cyclic garbage collector's young threshold
and the number of objects frozen, as the handler's process has them.

``measure``: appends the SHA-256 and the length of the body it was given to $LEDGER.

``traced``: opens a span of its own (OpenTelemetry) and logs a line inside it.

``pay``: a transactional handler. It inserts one row per run into the table
``effects`` of the idempotency store's own database (SQLite or PostgreSQL), inside
``message.transaction()``. A body with ``"hold": true`` then waits, after the
commit and before returning, until the file ``$HOLD_DIR/<key>.release`` exists,
so a test can stop or kill the process between the effect and the delete.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import hashlib
import os
import time
from pathlib import Path

import pydantic

import sqsworker


def _record(event: str, body: dict[str, object], message: sqsworker.Message) -> None:
    line = f"{event} {body['kind']} {body['id']} {message.receive_count} {os.getpid()}\n"
    fd = os.open(os.environ["LEDGER"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _finish(body: dict[str, object], message: sqsworker.Message) -> None:
    """Fail as the body asks ("fail" always, "fail_once" on the first receive), else done."""
    if body["kind"] == "fail":
        raise RuntimeError(f"order {body['id']} cannot be processed")
    if body.get("fail_once") and message.receive_count == 1:
        raise RuntimeError(f"order {body['id']} fails on its first attempt")
    _record("done", body, message)


@sqsworker.handler()
def work(message: sqsworker.Message) -> None:
    body = message.json()
    _record("start", body, message)
    time.sleep(float(body.get("sleep", 0)))
    _finish(body, message)


@sqsworker.handler()
def collector(message: sqsworker.Message) -> None:
    young = gc.get_threshold()[0]
    _record("gc", {"kind": young, "id": gc.get_freeze_count()}, message)


@sqsworker.handler()
async def work_async(message: sqsworker.Message) -> None:
    body = message.json()
    _record("start", body, message)
    await asyncio.sleep(float(body.get("sleep", 0)))
    _finish(body, message)


@sqsworker.handler()
async def work_in_thread(message: sqsworker.Message) -> None:
    body = message.json()
    _record("start", body, message)
    await asyncio.to_thread(time.sleep, float(body.get("sleep", 0)))
    _record("done", body, message)


class Order(pydantic.BaseModel):
    """A typed body: the ledger's kind and id, and a total that must be a whole number."""

    kind: str
    id: int
    total: int


@dataclasses.dataclass
class OrderData:
    kind: str
    id: int
    total: int


@sqsworker.handler()
def typed(order: Order) -> None:
    """A handler given its body as a pydantic model."""
    _record("done", order.model_dump(), sqsworker.Message.build("{}"))


@sqsworker.handler()
async def typed_async(order: OrderData, message: sqsworker.Message) -> None:
    """An async handler given its body as a dataclass, and its message."""
    await asyncio.sleep(0)
    _record("done", dataclasses.asdict(order), message)


@sqsworker.handler()
def work_too(message: sqsworker.Message) -> None:
    """``work`` under another name: a second handler, on a second queue, in one process."""
    work(message)


@sqsworker.handler()
def pay(message: sqsworker.Message) -> None:
    body = message.json()
    with message.transaction() as db:
        mark = "%s" if hasattr(db, "pgconn") else "?"  # psycopg's placeholders, sqlite3's
        db.execute(
            f"INSERT INTO effects (key, pid, receive_count) VALUES ({mark}, {mark}, {mark})",
            (message.idempotency_key, os.getpid(), message.receive_count),
        )
    if body.get("hold"):
        release = Path(os.environ["HOLD_DIR"]) / f"{message.idempotency_key}.release"
        deadline = time.monotonic() + 60
        while not release.exists() and time.monotonic() < deadline:
            time.sleep(0.02)


@sqsworker.handler()
def measure(message: sqsworker.Message) -> None:
    """Appends "SHA256 BYTES" of the body it was given to $LEDGER: a large body arrives whole."""
    data = message.body.encode()
    line = f"{hashlib.sha256(data).hexdigest()} {len(data)}\n"
    with open(os.environ["LEDGER"], "a") as ledger:
        ledger.write(line)


@sqsworker.handler()
def traced(message: sqsworker.Message) -> None:
    """Opens a span of its own, as a handler calling an instrumented client would."""
    from opentelemetry import trace

    with trace.get_tracer("tests.apps").start_as_current_span("charge card"):
        message.log.info("charging the card")
