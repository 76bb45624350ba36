"""The log lines' way out: INFO lines gathered and written by a thread of their own, in
one write; WARNING and above at once, after what gathered before them; nothing lost at
exit, nor a thread to a broken stream."""

from __future__ import annotations

import atexit
import io
import json
import logging
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import structlog

from sqsworker import log_output
from sqsworker.log_output import LogOutput, OutputHandler
from sqsworker.logs import configure

from ..conftest import wait_until

ROOT = Path(__file__).resolve().parents[2]


class Recording(io.StringIO):
    """A stream that keeps each write apart."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []
        self.broken = False

    def write(self, text: str) -> int:
        if self.broken:
            raise BrokenPipeError(32, "Broken pipe")
        self.writes.append(text)
        return super().write(text)


def test_info_lines_go_out_together_in_order_from_the_writer_thread() -> None:
    stream = Recording()
    output = LogOutput(stream, interval=0.05)
    for i in range(100):
        output.later(f"line {i}")
    wait_until(lambda: stream.getvalue().count("\n") == 100, what="the lines written")
    assert stream.getvalue() == "".join(f"line {i}\n" for i in range(100))
    assert len(stream.writes) <= 2  # gathered: one write (two if the writer woke mid-way)


def test_a_warning_is_written_at_once_after_the_lines_gathered_before_it() -> None:
    stream = Recording()
    output = LogOutput(stream, interval=60)  # the writer thread would wait a minute
    output.later("first")
    output.later("second")
    output.now("a warning")
    assert stream.getvalue() == "first\nsecond\na warning\n"  # nothing waited
    output.later("third")
    assert stream.getvalue() == "first\nsecond\na warning\n"
    output.flush()
    assert stream.getvalue().endswith("a warning\nthird\n")


def test_lines_of_many_threads_are_each_written_once_in_each_threads_order() -> None:
    stream = Recording()
    output = LogOutput(stream, interval=0.001)

    def log(name: str) -> None:
        for i in range(500):
            if i % 100 == 99:
                output.now(f"{name} {i}")
            else:
                output.later(f"{name} {i}")

    threads = [threading.Thread(target=log, args=(f"t{n}",)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    output.flush()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 8 * 500
    for n in range(8):
        own = [int(line.split()[1]) for line in lines if line.startswith(f"t{n} ")]
        assert own == list(range(500))


def test_a_broken_stream_loses_its_lines_not_the_writer_thread() -> None:
    stream = Recording()
    output = LogOutput(stream, interval=0.001)
    stream.broken = True
    output.later("lost")
    output.now("lost too")  # the caller's thread is not hurt either
    wait_until(lambda: not output._gathered, what="the lost line taken")
    stream.broken = False
    output.later("after")
    wait_until(lambda: stream.getvalue() == "after\n", what="the writer thread writing again")


@pytest.mark.parametrize("ending", ["return", "raise", "os._exit after flush"])
def test_nothing_gathered_is_lost_when_the_process_ends(ending: str) -> None:
    """`sqsworker run`'s way out: the interpreter's exit (normal or by an exception), or
    ``os._exit`` after ``log_output.flush()`` (abandoned coroutine threads)."""
    end = {
        "return": "",
        "raise": "raise SystemExit(3)",
        "os._exit after flush": "log_output.flush(); os._exit(3)",
    }[ending]
    program = f"""
