"""The inbox's hand-over: a receive wakes only the handler threads its pace asks for, and
the watcher hands a message that waited ``hand_over`` in line to an idle thread.

Handler threads here run the loop ``Threads.work`` runs (``next``, the handler,
``finish``) on the inbox alone, with a fake clock: each message's handler blocks until
the test lets it go, so which thread ran what is the test's to see.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from sqsworker.clock import Clock, FakeClock, SystemClock
from sqsworker.inbox import Inbox

from ..conftest import wait_until

QUICK = 0.0002  # seconds a message: 25 of them fit in a 5 ms hand-over


class Line:
    """An inbox with ``threads`` handler threads; each message is a namespace whose
    handler waits for ``go`` (set it to finish), taking ``took`` seconds of the pace."""

    def __init__(self, threads: int, took: float = QUICK, clock: Clock | None = None) -> None:
        self.clock: Any = clock or FakeClock()
        self.inbox = Inbox(self.clock)
        self.inbox.use_hand_over()
        self.took = took
        self.ran: dict[int, str] = {}  # message number -> the thread that ran it
        self.started = threading.Condition()
        self.threads = [
            threading.Thread(target=self._work, name=f"handler-{i}", daemon=True)
            for i in range(threads)
        ]
        self.messages: dict[int, Any] = {}
        # Run under the inbox's lock as the thread takes the message (a receive that
        # gets the lock before a thread the taker woke does).
        self.on_take: dict[int, Callable[[], None]] = {}
        self._pace(took)
        for thread in self.threads:
            thread.start()
        self.settled()

    def _pace(self, took: float) -> None:
        """The pace the inbox knows from messages already run."""
        with self.inbox.lock:
            seed = self._message(-1)
            self.inbox.put([seed])
            assert self.inbox.next() is seed
            self.inbox.finish(seed, took)

    def _message(self, number: int) -> Any:
        message = SimpleNamespace(
            number=number, queued_at=0.0, gone=False, deferrals=0, go=threading.Event()
        )
        self.messages[number] = message
        return message

    def _work(self) -> None:
        while True:
            with self.inbox.lock:
                message = self.inbox.next()
                if message is None:
                    return
                if (then := self.on_take.pop(message.number, None)) is not None:
                    then()
            with self.started:
                self.ran[message.number] = threading.current_thread().name
                self.started.notify_all()
            message.go.wait()
            with self.inbox.lock:
                self.inbox.finish(message, self.took)

    def put(self, numbers: range) -> None:
        with self.inbox.lock:
            assert self.inbox.put([self._message(n) for n in numbers])

    def defer(self, number: int, due: float) -> None:
        """A duplicate set aside until ``due`` (its handler, once due, waits for ``go``)."""
        self.inbox.defer(self._message(number), due)

    def watched(self) -> bool:
        """Whenever a thread is parked, there is a watcher."""
        with self.inbox.lock:
            return not self.inbox._parked or self.inbox._watcher is not None

    def finish(self, number: int) -> None:
        self.messages[number].go.set()

    def running(self) -> set[int]:
        return {n for n in self.ran if n >= 0 and not self.messages[n].go.is_set()}

    def settled(self) -> None:
        """Wait until every thread not running a message is idle in the inbox: parked,
        or the watcher, waiting."""

        def idle() -> bool:
            with self.inbox.lock:
                busy = len(self.running())
                watcher = self.inbox._watcher is not None and not self.inbox._watcher_runs
                return len(self.inbox._parked) + watcher + busy == len(self.threads)

        wait_until(idle, what="every thread running or idle in the inbox")

    def close(self) -> None:
        for message in self.messages.values():
            message.go.set()
        self.inbox.close()
        for thread in self.threads:
            thread.join(10)
            assert not thread.is_alive()


@pytest.fixture
def lines() -> Any:
    made: list[Line] = []

    def make(threads: int, took: float = QUICK, clock: Clock | None = None) -> Line:
        made.append(Line(threads, took, clock))
        return made[-1]

    yield make
    for line in made:
        line.close()


def test_a_receive_of_quick_messages_wakes_one_thread_which_runs_them_all(lines: Any) -> None:
    line = lines(6)
    line.put(range(10))
    for number in range(10):
        wait_until(lambda n=number: n in line.ran, what=f"message {number} running")
        line.settled()
        assert line.running() == {number}  # the others wait in line, no thread woken
        line.finish(number)
    assert len(set(line.ran[n] for n in range(10))) == 1


def test_a_message_that_waited_its_hand_over_behind_a_slow_one_goes_to_an_idle_thread(
    lines: Any,
) -> None:
    line = lines(6)
    line.put(range(10))
    wait_until(lambda: 0 in line.ran)
    line.settled()
    assert line.running() == {0}  # quick by the pace, but this one is slow
    line.clock.advance(line.inbox.hand_over / 2)
    line.settled()
    assert line.running() == {0}
    line.clock.advance(line.inbox.hand_over)
    # The line stood still past its hand-over: every thread takes one.
    wait_until(lambda: len(line.running()) == 6, what="six messages running")
    line.settled()
    assert line.running() == set(range(6))
    for number in range(6):
        line.finish(number)
    wait_until(lambda: all(n in line.ran for n in range(10)), what="the rest running")


def test_after_a_hand_over_a_thread_watches_in_the_watchers_place(lines: Any) -> None:
    line = lines(6)
    line.put(range(3))
    line.settled()
    line.clock.advance(line.inbox.hand_over)  # 0 is slow: the watcher takes 1, wakes for 2
    wait_until(lambda: line.running() == {0, 1, 2}, what="three running")
    line.settled()
    line.put(range(3, 6))  # one thread woken; its first message is slow too
    line.settled()
    assert len(line.running()) == 4
    line.clock.advance(line.inbox.hand_over)
    wait_until(lambda: len(line.running()) == 6, what="all six running")


def test_slow_handlers_wake_a_thread_for_every_message(lines: Any) -> None:
    line = lines(6, took=1.0)
    line.put(range(5))
    wait_until(lambda: len(line.running()) == 5, what="five running at once")


def test_a_receive_with_more_messages_than_parked_threads_sets_the_watcher_running(
    lines: Any,
) -> None:
    line = lines(3, took=1.0)
    line.put(range(2))
    wait_until(lambda: len(line.running()) == 2, what="two running")
    line.settled()
    line.put(range(2, 4))  # one thread idle, the watcher: it runs one at once
    wait_until(lambda: len(line.running()) == 3, what="three running")


def test_closing_ends_every_idle_thread(lines: Any) -> None:
    line = lines(4)
    with line.inbox.lock:
        assert line.inbox._watcher is not None and len(line.inbox._parked) == 3
    line.close()


def test_a_receive_wakes_the_watcher_that_sleeps_until_a_deferred_message_is_due(
    lines: Any,
) -> None:
    # A real clock: a fake one's advance wakes every waiter, the watcher too.
    line = lines(4, clock=SystemClock())
    line.defer(99, line.clock.monotonic() + 60)
    wait_until(lambda: line.inbox._watcher_looks < math.inf, what="the watcher sleeping until it")
    line.put(range(3))  # one thread woken; its message is slow
    wait_until(lambda: line.running() == {0, 1, 2}, what="the two behind it handed over")


def test_a_watcher_that_takes_a_due_deferred_message_wakes_a_thread_for_each_waiting(
    lines: Any,
) -> None:
    line = lines(6)
    line.defer(99, line.clock.monotonic() + 1.0)
    line.settled()
    line.put(range(2))  # one thread woken; 0 is slow
    line.settled()
    # 1 waited its hand-over and 99 is due: the watcher takes 99, a thread 1, and one
    # of the parked threads watches.
    line.clock.advance(1.0)
    wait_until(lambda: line.running() == {0, 1, 99}, what="1 and 99 running")
    line.settled()
    assert line.watched()
    line.put(range(2, 5))
    line.settled()
    line.clock.advance(line.inbox.hand_over)
    wait_until(lambda: line.running() == {0, 1, 99, *range(2, 5)}, what="all running")


def test_a_receive_before_the_thread_woken_to_watch_looks_leaves_none_unwatched(
    lines: Any,
) -> None:
    line = lines(5)
    line.put(range(2))  # one thread woken; 0 is slow
    line.settled()
    # 1 waits its hand-over: the watcher takes it and wakes a parked thread to watch in
    # its place; a receive gets the lock before that thread does.
    line.on_take[1] = lambda: line.put(range(2, 5))
    line.clock.advance(line.inbox.hand_over)
    wait_until(lambda: {0, 1} <= line.running(), what="1 handed over")
    line.settled()
    line.clock.advance(line.inbox.hand_over)
    wait_until(lambda: line.running() == set(range(5)), what="all five running")


class CountingClock(FakeClock):
    """A fake clock that counts the watcher's waits with a deadline (its looks)."""

    def __init__(self) -> None:
        super().__init__()
        self.inbox: Inbox | None = None
        self.looks = 0
        self.asleep = False  # the watcher waits untimed

    def wait(self, cond: threading.Condition, deadline: float | None) -> None:
        watcher = self.inbox is not None and cond is self.inbox._watcher
        if watcher:
            self.looks += deadline is not None
            self.asleep = deadline is None
        try:
            super().wait(cond, deadline)
        finally:
            if watcher:
                self.asleep = False


def test_the_watcher_stops_looking_on_a_while_after_the_last_receive(lines: Any) -> None:
    """After a receive that woke too few threads the watcher looks every hand-over for
    ``LOOK_ON`` of them (receives coming fast need not wake it), then waits to be woken:
    a long handler running alone costs no wake-ups."""
    clock = CountingClock()
    line = lines(4, clock=clock)
    clock.inbox = line.inbox
    line.put(range(3))  # one thread woken: it runs 0, 1, then 2, which runs long
    for number in (0, 1):
        wait_until(lambda n=number: n in line.ran)
        line.finish(number)
    wait_until(lambda: 2 in line.ran)
    line.settled()
    for _ in range(Inbox.LOOK_ON + 1):
        line.clock.advance(line.inbox.hand_over)
        line.settled()
    wait_until(lambda: clock.asleep, what="the watcher waiting to be woken")
    looks = clock.looks
    for _ in range(20):
        line.clock.advance(line.inbox.hand_over)
        line.settled()
    assert clock.looks == looks
    assert line.running() == {2}
