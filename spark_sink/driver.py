"""The driver's side of the source: the leases of uncommitted batches, and their deletes.

A watcher thread reads each planned slot of the write-ahead log by name until it is
written and hands its messages to a ``LeaseKeeper`` (the worker's lease thread), each
lease dated from its own receive; a commit deletes a batch's messages, several calls at
once, and removes its slots once SQS answered. Slots an earlier driver left are handed
back at the commit that covers them, never deleted.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor

import structlog

from sqsworker.clock import SystemClock
from sqsworker.lease import Held, HeldLease, LeaseKeeper
from sqsworker.logs import LogObserver
from sqsworker.message import Message
from sqsworker.transports import QueueInfo
from sqsworker.transports.sqs import SQSTransport

from .options import SourceOptions
from .wal import Slot, WriteAheadLog, open_log

WATCH_EVERY = 0.5  # seconds between the driver's looks for a late slot, when none is due
DUE_FOR = 120.0  # seconds a planned slot is looked for often (the log's look_every); then
# every WATCH_EVERY until its batch commits
LEASE_SENDERS = 16  # renewals and deletes the driver has under way at once, at most
DELETE_TIMEOUT = 60.0  # seconds a commit waits for SQS to answer its deletes
RETURN_POLL = 1.0  # seconds between availableNow's looks for committed messages come back
# Seconds past the moment counted here that they are looked for: SQS's countdown began when
# the receive reached it, after the executor dated the lease.
RETURN_GRACE = 10.0
log = structlog.get_logger("spark_sink")


class Driver:
    """The driver's side: leases of uncommitted batches, and their deletes."""

    def __init__(self, options: SourceOptions, info: QueueInfo) -> None:
        self.options = options
        self.queue_url = info.url
        # a connection for each sender, and one for latestOffset's counts
        self.transport = SQSTransport.reopen(
            info,
            endpoint_url=options.endpoint_url,
            region=options.region,
            max_connections=LEASE_SENDERS + 2,
        )
        self.clock = SystemClock()
        # Renewals due together, and a commit's deletes, go out LEASE_SENDERS at a time.
        self.keeper = LeaseKeeper(
            self.transport, self.clock, SourceLog("spark_sink"), senders=LEASE_SENDERS
        )
        self.keeper.start()
        self.wal: WriteAheadLog = open_log(options.wal_path, options.region)
        self.look_every = self.wal.look_every(options.visibility_timeout)
        self.planned = 0
        # guards _held, _seen, _due, _known and _committed across a whole adopt or commit,
        # so a slot is never adopted into a batch that a commit already took
        self._lock = threading.RLock()
        self._held: dict[int, list[Held]] = {}  # seq -> its messages, leases kept
        # Slots an earlier driver left that this one has not planned: a committed batch's
        # whose deletes were not seen answered, or one a late task attempt wrote after its
        # batch committed (messages no batch returned). Not told apart, they are handed
        # back at the commit, never deleted: what comes again is dropped by message_id.
        self._left: dict[tuple[int, int], list[Held]] = {}
        self._seen: set[tuple[int, int]] = set()  # (seq, partition) slots handed to the keeper
        # slots planned whose slot is not seen yet -> until when to look for it often (a
        # task that never writes its slot, a query that failed, is looked for rarely then)
        self._due: dict[tuple[int, int], float] = {}
        self._known: set[tuple[int, int]] = set()  # every slot that may be in the log
        self._committed = 0
        self._closing = False
        # When the messages of committed batches not deleted (a lease lapsed, a delete
        # failed: SQS delivers them again) are visible at the latest (monotonic); or None
        self._returned_by: float | None = None
        self._nudge = threading.Event()  # a slot was planned, or close() was called
        self._closed = threading.Event()  # close() was called: await_returned() returns
        # A commit's deletes go on while the next batch is planned and read: one commit
        # at a time, in order; settle() and close() wait for them.
        self._committer = ThreadPoolExecutor(1, thread_name_prefix="spark-sink-commit")
        self._last_commit: Future[None] | None = None
        # What an earlier driver of this query left: the one listing of the log.
        with self._lock:
            for slot in self.wal.slots():
                self._adopt(slot, left=True)
        self._watcher = threading.Thread(target=self._watch, name="spark-sink-wal", daemon=True)
        self._watcher.start()

    def visible(self) -> int:
        return self.transport.counts().visible

    def expect(self, slots: Iterable[tuple[int, int]]) -> None:
        """Partitions planned: look for their slots often until each is there."""
        until = time.monotonic() + max(DUE_FOR, 2 * self.options.visibility_timeout)
        with self._lock:
            for key in slots:
                self._known.add(key)
                if key in self._left:  # a batch replayed: its rows are returned again
                    self._held.setdefault(key[0], []).extend(self._left.pop(key))
                if key not in self._seen:
                    self._due[key] = until
        self._nudge.set()

    def looking_often(self) -> bool:
        with self._lock:
            now = time.monotonic()
            return any(until > now for until in self._due.values())

    def _watch(self) -> None:
        # Each slot is adopted within look_every of being written, while its partition
        # runs: the executor dated its leases from its first receive, and they are due
        # for renewal half a visibility timeout from then.
        while not self._closing:
            try:
                self.adopt()
            except Exception:  # an unreadable log, a storage error: look again, and say so
                log.exception("reading the write-ahead log failed; looking again")
            self._nudge.wait(self.look_every if self.looking_often() else WATCH_EVERY)
            self._nudge.clear()

    def adopt(self) -> None:
        """Keep alive the leases of every planned slot written since the last look (read
        by name: the log is not listed).

        The watcher reads without the lock, so a slow store never holds up a commit; a
        commit reads again under it (commit_through), and a slot found here after its
        batch was committed is not adopted again (``_adopt``).
        """
        with self._lock:
            wanted = [key for key in self._due if key[0] > self._committed]
        if not wanted:
            return
        found = self.wal.find(wanted)
        with self._lock:
            for slot in found:
                self._adopt(slot)

    def _adopt(self, slot: Slot, left: bool = False) -> None:
        key = slot.key
        self._due.pop(key, None)
        self._known.add(key)
        if slot.seq <= self._committed or key in self._seen:
            return
        self._seen.add(key)
        if slot.queue and slot.queue != self.queue_url:  # another query's: its task fails
            log.error(
                "a write-ahead log slot holds messages of another queue; its leases are "
                "not kept here (give each query a walPath of its own)",
                path=self.wal.where(*key),
                queue=slot.queue,
            )
            return
        # Each lease from when its own receive began (a partition that received nothing
        # holds none). The keeper counts on its monotonic clock; the log on the wall's.
        offset = self.clock.monotonic() - self.clock.time()
        for began, envelopes in slot.leases():
            held = self.keeper.add(envelopes, began + offset, self.options.visibility_timeout)
            if left:
                self._left.setdefault(key, []).extend(held)
            else:
                self._held.setdefault(slot.seq, []).extend(held)

    def commit_through(self, seq: int) -> None:
        """Delete every message of every batch up to ``seq``, then forget their log.

        The deletes go on after this returns, so the next batch is read meanwhile; their
        leases are kept until SQS answers, and the log stays until then (a driver
        restarted before then hands them back from it). ``settle()`` waits for them.
        """
        with self._lock:
            if seq <= self._committed:
                return
            self.adopt()  # a slot written since the last look is committed too
            batches = [self._held.pop(s) for s in list(self._held) if s <= seq]
            returned = [h for key in list(self._left) if key[0] <= seq for h in self._left.pop(key)]
            self._due = {key: until for key, until in self._due.items() if key[0] > seq}
            slots = {key for key in self._known if key[0] <= seq}
            self._known -= slots
            self._committed = seq
            held = [h for batch in batches for h in batch]
            self._last_commit = self._committer.submit(self._settle, seq, held, slots, returned)

    def await_returned(self) -> bool:
        """Wait until a message is visible again, while committed messages not deleted (a
        lease lost, a delete refused) may still come back; True if one is, False once
        they all may have and none is (or the driver is closing).

        Counted here, a lease ends before SQS's: it is dated from when its receive began,
        SQS's from when the receive reached it. So SQS is asked every RETURN_POLL until
        RETURN_GRACE past the latest moment counted here, and a message that comes back
        sooner (a renewal whose answer was lost was not applied) is read at once; the
        moment is kept until it has passed, so what comes back later is waited for too.
        """
        while True:
            with self._lock:
                by = self._returned_by
            if by is None:
                return False
            if self.visible() > 0:
                return True
            left = by + RETURN_GRACE - time.monotonic()
            if left <= 0:
                with self._lock:
                    if self._returned_by == by:  # none later came meanwhile
                        self._returned_by = None
                return False
            if self._closed.wait(min(RETURN_POLL, left)):
                return False

    def settle(self) -> None:
        """Wait until every commit so far has its deletes answered and its log gone."""
        with self._lock:
            last = self._last_commit
        if last is not None:
            last.result()

    def _settle(
        self,
        seq: int,
        held: list[Held],
        slots: set[tuple[int, int]],
        returned: list[Held] | None = None,
    ) -> None:
        if returned:
            log.warning(
                "messages an earlier driver left in the write-ahead log of a committed "
                "batch are handed back; those a batch returned are dropped by message_id "
                "when they come again",
                count=len(returned),
                batch_id=seq - 1,
            )
        try:
            unsent = self.keeper.hand_back_now(returned or [], DELETE_TIMEOUT)
            unsent += self.keeper.delete_now(held, DELETE_TIMEOUT)
        except Exception:  # the log stays: a restarted driver hands them back
            log.exception("deleting committed messages failed", batch_id=seq - 1)
            return
        if unsent:
            log.warning(
                "deletes of committed messages still unanswered; they may be delivered again",
                count=unsent,
                batch_id=seq - 1,
            )
        back = [h.may_hold_for for h in held if h.lost]
        if back:
            with self._lock:
                by = time.monotonic() + max(back)
                self._returned_by = max(self._returned_by or by, by)
        # The log goes once SQS answered: a driver restarted before then hands them back.
        try:
            self.wal.drop(slots)
        except Exception:  # left behind: a restarted driver hands back, and drops them
            log.exception("removing committed slots of the write-ahead log failed")
            return
        with self._lock:
            self._seen = {key for key in self._seen if key[0] > seq}

    def close(self) -> None:
        self._closed.set()
        # The commits' deletes first: when the query ends here, this process ends with it.
        self._committer.shutdown(wait=True)
        self._closing = True
        self._nudge.set()
        self._watcher.join()
        self.keeper.stop(give_up_after=10)
        self.transport.close()


class SourceLog(LogObserver):
    """The worker's log lines, said as they apply to a batch: delivery is at least once,
    and the pipeline's dropDuplicatesWithinWatermark(["message_id"]) (or any sink keyed
    by message id) drops what comes twice."""

    def delete_failed(self, message: Message, reason: str, will_retry: bool) -> None:
        if will_retry:
            super().delete_failed(message, reason, will_retry)
            return
        held = message.lease.held if isinstance(message.lease, HeldLease) else None
        if held is not None and held.disowned:
            # Some servers delete on a stale receipt handle, some do not.
            self._for(message).warning(
                "delete of a committed message not confirmed: its lease was lost, so it "
                "may not have been deleted; if it comes again, the pipeline drops it by its "
                "message_id",
                reason=reason,
            )
            return
        self._for(message).error(
            "delete of a committed message failed: SQS will deliver it again; the pipeline "
            "drops it by its message_id",
            reason=reason,
        )

    def lease_lost(self, message: Message, reason: str) -> None:
        self._for(message).warning(
            "lease lost: another consumer may receive this message; if it comes again, "
            "the pipeline drops it by its message_id",
            reason=reason,
        )