import os
from sqsworker import log_output
from sqsworker.logs import configure
import structlog
configure("info", "json")
log = structlog.get_logger("sqsworker")
for i in range(1000):
    log.info("processed", n=i)
{end}
"""
    done = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    numbers = [json.loads(line)["n"] for line in done.stderr.splitlines()]
    assert numbers == list(range(1000)), done.stderr[-500:]


def test_configure_sends_structlog_and_standard_logging_lines_by_their_level(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stream = Recording()
    monkeypatch.setattr("sys.stderr", stream)
    configure("info", "json")
    try:
        output = log_output.shared(stream)
        output.interval = 60  # nothing goes out by the clock during the test
        structlog.get_logger("sqsworker").info("gathered")
        logging.getLogger("botocore").warning("at once")
        events = [json.loads(line)["event"] for line in stream.getvalue().splitlines()]
        assert events == ["gathered", "at once"]  # the warning took the line before it out
        structlog.get_logger("sqsworker").info("later")
        logging.getLogger("app").error("an error")
        events = [json.loads(line)["event"] for line in stream.getvalue().splitlines()]
        assert events == ["gathered", "at once", "later", "an error"]
    finally:
        log_output.shared(stream).interval = log_output.INTERVAL
        structlog.reset_defaults()
        logging.getLogger().handlers = []


def run_program(program: str) -> list[str]:
    """The events of the JSON lines a Python program wrote to its stderr."""
    done = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    return [json.loads(line)["event"] for line in done.stderr.splitlines()]


def test_a_line_logged_by_an_atexit_function_registered_before_configure_is_written() -> None:
    """atexit runs the last registered first: the output's own flush came before it."""
    events = run_program("""
import atexit
import structlog
log = structlog.get_logger("sqsworker")
atexit.register(lambda: log.info("at exit"))
from sqsworker.logs import configure
configure("info", "json")
log.info("running")
""")
    assert events == ["running", "at exit"]


def test_a_line_logged_after_sqsworker_runs_last_flush_is_written_before_os_exit() -> None:
    """`sqsworker run` closes the output, then leaves by ``os._exit`` while abandoned
    threads may still log: a line whose log call returned is written."""
    events = run_program("""
import os
import threading
import structlog
from sqsworker import log_output
from sqsworker.logs import configure
configure("info", "json")
log = structlog.get_logger("sqsworker")
log.info("before")
log_output.close()  # cli.py's finally
thread = threading.Thread(target=lambda: log.info("from an abandoned thread"))
thread.start()
thread.join()
os._exit(3)
""")
    assert events == ["before", "from an abandoned thread"]


def test_every_json_line_parses_whatever_a_handler_logs(json_logs: io.StringIO) -> None:
    """orjson refuses an integer past 64 bits: the json module's line then, which wrote
    NaN (not JSON) and refused a tuple key. A numpy float stays a number, as it was."""
    import numpy

    class Unprintable:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    itself: dict[str, object] = {}
    itself["itself"] = itself
    log = structlog.get_logger("sqsworker")
    log.info("big", big=2**70, nan=float("nan"), pair={(1, 2): float("inf")}, loop=itself)
    log.info("small", nan=float("nan"), pair={(1, 2): 1}, price=numpy.float64(1.5))
    log.info("odd", value=Unprintable())

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    lines = [json.loads(line, parse_constant=refuse) for line in json_logs.getvalue().splitlines()]
    assert [line["event"] for line in lines] == ["big", "small", "odd"]
    assert lines[0]["big"] == 2**70 and lines[0]["nan"] is None
    assert lines[0]["pair"] == {"(1, 2)": None}
    assert lines[0]["loop"] == {"itself": "{'itself': {...}}"}
    assert lines[1]["nan"] is None and lines[1]["pair"] == {"(1, 2)": 1}
    assert lines[1]["price"] == 1.5
    assert lines[2]["value"] == "<Unprintable (its repr failed)>"


def test_a_line_logged_on_the_writer_thread_in_the_middle_of_its_write_is_written_after() -> None:
    """The garbage collector runs a finalizer on whichever thread it collects on, the writer
    thread in the middle of a write among them; asyncio's tasks log an error from one."""
    output = LogOutput(Recording(), interval=0.001)
    logger = logging.getLogger("tests.finalizers")
    logger.addHandler(OutputHandler(output))
    logger.propagate = False

    class Pending:
        def __del__(self) -> None:
            logger.error("Task was destroyed but it is pending!")

    class Collecting(Recording):
        def __init__(self) -> None:
            super().__init__()
            self.garbage = [Pending()]

        def write(self, text: str) -> int:
            written = super().write(text)
            self.garbage.clear()  # its finalizer runs here, on the writing thread
            return written

    output.stream = stream = Collecting()
    try:
        output.later("processed")
        wait_until(lambda: len(stream.writes) == 2, what="the finalizer's line written")
        assert stream.writes == ["processed\n", "Task was destroyed but it is pending!\n"]
        logger.warning("a warning after")  # the lock was not lost either
        assert stream.writes[-1] == "a warning after\n"
    finally:
        logger.handlers = []
        atexit.unregister(output.close)


