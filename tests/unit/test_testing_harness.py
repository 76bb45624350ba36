"""sqsworker.testing: the Harness users test their own handlers with, and its pytest
fixture, run as a user's own test file would be."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pydantic
import pytest

import sqsworker
from sqsworker.testing import Harness

from ..snippets import snippet

PAGE = "docs/testing-your-handlers.md"


def test_the_pages_tests_pass_in_a_project_of_their_own(tmp_path: Path) -> None:
    """The page's app.py and test_app.py, as files of a user's project, run by pytest in
    a process of its own: the sqsworker_harness fixture comes from the installed plugin."""
    (tmp_path / "app.py").write_text(snippet(PAGE, "# app.py").text)
    (tmp_path / "test_app.py").write_text(snippet(PAGE, "# test_app.py").text)
    (command,) = snippet(PAGE, "pytest test_app.py").text.splitlines()
    ran = subprocess.run(
        [sys.executable, "-m", *command.split(), "-p", "no:cacheprovider", "-p", "no:cloudcoil"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "5 passed" in ran.stdout


def test_a_page_test_fails_when_its_handler_is_not_idempotent(tmp_path: Path) -> None:
    """The same test fails for a handler run without its promise: with no idempotency
    store it is refused, as sqsworker run refuses it."""
    (tmp_path / "app.py").write_text(snippet(PAGE, "# app.py").text)
    tests = snippet(PAGE, "# test_app.py").text.replace(", idempotency_store=True", "")
    (tmp_path / "test_app.py").write_text(tests)
    ran = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "test_app.py",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:cloudcoil",
            "-k",
            "delivered_twice",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 1 and "1 failed" in ran.stdout, ran.stdout
    assert "without a store its keys would not be checked" in ran.stdout


def test_drain_says_what_is_left_when_a_handler_never_returns() -> None:
    stop = threading.Event()

    @sqsworker.handler(queue="stuck")
    def stuck(message: sqsworker.Message) -> None:
        stop.wait(30)

    harness = Harness(stuck)
    harness.send("x")
    with pytest.raises(TimeoutError, match=r"did not drain in 0\.5 s"):
        harness.drain(timeout=0.5)
    stop.set()
    harness.drain()
    harness.close()


def test_advance_lets_a_delayed_message_come_due() -> None:
    seen: list[str] = []

    @sqsworker.handler(queue="later")
    def later(message: sqsworker.Message) -> None:
        seen.append(message.body)

    with Harness(later) as harness:
        harness.send("soon", delay=60)
        harness.advance(30)
        assert seen == []
        harness.advance(40)
        assert seen == ["soon"]


class Signup(pydantic.BaseModel):
    email: str


SENT: list[str] = []


@sqsworker.handler(queue="signups")
def welcome(signup: Signup) -> None:
    SENT.append(signup.email)


def signup_view(email: str) -> str:
    """Application code under test: queues a welcome, as Celery code calls .delay()."""
    return welcome.send(Signup(email=email))


def test_a_handlers_own_sends_go_to_the_harness_while_it_is_open() -> None:
    with Harness(welcome) as harness:
        message_id = signup_view("a@example.com")
        harness.send({"email": 5})  # does not validate: refused before the handler runs
        harness.drain()
        assert harness.runs[message_id] == 1 and SENT == ["a@example.com"]
        (letter,) = harness.dead_letters
        assert harness.runs[letter.message_id] == 0
    assert "producer" not in welcome.__dict__  # afterwards it sends to SQS again


def test_a_typed_handler_can_be_called_with_its_body() -> None:
    welcome(Signup(email="b@example.com"))
    welcome({"email": "c@example.com"})
    assert SENT[-2:] == ["b@example.com", "c@example.com"]
