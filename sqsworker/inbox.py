"""The inbox: the messages received and not yet through a handler, under one lock.

A message is in the inbox from the moment a receive hands it over until its handler
thread (or coroutine) finishes with it: waiting in line (one line, or one lane per
FIFO group), running, or set aside as a duplicate whose idempotency key is busy
elsewhere (held with its lease kept, looked at again when due). The receive threads
count their room from it; the handler threads take from it; the shutdown drains it.

One lock guards the inbox and the receive side's counts (``Receiver`` shares it), so
that room taken by an answered receive becomes room taken by its messages in one step.
Conditions on it: ``slots`` (the shutdown waits on it for nothing unfinished; each
receive thread waits for room on a condition of its own, and a change wakes one of them,
the one that began to wait last, and only when one would act: ``Receiver.wake``),
``runnable`` (a message to run: the handler threads wait on it,
so a message finishing wakes no idle handler thread) and a batch handler's turn to fill
its batch. Lock order: this lock before the lease keeper's, never the other way (the
keeper calls ``changed`` outside its own lock).

**The hand-over** (``def`` handlers on a standard queue, ``use_hand_over``). Waking a
thread costs more than a quick handler (two context switches and a wait for the GIL).
So a receive wakes only as many idle handler threads as would run its messages within
``hand_over`` seconds at the recent pace: one, for a handler of a few hundred µs, which
runs the receive's messages one after another. The idle threads each wait on a
condition of their own (``_parked``, woken one by one, so the inbox knows how many it
woke), but one: the *watcher*. While a message waits in line, the watcher wakes when
the oldest has waited ``hand_over``; finding it still there (a handler slower than its
pace), it takes it and wakes an idle thread for every other message waiting. So no
message waits in line more than about ``hand_over`` while a handler thread is idle.
When the watcher leaves to run a message, it wakes a parked thread to watch in its
place: whenever a thread is parked, there is a watcher.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from .lanes import Lanes, Line

if TYPE_CHECKING:
    from .clock import Clock
    from .lease import Held


class Inbox:
    # Seconds a message may wait in line while a handler thread is idle (the hand-over).
    HAND_OVER = 0.005
    # Hand-overs the watcher looks on for after a receive that woke too few threads.
    LOOK_ON = 10

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.lock = threading.RLock()
        self.slots = threading.Condition(self.lock)
        self.runnable = threading.Condition(self.lock)
        # Batch handlers: one thread at a time fills its batch (and waits on runnable),
        # so batches fill rather than split between threads; the others wait their turn.
        self._filling = False
        self._fill_turn = threading.Condition(self.lock)
        self.pending: Line | Lanes = Line()
        self.unfinished = 0  # received and not yet through a handler (or handed back)
        # Duplicates whose key is busy elsewhere: (when due, message), looked at again then.
        self.deferred: list[tuple[float, Held]] = []
        self.closing = False  # handler threads exit once nothing is waiting
        # Wakes a receive thread waiting for room if one would act now (``Receiver.wake``);
        # None (no receive thread yet): the waiters on ``slots`` are woken on every change.
        self.wake_receiver: Callable[[], None] | None = None
        # The hand-over (0: off; every message put wakes a thread on ``runnable``).
        self.hand_over = 0.0
        self._took = 0.0  # seconds a message was on its handler thread, smoothed
        self._parked: deque[threading.Condition] = deque()  # idle threads, not woken
        self._watcher: threading.Condition | None = None  # the idle thread that watches
        self._watcher_runs = False  # put needs the watcher to run a message now
        # When the watcher looks next of itself (inf: when woken): a put wakes it if that
        # is later than the new messages' hand-over.
        self._watcher_looks = math.inf
        # The last put woke fewer threads than its messages, at this moment: the watcher
        # looks on every hand-over for a while (``LOOK_ON``), so that receives coming
        # fast need not wake it each.
        self._short = False
        self._put_at = -math.inf

    def use_hand_over(self) -> None:
        """Wake no more handler threads than the pace asks (``def`` handler threads on a
        standard queue; before any waits)."""
        assert not self.fifo
        self.hand_over = self.HAND_OVER

    def order_by_group(self) -> None:
        """A FIFO queue's: one lane per message group. Before any message came."""
        assert not self.unfinished
        self.pending = Lanes()

    @property
    def fifo(self) -> bool:
        return isinstance(self.pending, Lanes)

    # -- the receive side --------------------------------------------------------------

    def put(self, held: list[Held]) -> bool:
        """Messages a receive brought: queued to run; False once closing (the caller
        hands them back). Under ``lock``."""
        if self.closing:
            return False
        count = len(held)
        self.pending.add(held)
        self.unfinished += count
        if self.hand_over <= 0:
            self.runnable.notify(count)
            return True
        now = self.clock.monotonic()
        for h in held:
            h.queued_at = now
        # No watcher (the thread woken to watch has not looked yet, or none is idle): a
        # thread for every message, or those woken could all run one and leave none watching.
        wake = self._to_wake(count) if self._watcher is not None else count
        woken = self._unpark(wake)
        self._short, self._put_at = wake < count, now
        if self._watcher is not None:
            if woken < wake:  # too few parked: the watcher runs one
                self._watcher_runs = True
                self._watcher.notify()
            elif self._watcher_looks > now + self.hand_over:
                # To look by the new messages' hand-over: a thread woken for one may take
                # a deferred message that is due instead.
                self._watcher.notify()
        return True

    def _to_wake(self, count: int) -> int:
        """Idle handler threads to wake for ``count`` new messages: as many as run them
        within ``hand_over`` seconds at the recent pace; all while no pace is known."""
        if self._took <= 0:
            return count
        return min(count, math.ceil(count * self._took / self.hand_over))

    def _unpark(self, count: int) -> int:
        """Wake up to ``count`` parked handler threads; how many were."""
        woken = min(count, len(self._parked))
        for _ in range(woken):
            self._parked.popleft().notify()
        return woken

    def active(self, max_deferred: int) -> int:
        """Messages that take room: those not yet through a handler, less the duplicates
        held for a busy key (up to ``max_deferred``). Under ``lock``."""
        return self.unfinished - min(len(self.deferred), max_deferred)

    def changed(self) -> None:
        """Room or state changed (a delete or return was answered, say)."""
        with self.lock:
            self.room_changed()

    def room_changed(self) -> None:
        """Room or state changed: a receive thread waiting for room is woken if one would
        act now (the one woken wakes the next if another would), and at the end (closing,
        nothing unfinished) every waiter on ``slots``: the shutdown waits for that.
        Waking them all on every delete answered kept 32 receive threads (256 coroutines)
        waking for the GIL, 3.5 times a message, to find nothing to do. Under ``lock``."""
        wake = self.wake_receiver
        if self.closing or self.unfinished <= 0 or wake is None:
            self.slots.notify_all()
        if wake is not None:
            wake()

    # -- the handler side --------------------------------------------------------------

    def next(self) -> Held | None:
        """The next message to run, waiting for one; None once closing with none left."""
        with self.lock:
            while True:
                waiting = self._take_now()
                if waiting is not None or self.closing:
                    if self._watcher is None and self._parked and not self.closing:
                        # A thread woken to watch took a message instead (one more came,
                        # a deferred one fell due): it wakes another in its place.
                        self._unpark(1)
                    return waiting
                due = min((d for d, _ in self.deferred), default=None)
                if self.hand_over <= 0:
                    self.clock.wait(self.runnable, due)
                elif self._watcher is None:
                    self._watch()
                else:
                    self._park(due)

    def _park(self, due: float | None) -> None:
        """Wait, idle, until woken (one by one) or ``due``. Under ``lock``."""
        cond = threading.Condition(self.lock)
        self._parked.append(cond)
        try:
            while cond in self._parked and not self.closing:
                if due is not None and self.clock.monotonic() >= due:
                    break
                self.clock.wait(cond, due)  # woken by another (a fake clock's advance): on
        finally:
            if cond in self._parked:  # not woken: the due time came, or closing
                self._parked.remove(cond)

    def _watch(self) -> None:
        """Be the watcher until a message is this thread's to take (put asked it to run
        one, one waited its hand-over in line, a deferred one is due) or closing. Under
        ``lock``."""
        self._watcher = cond = threading.Condition(self.lock)
        self._watcher_runs = False
        try:
            while not (self.closing or self._watcher_runs):
                now = self.clock.monotonic()
                oldest = self.pending.oldest()
                due = min((d for d, _ in self.deferred), default=None)
                if oldest is not None and now >= oldest + self.hand_over:
                    # The line stood still: this thread takes its head (or a deferred
                    # message that is due), and wakes one for every other message waiting.
                    taken = 0 if due is not None and now >= due else 1
                    self._unpark(len(self.pending) - taken)
                    return
                if due is not None and now >= due:
                    return
                if oldest is not None:
                    deadline: float | None = oldest + self.hand_over
                elif self._short and now < self._put_at + self.LOOK_ON * self.hand_over:
                    deadline = now + self.hand_over  # receives coming fast: look on
                else:
                    deadline = None  # a put wakes it
                if due is not None:
                    deadline = due if deadline is None else min(deadline, due)
                self._watcher_looks = math.inf if deadline is None else deadline
                self.clock.wait(cond, deadline)
                self._watcher_looks = math.inf
        finally:
            self._watcher, self._watcher_looks = None, math.inf
            if not self.closing:
                self._unpark(1)  # to watch in this thread's place

    def next_few(self, limit: int) -> list[Held]:
        """Up to ``limit`` messages to run, waiting for the first; [] once closing."""
        with self.lock:
            first = self.next()
            if first is None:
                return []
            taken = [first]
            while len(taken) < limit and (more := self._take_now()) is not None:
                taken.append(more)
            return taken

    def collect(self, size: int, window: float) -> list[Held]:
        """The next batch: up to ``size`` messages, waiting for the first, then at most
        ``window`` seconds for the rest; [] once closing with none left.

        A FIFO group's messages come in order, one run of them per batch. Once taken, the
        messages count as running: at shutdown a batch being filled runs at once.
        """
        with self.lock:
            while self._filling:
                self.clock.wait(self._fill_turn, None)
            self._filling = True
            try:
                return self._fill(size, window)
            finally:
                self._filling = False
                self._fill_turn.notify()

    def _fill(self, size: int, window: float) -> list[Held]:
        batch: list[Held] = []
        deadline = math.inf
        while len(batch) < size:
            more = self._take_run_now(size - len(batch))
            if more:
                if not batch:
                    deadline = self.clock.monotonic() + window
                batch += more
                continue
            if self.closing or self.clock.monotonic() >= deadline:
                break
            until = min([deadline, *(d for d, _ in self.deferred)])
            self.clock.wait(self.runnable, None if until == math.inf else until)
        return batch

    def _take_run_now(self, limit: int) -> list[Held]:
        """A deferred message that is due, else up to ``limit`` waiting ones (FIFO: a run
        of one group with none running)."""
        now = self.clock.monotonic()
        for index, (due, deferred) in enumerate(self.deferred):
            if due <= now:
                del self.deferred[index]
                return [deferred]
        return self.pending.take_run(limit)

    def _take_now(self) -> Held | None:
        run = self._take_run_now(1)
        return run[0] if run else None

    def defer(self, held: Held, due: float) -> None:
        """Set a running duplicate aside until ``due``: it takes no room meanwhile. Not
        once closing (the caller looks, under ``lock``)."""
        with self.lock:
            assert not self.closing
            held.deferrals += 1
            self.deferred.append((due, held))
            self.runnable.notify()  # a waiting handler thread looks at its due time
            if self._watcher is not None:
                self._watcher.notify()  # the watcher does, with the hand-over
            self.room_changed()  # it takes no room now: receives may go on

    def reclaim(self, held: Held, deferrals: int | None) -> bool:
        """Whether a message whose step failed is still its thread's: one it set aside
        among the deferred is, while it is there (taken back here); one another thread or
        the shutdown took from there since (``deferrals`` is its count when the thread
        took it; None: not known, the caller's own) is theirs."""
        with self.lock:
            for index, (_, deferred) in enumerate(self.deferred):
                if deferred is held:
                    del self.deferred[index]
                    return True
            return deferrals is None or held.deferrals == deferrals

    def undefer(self, batch: list[Held], kept: list[Held]) -> list[Held]:
        """A batch's thread failed: those of ``kept`` (set aside by it) that another
        thread took from the deferred since, which are no longer the batch's; the rest of
        the batch is taken back from among the deferred."""
        with self.lock:
            deferred = {id(h) for _, h in self.deferred}
            gone = [h for h in kept if id(h) not in deferred]
            self.deferred = [(d, h) for d, h in self.deferred if h not in batch]
        return gone

    def blocks_its_group(self, held: Held) -> bool:
        """True when SQS holds back the message's FIFO group until it is deleted: when no
        later message of its group is here. Then its delete goes at once instead of
        waiting up to --delete-interval for a batch."""
        if not isinstance(self.pending, Lanes):
            return False
        with self.lock:
            return not self.pending.waiting(held)

    def finish(self, held: Held, took: float = 0.0) -> list[Held]:
        """A message is through its handler: it no longer counts. On a FIFO queue, the
        group's later messages must not overtake one that comes back: they no longer
        count either, and are returned for the caller to hand back (under ``lock``, so a
        shutdown cannot stop the lease thread before their returns are queued)."""
        if took > 0:  # the pace the hand-over wakes threads by
            self._took = took if self._took == 0 else self._took + 0.1 * (took - self._took)
        later = self.pending.finish(held, settled=held.gone)
        self.unfinished -= 1 + len(later)
        self.room_changed()  # room for the receives; the shutdown waits for none unfinished
        if isinstance(self.pending, Lanes):
            self.runnable.notify()  # the group's next message may run now
        return later

    # -- the shutdown ----------------------------------------------------------------------

    def close(self) -> list[Held]:
        """No more running once what is waiting is gone: the waiting and the deferred are
        taken out (to be handed back) and no longer count."""
        with self.lock:
            waiting = self.pending.drain() + [held for _, held in self.deferred]
            self.deferred.clear()
            self.unfinished -= len(waiting)
            self.closing = True
            self.slots.notify_all()
            if self.wake_receiver is not None:
                self.wake_receiver()
            self.runnable.notify_all()
            self._unpark(len(self._parked))
            if self._watcher is not None:
                self._watcher.notify()
        return waiting

    def wait_finished(self, deadline: float) -> bool:
        """Wait until every running message is through its handler, or the deadline."""
        with self.lock:
            while self.unfinished > 0 and self.clock.monotonic() < deadline:
                self.clock.wait(self.slots, deadline)
            return self.unfinished == 0