def test_the_error_sentence_comes_after_the_lines_logged_before_it() -> None:
    """A second handler that cannot start within 0.05 s of the first's ``worker started``."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            """
import structlog
from sqsworker.exits import fail
from sqsworker.logs import configure
configure("info", "json")
structlog.get_logger("sqsworker").info("worker started")
fail("handler work_too: queue 'no-such-queue' does not exist")
""",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    started, error = done.stderr.splitlines()
    assert json.loads(started)["event"] == "worker started"
    assert error.startswith("sqsworker: error: handler work_too")


def test_a_forked_child_writes_its_own_lines_once_and_not_the_parents() -> None:
    """A handler's multiprocessing pool (fork on Linux): its children leave by ``os._exit``;
    a child that leaves by the interpreter's exit runs the atexit flush."""
    events = run_program("""
import multiprocessing
import os
import sys
import warnings
import structlog
from sqsworker.logs import configure
warnings.simplefilter("ignore", DeprecationWarning)  # 3.12: fork with threads running
configure("info", "json")
log = structlog.get_logger("sqsworker")
log.info("parent")  # gathered when the children are made
child = multiprocessing.get_context("fork").Process(target=lambda: log.info("pool child"))
child.start()
child.join()
pid = os.fork()
if pid == 0:
    log.info("forked child")
    sys.exit(0)
os.waitpid(pid, 0)
""")
    assert sorted(events) == ["forked child", "parent", "pool child"]


def test_an_info_line_logged_by_a_finalizer_inside_the_writers_flag_clear_is_written() -> None:
    """Seen with a finalizer that logs (a connection closing itself): the collector ran it
    on the writer thread inside ``Event.clear()``, the flag's lock held and the flag clear;
    setting the flag again waited forever on that lock, and every INFO call after it."""
    output = LogOutput(stream := Recording(), interval=0.001)

    class Closing:
        def __del__(self) -> None:
            output.later("connection closed")

    class Collected(threading.Event):
        """The flag whose clear() the collector interrupts, once."""

        def __init__(self) -> None:
            super().__init__()
            self.garbage = [Closing()]

        def clear(self) -> None:
            with self._cond:  # type: ignore[attr-defined]
                self._flag = False  # type: ignore[attr-defined]
                self.garbage.clear()  # the collector runs the finalizer here

    output._ready = Collected()
    try:
        output.later("processed")
        wait_until(lambda: stream.getvalue().count("\n") == 2, what="both lines written")
        assert stream.getvalue() == "processed\nconnection closed\n"
        output.later("next")  # no thread waits on the flag's lock
        wait_until(lambda: stream.getvalue().endswith("next\n"), what="the next line")
    finally:
        atexit.unregister(output.close)


def test_a_stalled_reader_holds_up_the_callers_rather_than_gathering_lines_without_end() -> None:
    stream = Recording()
    output = LogOutput(stream, interval=60)  # the writer thread would not write for a minute
    for i in range(log_output.MOST_GATHERED):
        output.later(f"line {i}")
    assert stream.writes == []  # gathered up to the bound
    output.later("one more")  # past it: the caller writes what gathered, this line too
    assert len(output._gathered) == 0
    assert stream.getvalue().splitlines()[-1] == "one more"
    assert stream.getvalue().count("\n") == log_output.MOST_GATHERED + 1


def test_a_stream_failing_in_any_way_loses_its_lines_not_the_writer_thread() -> None:
    class Odd(Recording):
        def write(self, text: str) -> int:
            if "boom" in text:
                raise RuntimeError("a stream of a kind nobody expected")
            return super().write(text)

    stream = Odd()
    output = LogOutput(stream, interval=0.001)
    output.later("boom")
    wait_until(lambda: not output._gathered, what="the line taken")
    output.later("after")
    wait_until(lambda: stream.getvalue() == "after\n", what="the writer thread writing again")
