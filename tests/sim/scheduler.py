"""A clock that runs the worker's real threads one at a time, in an order drawn from a seed.

The worker starts every thread with ``Clock.spawn`` and blocks only in
``Clock.wait`` (see sqsworker/clock.py). ``SimClock`` implements both: each
spawned thread runs only while it holds the *turn*, and gives it back at its
next wait. The scheduler (the test's thread) hands the turn out:

- to a thread that has not run yet;
- to the threads whose wait's deadline has come;
- to the threads a notification woke (``install`` wraps ``threading.Condition``'s
  ``notify`` and ``notify_all`` to see them): ``notify(n)`` wakes the ``n`` threads
  that have waited on the condition longest, as ``threading`` does, and a
  notification with nobody waiting wakes nobody later; so a wake-up the code forgot
  to send, or sent to too few threads, is missed here as on real threads;
- now and then, to a thread nobody woke: ``Clock.wait`` may return early, and
  the code must cope.

Each round runs the ready threads in an order drawn from the seed. When no
thread is ready, the instant is over and time jumps to the next deadline. Only
one thread ever runs, so a run is a function of the seed: a failure replays
exactly.
"""

from __future__ import annotations

import asyncio
import random
import selectors
import sys
import threading
import time
import traceback
from collections.abc import Callable

WATCHDOG = 20.0  # real seconds a thread may run without giving the turn back
MAX_ROUNDS = 500  # rounds at one instant before the run counts as a livelock
SPURIOUS = 0.02  # the chance, per round, that a waiting thread is woken for nothing

_active: SimClock | None = None  # the clock whose notifications are being watched
_original_notify = threading.Condition.notify
_original_notify_all = threading.Condition.notify_all


def _notify(cond: threading.Condition, n: int = 1) -> None:
    if _active is not None:
        _active.wake(cond, n)
    _original_notify(cond, n)


def _notify_all(cond: threading.Condition) -> None:
    if _active is not None:
        _active.wake(cond, None)
    _original_notify_all(cond)  # its notify(len(real waiters)) wakes no simulated thread


class SimAbort(BaseException):
    """Raised in a simulated thread at teardown, so that it unwinds."""


class SimStuck(AssertionError):
    """A simulated thread blocked outside the clock, or the run cannot settle."""


class SimTask:
    """One simulated thread."""

    def __init__(self, name: str, group: str) -> None:
        self.name = name
        self.group = group  # which simulated process it belongs to (crashed together)
        self.finished = False
        self.frozen = False  # its process crashed: never scheduled again
        self.started = False
        self.cond: object | None = None
        self.deadline: float | None = None
        self.since = 0  # when its wait began, in waits: notify() wakes the longest waiting
        self.woken = False  # a notification woke it from its current wait
        self.thread: threading.Thread | None = None
        self.turn: threading.Condition | None = None  # its own: given the turn, it alone wakes

    def is_alive(self) -> bool:
        return not self.finished

    def key(self) -> tuple[int, float | None]:
        return id(self.cond), self.deadline


