"""The fields a handler's log lines carry are bound per thread: threads binding a key
for the first time at once must not break each other's reset (structlog makes a key's
ContextVar on its first binding, with no lock)."""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections import Counter
from typing import Any

import pytest
import structlog

import sqsworker
from sqsworker import Message, log_context
from sqsworker.clock import FakeClock
from sqsworker.transports import OutgoingMessage, send_all
from sqsworker.transports.memory import MemorySQS

from .helpers import Rig


class RacingMisses(dict[str, Any]):
    """structlog's registry of ContextVars, where a lookup that misses waits a moment for
    another thread's lookup to miss too: the interleaving that loses a ContextVar."""

    def __init__(self, registry: dict[str, Any]) -> None:
        super().__init__(registry)
        self.both_missed = threading.Barrier(2)

    def __getitem__(self, key: str) -> Any:
        if key not in self:
            with contextlib.suppress(threading.BrokenBarrierError):  # one thread alone
                self.both_missed.wait(timeout=0.3)
            raise KeyError(key)
        return super().__getitem__(key)


def bind_and_reset_at_once(monkeypatch: pytest.MonkeyPatch, bind: Any) -> list[BaseException]:
    registry = RacingMisses(structlog.contextvars._CONTEXT_VARS)
    monkeypatch.setattr(structlog.contextvars, "_CONTEXT_VARS", registry)
    key = f"field_{uuid.uuid4().hex}"  # a key nothing has bound yet
    errors: list[BaseException] = []
    seen: list[dict[str, Any]] = []
    both_bound = threading.Barrier(2)  # the handlers run at once: both bind, then reset

    def handler_thread(value: int) -> None:
        try:
            tokens = bind(**{key: value})
            seen.append(structlog.contextvars.get_contextvars())
            both_bound.wait(timeout=10)
            structlog.contextvars.reset_contextvars(**tokens)
            assert key not in structlog.contextvars.get_contextvars()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=handler_thread, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors or sorted(context[key] for context in seen) == [0, 1]
    return errors


def test_threads_binding_a_new_key_at_once_each_reset_their_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert bind_and_reset_at_once(monkeypatch, log_context.bind) == []


def test_the_race_is_real_without_the_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    """The interleaving above does break structlog's own binding (what a worker's first
    messages met: ValueError after their handlers had run, so they ran again)."""
    errors = bind_and_reset_at_once(monkeypatch, structlog.contextvars.bind_contextvars)
    assert any("was created by a different ContextVar" in str(error) for error in errors)


def test_a_fresh_worker_s_first_messages_each_run_once(
    memory: MemorySQS, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two handler threads taking a fresh process's first messages at once bind the same
    new keys at once: each message still runs once and succeeds."""
    monkeypatch.setattr(structlog.contextvars, "_CONTEXT_VARS", RacingMisses({}))
    monkeypatch.setattr(log_context, "_bound_keys", set())  # as in a process that bound nothing
    ran: Counter[str] = Counter()
    rig = Rig(memory, clock, lambda message: ran.update([message.body]), concurrency=2)
    rig.send("first", "second")
    rig.worker.start()
    rig.wait_for("deleted", 2)
    assert rig.count("failed") == 0
    assert ran == {"first": 1, "second": 1}
    assert rig.stop() == 0


def _failing_unbind(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Resetting a message's log fields raises (a logging library's bug, as structlog's race
    was): each call counted."""
    calls: list[int] = []

    class Made(set[str]):  # every key's ContextVar made: bind() goes straight to structlog
        def issuperset(self, other: Any) -> bool:
            return True

    monkeypatch.setattr(log_context, "_bound_keys", Made())

    def reset(**tokens: Any) -> None:
        calls.append(len(tokens))
        raise ValueError("a token made by another ContextVar")

    monkeypatch.setattr(structlog.contextvars, "reset_contextvars", reset)
    return calls


@pytest.mark.parametrize("batched", [False, True], ids=["def", "batch"])
def test_an_error_of_ours_after_the_handler_returned_leaves_its_outcome(
    memory: MemorySQS, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, batched: bool
) -> None:
    """The handler returned: the message is deleted, once run, whatever fails after."""
    ran: Counter[str] = Counter()

    def handle(message: Message) -> None:
        ran.update([message.body])

    def handle_all(messages: list[Message]) -> None:
        ran.update(message.body for message in messages)

    handler = sqsworker.batch_handler()(handle_all) if batched else handle
    options = {"batch_size": 2, "batch_window": 0.0} if batched else {}
    rig = Rig(memory, clock, handler, concurrency=1, **options)
    rig.send("a", "b")
    calls = _failing_unbind(monkeypatch)
    rig.worker.start()
    rig.wait_for("deleted", 2)
    assert calls  # it did fail
    assert rig.count("failed") == 0 and rig.count("worker_errors") == 0
    assert ran == {"a": 1, "b": 1}
    assert rig.stop() == 0


def test_after_an_unbind_that_failed_no_field_of_that_message_stays_bound(
    memory: MemorySQS, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A field the first message had and the next has not (a fair queue's group) does not
    stay bound on the thread once the first one's unbind failed."""
    seen: dict[str, dict[str, Any]] = {}
    real_reset = structlog.contextvars.reset_contextvars
    failed: list[int] = []

    def reset(**tokens: Any) -> None:
        if not failed and "handler" in tokens:  # the first message's unbind fails, once
            failed.append(1)
            raise ValueError("a token made by another ContextVar")
        real_reset(**tokens)

    def handler(message: Message) -> None:
        seen[message.body] = structlog.contextvars.get_contextvars()

    rig = Rig(memory, clock, handler, concurrency=1)
    send_all(rig.queue, [OutgoingMessage("a", group_id="tenant-a")])
    keys = ("queue", "message_id", "receive_count", "group_id", "handler")
    real_reset(**log_context.bind(**dict.fromkeys(keys, "warm")))  # every ContextVar made
    monkeypatch.setattr(structlog.contextvars, "reset_contextvars", reset)
    rig.worker.start()
    rig.wait_for("deleted", 1)
    send_all(rig.queue, [OutgoingMessage("b")])
    rig.advance_until(lambda: "b" in seen)
    rig.wait_for("deleted", 2)
    assert failed and seen["a"]["group_id"] == "tenant-a"
    assert "group_id" not in seen["b"], seen["b"]
    assert rig.stop() == 0
