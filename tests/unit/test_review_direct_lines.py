"""Review of 5f74fe6: every message's line through configure's processors directly. The
line must be the one structlog's logger writes, under the user's structlog configuration."""

from __future__ import annotations

import json
import logging
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from sqsworker import logs
from sqsworker.logs import LogObserver, configure
from sqsworker.message import Message

from .conftest import LogStream


@pytest.fixture
def stream(monkeypatch: pytest.MonkeyPatch) -> Iterator[LogStream]:
    """Set in the test's body (pytest sets its own stderr there) by ``configure``."""
    out = LogStream()
    yield out
    structlog.reset_defaults()
    logging.getLogger().handlers = []


def _configure(stream: LogStream, monkeypatch: pytest.MonkeyPatch, fmt: str) -> None:
    monkeypatch.setattr("sys.stderr", stream)
    configure("info", fmt)


def _pair(observer: LogObserver, message: Message, monkeypatch: pytest.MonkeyPatch) -> None:
    """The direct line, then the same line through a bound logger (forced: _direct off)."""
    observer.handler_succeeded(message, 0.5)
    with monkeypatch.context() as patch:
        patch.setattr(logs, "_direct", None)
        observer.handler_succeeded(message, 0.5)


class Seeded(dict):  # type: ignore[type-arg]
    """A context class that gives every logger's context a field (a service name)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.setdefault("service", "billing")


def test_the_users_context_class_is_honoured(
    stream: LogStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A handler module configures structlog's context_class at import; sqsworker's
    configure keeps it (it sets no context_class). The line through a logger carries
    what the context class holds; the direct line must too."""
    structlog.configure(context_class=Seeded)  # the user's, before `sqsworker run` configures
    _configure(stream, monkeypatch, "json")
    observer = LogObserver("app:handle")
    _pair(observer, Message.build("{}", message_id="m-1"), monkeypatch)
    direct, bound = (json.loads(line) for line in stream.getvalue().splitlines())
    direct.pop("timestamp"), bound.pop("timestamp")
    assert bound["service"] == "billing"
    assert list(direct.items()) == list(bound.items())


def test_a_thread_local_context_is_honoured(
    stream: LogStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """structlog's (deprecated, still shipped) thread-local context: a handler binds its
    fields on any logger, and every logger of the thread writes them. The message's line
    written on that thread carried them through a logger; it must still."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from structlog.threadlocal import wrap_dict

        local = wrap_dict(dict)
    structlog.configure(context_class=local)
    _configure(stream, monkeypatch, "json")
    observer = LogObserver("app:handle")
    message = Message.build("{}", message_id="m-1")

    def handler_thread() -> None:
        structlog.get_logger().bind(tenant="acme")  # the handler's own binding
        observer.handler_succeeded(message, 0.5)

    thread = threading.Thread(target=handler_thread)
    thread.start()
    thread.join()
    (line,) = (json.loads(line) for line in stream.getvalue().splitlines())
    assert line.get("tenant") == "acme"
