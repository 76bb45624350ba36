"""Where the log lines go: gathered where they are logged, written by a thread of their own.

The worker writes a line for every message it handles (``message processed``). Written
where it was logged, each line took the stream's lock and one ``write(2)`` on the
handler's thread, and under load every such write handed the GIL to another thread and
waited to take it back: at 2,000 messages a second, about 200 µs of CPU a message, more
than the message's own SQS calls. Here a line at INFO or below is appended to a deque
(no lock), and the writer thread writes what gathered in one write, ``INTERVAL`` seconds
after the first of them. A line at WARNING or above is written at once, after every line
gathered before it: the order of the lines is the order they were logged in, and a
warning is never late.

Nothing is left unwritten at exit (``atexit``) or when ``flush`` is called; a process
killed by SIGKILL loses at most the INFO lines of its last ``INTERVAL``. Once the process
is ending (``close``: at exit, or before ``sqsworker run``'s ``os._exit``) every line is
written at once by its caller, as the threads still running (daemon threads, an
``atexit`` function registered before this output was made) may log after that last
flush and no writer thread would write them in time. A stream that
cannot be written to (its reader gone) loses the lines, never a thread; one whose reader
stalls holds at most ``MOST_GATHERED`` lines here, then the callers wait on it.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections import deque
from typing import Any, TextIO

INTERVAL = 0.05  # seconds an INFO line may wait to be written with those after it
ROUND = 1.0  # seconds at most between the writer thread's looks at what gathered
# Lines gathered at most: past them (a stream whose reader stalls) each caller writes
# what gathered itself, waiting on the stream as every line did before, so the lines
# slow the worker down rather than fill its memory.
MOST_GATHERED = 10_000


class LogOutput:
    def __init__(self, stream: TextIO, interval: float = INTERVAL) -> None:
        self.stream = stream
        self.interval = interval
        self._gathered: deque[str] = deque()  # append and popleft need no lock
        self._write = threading.Lock()  # one writer at a time, so lines keep their order
        self._writer: int | None = None  # the thread holding ``_write``
        self._late = False  # set: lines logged by the writing thread during its write
        self._ready = threading.Event()  # set: lines gathered, the writer thread is due
        self._thread: threading.Thread | None = None
        self._writer_thread: int | None = None  # the writer thread's ident, once it runs
        self._start_lock = threading.Lock()
        self._closed = False  # set: the process is ending, every line is written at once
        atexit.register(self.close)
        os.register_at_fork(after_in_child=self._forked)

    def later(self, line: str) -> None:
        """Write ``line`` (no newline) within ``interval``, with those gathered beside it."""
        self._gathered.append(line)
        if self._closed or len(self._gathered) > MOST_GATHERED:
            # Ending (read after the append: ``close`` drains it, or this flush does), or
            # the stream does not keep up: the caller writes.
            self.flush()
        elif not self._ready.is_set() and threading.get_ident() != self._writer_thread:
            # The writer clears the flag before it takes the lines, so a line appended
            # after it took them finds the flag clear and sets it again. The writer thread
            # sets no flag: a finalizer the garbage collector runs on it inside the flag's
            # clear() would wait forever on the flag's lock; its next round takes the line.
            if self._thread is None:
                self._start()
            self._ready.set()

    def now(self, line: str) -> None:
        """Write ``line`` at once, after every line gathered before it."""
        self._write_out(line)

    def flush(self) -> None:
        """Write every line gathered so far."""
        self._write_out(None)

    def close(self) -> None:
        """Write every line gathered so far, and each line logged from now on at once."""
        self._closed = True
        self.flush()

    def _forked(self) -> None:
        """In a child made by fork (a handler's multiprocessing pool): the lines gathered
        are the parent's to write, the writer thread and the lock's holder stayed there,
        and the child may leave by ``os._exit`` as multiprocessing's do, so each of its
        lines is written at once."""
        self._gathered.clear()
        self._write = threading.Lock()
        self._writer = None
        self._late = False
        self._closed = True

    def _write_out(self, last: str | None) -> None:
        """Write what gathered, and ``last``, in one write, one thread at a time."""
        if self._writer == threading.get_ident():
            # Logged by the thread that is writing: a finalizer the garbage collector ran
            # in the middle of the write (asyncio's "Task was destroyed but it is pending!").
            # Taking the lock again would wait forever; the line goes out in a write of its
            # own once this one is done, after the lines this one took.
            if last is not None:
                self._gathered.append(last)
            self._late = True
            return
        with self._write:
            self._writer = threading.get_ident()
            try:
                self._drain(last)
                while self._late:
                    self._late = False
                    self._drain(None)
            finally:
                self._writer = None

    def _drain(self, last: str | None) -> None:
        """Write what gathered (and ``last``) in one write. Under ``_write``."""
        gathered, parts = self._gathered, []
        while True:
            try:
                parts.append(gathered.popleft())
            except IndexError:
                break
        if last is not None:
            parts.append(last)
        if not parts:
            return
        parts.append("")  # the last line's newline
        try:
            self.stream.write("\n".join(parts))
            self.stream.flush()
        except Exception:  # the reader went away, the stream was closed: lines, not threads
            pass

    def _start(self) -> None:
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="sqsworker-log-writer", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        self._writer_thread = threading.get_ident()
        while True:
            if not self._ready.wait(ROUND) and not self._gathered:
                continue
            time.sleep(self.interval)  # the lines logged meanwhile go in the same write
            self._ready.clear()
            self.flush()


_shared: LogOutput | None = None
_shared_lock = threading.Lock()


def shared(stream: TextIO) -> LogOutput:
    """The process's one ``LogOutput``, writing to ``stream`` from now on (what it gathered
    for the stream before is written there first)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = LogOutput(stream)
        elif _shared.stream is not stream:
            _shared.flush()
            _shared.stream = stream
        _shared._closed = False  # configured again (a test's process): gathering again
        return _shared


def flush() -> None:
    """Write every line gathered so far (by the shared output, if there is one)."""
    if _shared is not None:
        _shared.flush()


def close() -> None:
    """The process is ending: write every line gathered so far, and those logged from now
    on (by threads still running) at once."""
    if _shared is not None:
        _shared.close()


class OutputLogger:
    """structlog's logger for a ``LogOutput``: it calls the method named by the level."""

    def __init__(self, output: LogOutput) -> None:
        self._output = output

    def later(self, message: str) -> None:
        self._output.later(message)

    def now(self, message: str) -> None:
        self._output.now(message)

    msg = log = debug = info = later
    warn = warning = err = error = critical = fatal = exception = failure = now


class OutputFactory:
    """structlog's ``logger_factory``: every logger writes to the one ``LogOutput``."""

    def __init__(self, output: LogOutput) -> None:
        self._logger = OutputLogger(output)

    def __call__(self, *args: Any) -> OutputLogger:
        return self._logger


class OutputHandler(logging.Handler):
    """The standard ``logging`` module's records (boto3's, the handler's own), to the same
    ``LogOutput``: WARNING and above at once, the rest gathered."""

    def __init__(self, output: LogOutput) -> None:
        super().__init__()
        self._output = output

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
            if record.levelno >= logging.WARNING:
                self._output.now(text)
            else:
                self._output.later(text)
        except Exception:
            self.handleError(record)