class SimClock:
    def __init__(self, seed: int, start: float = 1_000_000.0) -> None:
        self.rng = random.Random(seed)
        self._now = start
        self._wall_offset = 1_700_000_000.0
        # One lock for the hand-off; each thread waits for its turn on a condition of its
        # own, and the scheduler for the turn back on this one (waking every thread at
        # each turn made a run with a dozen threads cost milliseconds a turn).
        self._lock = threading.Lock()
        self._turn = threading.Condition(self._lock)
        self._running: SimTask | None = None
        self._local = threading.local()
        self.tasks: list[SimTask] = []
        self.loops: list[SimEventLoop] = []  # the event loops made on this clock
        self.group = "main"  # the group new tasks join; the simulator sets it per worker
        self._waits = 0  # waits begun, to order the waiters of a condition
        self.errors: list[tuple[str, BaseException, str]] = []  # threads that died
        self._teardown = False

    # -- the Clock protocol ------------------------------------------------------------

    def monotonic(self) -> float:
        return self._now

    def time(self) -> float:
        return self._now + self._wall_offset

    def spawn(self, name: str, target: Callable[[], object]) -> SimTask:
        # A thread started by a simulated one (a pool's, as work comes) is of its process.
        parent: SimTask | None = getattr(self._local, "task", None)
        task = SimTask(name, parent.group if parent is not None else self.group)
        task.turn = threading.Condition(self._lock)
        task.thread = threading.Thread(
            target=self._body, args=(task, target), name=f"sim-{name}", daemon=True
        )
        self.tasks.append(task)
        task.thread.start()
        return task

    def event_loop(self) -> tuple[asyncio.AbstractEventLoop, SimClock]:
        loop = SimEventLoop(self)
        self.loops.append(loop)
        return loop, self

    def wait(self, cond: threading.Condition, deadline: float | None) -> None:
        task = self.current()
        if self._teardown:
            raise SimAbort
        if deadline is not None and deadline <= self._now:
            return  # the deadline has come: no wait, as with any clock
        self._waits += 1
        task.cond, task.deadline, task.since, task.woken = cond, deadline, self._waits, False
        saved = cond._release_save()  # type: ignore[attr-defined]
        try:
            self._park(task)
        finally:
            cond._acquire_restore(saved)  # type: ignore[attr-defined]

    # -- for simulated work ------------------------------------------------------------

    def sleep(self, seconds: float) -> None:
        """Take ``seconds`` of simulated time on the calling simulated thread."""
        until = self._now + seconds
        cond = threading.Condition()
        with cond:
            while self._now < until:
                self.wait(cond, until)

    def current(self) -> SimTask:
        task: SimTask | None = getattr(self._local, "task", None)
        if task is None:
            raise SimStuck(f"a wait on the simulated clock from {threading.current_thread().name}")
        return task

    def in_task(self) -> bool:
        return getattr(self._local, "task", None) is not None

    # -- the simulated threads' side ---------------------------------------------------

    def _body(self, task: SimTask, target: Callable[[], object]) -> None:
        self._local.task = task
        turn = task.turn
        assert turn is not None
        with self._lock:
            while self._running is not task:
                turn.wait()
        task.started = True
        try:
            if not self._teardown:
                target()
        except SimAbort:
            pass
        except BaseException as exc:
            self.errors.append((task.name, exc, traceback.format_exc()))
        finally:
            task.finished = True
            with self._lock:
                self._running = None
                _original_notify(self._turn)

    def _park(self, task: SimTask) -> None:
        turn = task.turn
        assert turn is not None
        with self._lock:
            self._running = None
            _original_notify(self._turn)  # the scheduler, alone on it
            while self._running is not task:
                turn.wait()
        if self._teardown:
            raise SimAbort

    # -- the scheduler's side ----------------------------------------------------------

    def wake(self, cond: threading.Condition, n: int | None) -> None:
        """``notify(n)`` (None: ``notify_all``): the ``n`` threads waiting on ``cond``
        longest are ready to run. Not the thread notifying: it is not waiting, though its
        last wait (ended by its deadline, or early) was on ``cond``."""
        waiting = sorted(
            (
                t
                for t in self.live()
                if t.started and t.cond is cond and not t.woken and t is not self._running
            ),
            key=lambda t: t.since,
        )
        for task in waiting if n is None else waiting[:n]:
            task.woken = True

    def install(self) -> None:
        """Watch ``notify`` and ``notify_all`` on every condition (one simulation at a time)."""
        global _active
        _active = self
        threading.Condition.notify = _notify  # type: ignore[method-assign]
        threading.Condition.notify_all = _notify_all  # type: ignore[method-assign]

    def uninstall(self) -> None:
        global _active
        _active = None
        threading.Condition.notify = _original_notify  # type: ignore[method-assign]
        threading.Condition.notify_all = _original_notify_all  # type: ignore[method-assign]

    def live(self) -> list[SimTask]:
        return [t for t in self.tasks if not t.finished and not t.frozen]

    def _run(self, task: SimTask) -> None:
        """Give ``task`` the turn until it waits again or ends."""
        assert task.turn is not None
        with self._lock:
            self._running = task
            _original_notify(task.turn)
            give_up = time.monotonic() + WATCHDOG
            while self._running is not None:
                if not self._turn.wait(max(0.0, give_up - time.monotonic())):
                    raise SimStuck(f"{task.name} blocked outside the clock:\n{_stack(task)}")

    def _ready(self, task: SimTask) -> bool:
        if not task.started or task.woken:
            return True
        if task.deadline is not None and task.deadline <= self._now:
            return True
        return self.rng.random() < SPURIOUS

    def settle(self) -> None:
        """Run the ready threads, round after round, until none is ready at this instant."""
        for _ in range(MAX_ROUNDS):
            ready = [t for t in self.live() if self._ready(t)]
            if not ready:
                return
            self.rng.shuffle(ready)
            for task in ready:
                if not task.finished and not task.frozen:
                    self._run(task)
        raise SimStuck(f"threads still ready after {MAX_ROUNDS} rounds at t={self._now}")

    def next_deadline(self) -> float | None:
        deadlines = [t.deadline for t in self.live() if t.deadline is not None]
        return min(deadlines) if deadlines else None

    def advance_to(self, moment: float) -> None:
        self._now = max(self._now, moment)

    def freeze(self, group: str) -> None:
        """A crash: the group's threads never run again (their messages stay in flight)."""
        for task in self.tasks:
            if task.group == group:
                task.frozen = True

    def teardown(self) -> None:
        """Unwind every thread (``SimAbort`` from its wait) and join it."""
        self._teardown = True
        for _ in range(20):
            pending = [t for t in self.tasks if not t.finished]
            if not pending:
                break
            for task in pending:
                self._run(task)
        for task in self.tasks:
            if task.thread is not None:
                task.thread.join(5)
        # A loop its worker did not close was left where the world ended (a crashed
        # worker's, or one still running): its tasks will never run again. Closed here, so
        # its sockets and pending tasks are not reported later, in whatever test the
        # collector finds them; a loop its worker closed itself is left as it was.
        for loop in self.loops:
            if loop.is_closed() or loop.is_running():
                continue
            for pending in asyncio.all_tasks(loop):
                pending._log_destroy_pending = False  # type: ignore[attr-defined]
            loop.close()


class SimEventLoop(asyncio.SelectorEventLoop):
    """An event loop on the simulated clock: its time is the clock's, and it waits for
    its next timer, or for a callback from another thread, through ``SimClock.wait``.
    (Coroutine handlers run on it; it does no I/O of its own.)"""

    def __init__(self, clock: SimClock) -> None:
        self.sim_clock = clock
        self.woken = threading.Condition()  # call_soon_threadsafe notifies it
        super().__init__(_SimSelector(self))

    def time(self) -> float:
        return self.sim_clock.monotonic()

    def _write_to_self(self) -> None:
        with self.woken:
            self.woken.notify_all()


class _SimSelector(selectors.SelectSelector):
    """Registers the loop's own socket as any selector does, and waits on the simulated
    clock instead of the operating system: until the timeout, or until woken."""

    def __init__(self, loop: SimEventLoop) -> None:
        super().__init__()
        self._sim_loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        loop = self._sim_loop
        if timeout is None or timeout > 0:
            clock = loop.sim_clock
            deadline = None if timeout is None else clock.monotonic() + timeout
            with loop.woken:
                clock.wait(loop.woken, deadline)
        return []


def _stack(task: SimTask) -> str:
    thread = task.thread
    frame = sys._current_frames().get(thread.ident) if thread and thread.ident else None
    return "".join(traceback.format_stack(frame)) if frame else "(no frame)"
