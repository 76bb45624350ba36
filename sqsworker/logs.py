"""Structured logs: an ``Observer`` that turns worker events into structlog lines.

Every message-scoped line carries queue, message_id, receive_count, handler, the
group id when the message has one, and, when the producer sent one, the AWS trace
header. Message bodies are logged only
with ``--log-bodies``; credentials never.

``configure`` renders every line the process writes the same way, JSON or
console: structlog's own, and those of the standard ``logging`` module (boto3,
the user's code) through structlog's ``ProcessorFormatter``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import operator
import os
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import orjson
import structlog

from . import log_output, tracing
from .batches import BatchItemFailed
from .errors import Reject
from .events import HANDED_BACK_BEHIND, Observer

if TYPE_CHECKING:
    from .config import WorkerConfig
    from .errors import Retry, TransportError
    from .message import Message
    from .transports import QueueInfo


BODY_LIMIT = 4096  # characters of a body logged with --log-bodies
TRACE_SHOWN = "_sqsworker_trace_shown"  # set on an error whose traceback a line showed


def configure(level: str = "info", fmt: str = "auto") -> None:
    as_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        tracing.log_fields,  # trace_id and span_id, when a span is current
        structlog.processors.add_log_level,
        UtcStamper() if as_json else structlog.processors.TimeStamper(fmt="%H:%M:%S", utc=False),
    ]
    renderer: Any
    global _direct
    _direct = None
    if as_json:
        shared.append(structlog.processors.format_exc_info)
        renderer = structlog.processors.JSONRenderer(serializer=_json)
    else:
        # Short lines for a person reading: the handler's frames only in a traceback (a
        # failure shows one only on its last attempt), no key that only repeats the id.
        renderer = structlog.dev.ConsoleRenderer(
            colors=sys.stderr.isatty(), exception_formatter=handler_traceback
        )
        shared.append(_key_unless_the_id)
    # Lines are written by a thread of their own, a few at a time (log_output.py says why).
    output = log_output.shared(sys.stderr)
    processors = [*shared, renderer]
    factory = log_output.OutputFactory(output)
    threshold = logging.getLevelNamesMapping()[level.upper()]
    wrapper = structlog.make_filtering_bound_logger(threshold)
    structlog.configure(
        processors=processors,
        wrapper_class=wrapper,
        logger_factory=factory,
        cache_logger_on_first_use=False,
    )
    if threshold <= logging.INFO:
        _direct = _DirectLines(processors, wrapper, factory)
    # The standard library's records (boto3's warnings, the handler's own logging
    # calls) go through the same processors; third-party chatter stays at WARNING.
    stream = log_output.OutputHandler(output)
    stream.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root = logging.getLogger()
    root.handlers = [stream]
    root.setLevel(logging.WARNING)


_PACKAGE = str(Path(__file__).resolve().parent) + os.sep


class _DirectLines:
    """The INFO lines of the configuration ``configure`` made, run through its processors
    without structlog's bound logger: the same line, at under half its cost. Every message
    handled writes one (``message processed``): 20 µs through the bound logger, 8 here (one
    thread, no contention), where the worker spends 100 to 200 µs a message at an HTTP
    endpoint. The bound logger's share is copying its context, looking up the level's
    method and checking what the last processor returned, which a configuration known to
    end in a renderer of text needs none of. Used only while that configuration is
    structlog's (the user's own ``structlog.configure`` replaces it, and the lines go the
    usual way; a test's ``capture_logs`` swaps the processors in the same list, which
    then capture the line as a logger's would)."""

    def __init__(self, processors: list[Any], wrapper: Any, factory: Any) -> None:
        self.processors, self.wrapper, self.factory = processors, wrapper, factory
        self.logger = factory()

    def current(self) -> bool:
        """structlog's configuration is still the one ``configure`` made, with a logger's
        context a plain dict (``configure`` leaves the context class as it finds it: one
        of the user's may add fields, or keep a thread's)."""
        config = structlog.get_config()
        return (
            config["processors"] is self.processors
            and config["wrapper_class"] is self.wrapper
            and config["logger_factory"] is self.factory
            and config["context_class"] is dict
        )

    def info(self, event: dict[str, Any]) -> None:
        logger, line = self.logger, event
        try:
            for processor in self.processors:
                line = processor(logger, "info", line)
        except structlog.DropEvent:
            return
        logger.info(line)


_direct: _DirectLines | None = None  # set by ``configure`` for a level at or below INFO


class UtcStamper:
    """A processor: the line's time as ISO 8601 in UTC (``2026-11-27T19:07:46.786517Z``),
    as structlog's ``TimeStamper(fmt="iso", utc=True)`` writes it but at a fifth of its
    cost (4.5 µs a line there, most of a line's processing): the date and the time of day
    are formatted once a second, the microseconds on each line, always as six digits."""

    def __init__(self) -> None:
        self._second: tuple[int, str] = (-1, "")  # one tuple: threads swap it whole

    def __call__(self, logger: Any, name: str, event: dict[str, Any]) -> dict[str, Any]:
        second, micros = divmod(time.time_ns() // 1000, 1_000_000)
        cached = self._second
        if cached[0] != second:
            text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            cached = self._second = (second, text)
        event["timestamp"] = f"{cached[1]}.{micros:06d}Z"
        return event


def _json(event: Mapping[str, Any], **kw: Any) -> str:
    """A JSON line by orjson (a tenth of the json module's time); what orjson refuses (an
    integer past 64 bits, a lone surrogate) by the json module, made plain first so that
    the line is still JSON (NaN as null, as orjson writes it; any key as a string)."""
    kw["default"] = default = _never_failing(kw.get("default", repr))
    try:
        return orjson.dumps(event, default=default, option=_JSON_OPTIONS).decode()
    except orjson.JSONEncodeError:
        return json.dumps(_plain(event, set()), **kw)


@functools.cache  # one per fallback (structlog's renderer passes the same one each line)
def _never_failing(fallback: Any) -> Any:
    """structlog's fallback for a value JSON has no type for (its repr), but a float's
    subclass (numpy's float64) stays a number, and a repr that raises names the type."""

    def default(value: Any) -> Any:
        if isinstance(value, float):
            return float(value)
        try:
            return fallback(value)
        except Exception:
            return f"<{type(value).__name__} (its repr failed)>"

    return default


def _plain(value: Any, within: set[int]) -> Any:
    """``value`` with what the json module would write as no JSON replaced: NaN and the
    infinities by None, a key that is not a str, int, float, bool or None by its str, a
    container inside itself by its repr."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if not isinstance(value, dict | list | tuple):
        return value
    if id(value) in within:
        return repr(value)
    within.add(id(value))
    try:
        if isinstance(value, dict):
            return {
                (k if isinstance(k, str | int | float | bool | None) else str(k)): _plain(v, within)
                for k, v in value.items()
            }
        return [_plain(v, within) for v in value]
    finally:
        within.discard(id(value))


_JSON_OPTIONS = orjson.OPT_NON_STR_KEYS


def handler_traceback(sio: TextIO, exc_info: Any) -> None:
    """A console traceback in Python's plain format, of the frames outside sqsworker:
    where the handler failed, not the worker's frames that called it (their own faults
    keep every frame: none would be left). No local variables: they hold bodies."""
    shown = traceback.TracebackException(*exc_info)
    seen: set[int] = set()
    part: traceback.TracebackException | None = shown
    while part is not None and id(part) not in seen:  # the exception, then its causes
        seen.add(id(part))
        own = [frame for frame in part.stack if not frame.filename.startswith(_PACKAGE)]
        if own:
            part.stack = traceback.StackSummary.from_list(own)
        part = part.__cause__ or (None if part.__suppress_context__ else part.__context__)
    sio.write("\n" + "".join(shown.format()).rstrip("\n"))


def _key_unless_the_id(logger: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
    """Drop ``idempotency_key`` where it is the message id (``auto``'s last resort), which
    every message line shows already."""
    if event.get("idempotency_key") is not None and event.get("idempotency_key") == event.get(
        "message_id"
    ):
        del event["idempotency_key"]
    return event


def summary(counts: Mapping[str, int], **fields: Any) -> None:
    """The closing line of `sqsworker run`: what this worker did."""
    structlog.get_logger("sqsworker").info(
        "summary",
        **fields,
        received=counts.get("received", 0),
        succeeded=counts.get("succeeded", 0),
        failed=counts.get("failed", 0),
        retry_requested=counts.get("retry_requested", 0),
        rejected=counts.get("rejected", 0),
        fifo_handed_back=counts.get("fifo_handed_back", 0),
        dead_lettered=counts.get("dead_lettered", 0),
        skipped=counts.get("skipped", 0),
        leases_extended=counts.get("lease_extensions", 0),
        leases_lost=counts.get("leases_lost", 0),
        handed_back=counts.get("handed_back", 0),
        duplicates_suppressed=counts.get("duplicates_suppressed", 0),
        # Handled, but SQS never took the delete (its lease ran out first): it may run again.
        not_deleted=counts.get("not_deleted", 0),
        worker_errors=counts.get("worker_errors", 0),
    )


def _error(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


SQS_AWAY_AFTER = 10.0  # seconds of failed receives in a row before the log says SQS is away


class LogObserver(Observer):
    def __init__(self, handler: str, logger: Any = None, *, log_bodies: bool = False) -> None:
        self.handler = handler
        self.log = logger or structlog.get_logger("sqsworker")
        self._own_logger = logger is None  # lines may go by ``_direct``
        self.log_bodies = log_bodies
        self.max_receive_count: int | None = None
        self._assembled: tuple[tuple[Any, ...], Any] = ((None,) * 4, None)  # see _logger()
        # Handled messages whose delete SQS never took: they may run again.
        self.not_deleted = 0

    def _trace_once(self, error: BaseException | None) -> BaseException | None:
        """``error``, for its traceback, unless a line showed it before: a batch handler's
        exception fails each of its messages, and one traceback says it. The error itself
        is marked: held here, its frames would hold the batch's messages, and its id may be
        a later error's once it is freed."""
        if error is None:
            return None
        if getattr(error, TRACE_SHOWN, False):
            return None
        with contextlib.suppress(AttributeError, TypeError):  # an exception without a dict
            setattr(error, TRACE_SHOWN, True)
        return error

    def _logger(self) -> Any:
        """The logger itself. ``structlog.get_logger`` gives a lazy proxy, which assembles a
        new logger from structlog's configuration on every bind (8 µs, on every message's
        line); this one is assembled once, and again whenever structlog is configured anew
        (``configure``, or a test's ``capture_logs``)."""
        config = structlog.get_config()
        key = (
            config["processors"],
            config["wrapper_class"],
            config["logger_factory"],
            config["context_class"],
        )
        seen, logger = self._assembled
        if not all(map(operator.is_, seen, key)):
            logger = self.log.bind()
            self._assembled = (key, logger)
        return logger

    def _for(self, message: Message, with_body: bool = False) -> Any:
        log = self._logger().bind(**message.log_context, handler=self.handler)
        if with_body and self.log_bodies:
            log = log.bind(body=message.body[:BODY_LIMIT])
        return log

    def worker_started(self, info: QueueInfo, config: WorkerConfig) -> None:
        self.max_receive_count = info.max_receive_count
        self.log.info(
            "worker started",
            queue=info.name,
            handler=self.handler,
            concurrency=config.concurrency,
            visibility_timeout=config.visibility_timeout,
            dead_letter_queue=(info.dead_letter_arn or "none").rsplit(":", 1)[-1],
            max_receive_count=info.max_receive_count,
        )
        if info.dead_letter_arn is None:
            self.log.warning(
                "the queue has no redrive policy: a message that always fails is retried "
                "forever; give the queue a dead-letter queue",
                queue=info.name,
            )

    def receive_failed(self, error: TransportError, retry_in: float) -> None:
        self.log.warning("receive failed; retrying", error=str(error), retry_in=retry_in)

    def sqs_unanswered(self, seconds: float, error: str) -> None:
        if seconds >= SQS_AWAY_AFTER:  # the receive's own line said the first failures
            self.log.error(
                "SQS has not answered the receives; messages held keep their leases only if "
                "it answers again in time",
                unanswered_for=f"{seconds:.0f}s",
                error=error,
            )

    def sqs_answered_again(self, seconds: float) -> None:
        if seconds >= SQS_AWAY_AFTER:
            self.log.info("SQS answers again", was_unanswered_for=f"{seconds:.0f}s")

    def handler_succeeded(self, message: Message, duration: float) -> None:
        # Every message's line: through ``configure``'s processors directly while they are
        # structlog's configuration, else through a logger (not one bound to the message:
        # the same line, 3 µs less). The fields in the order a logger gives them.
        direct = _direct
        if direct is not None and self._own_logger and direct.current():
            event = message.log_context
            event["handler"] = self.handler
            event["duration"] = round(duration, 3)
            event["event"] = "message processed"
            direct.info(event)
            return
        self._logger().info(
            "message processed",
            **message.log_context,
            handler=self.handler,
            duration=round(duration, 3),
        )

    def handler_failed(
        self,
        message: Message,
        error: BaseException,
        duration: float,
        retry_in: float,
        last_attempt: bool,
    ) -> None:
        log = self._for(message, with_body=True)
        if last_attempt:
            log.error(
                "handler failed on its last attempt; SQS moves the message to the "
                "dead-letter queue on its next receive",
                error=_error(error),
                max_receive_count=self.max_receive_count,
                # A failure a batch handler reported has no trace of its own to show.
                exc_info=None if isinstance(error, BatchItemFailed) else self._trace_once(error),
            )
        else:
            log.warning(
                "handler failed; message will be retried",
                error=_error(error),
                retry_in=round(retry_in, 1),
            )

    def handler_retry_requested(
        self, message: Message, request: Retry, duration: float, retry_in: float, last_attempt: bool
    ) -> None:
        log = self._for(message)
        if last_attempt:
            log.warning(
                "retry requested on the message's last attempt; SQS moves it to the "
                "dead-letter queue on its next receive",
                reason=str(request),
                max_receive_count=self.max_receive_count,
            )
        else:
            log.info("retry requested", reason=str(request), retry_in=round(retry_in, 1))

    def handler_rejected(
        self, message: Message, error: BaseException, duration: float, dead_letter: str | None
    ) -> None:
        log = self._for(message, with_body=True)
        # A Reject is the handler's decision, said in its message; an exception of
        # --non-retryable is a fault like any other, and its traceback shows where.
        # A Reject wrapping a cause (a key function that raised) keeps the cause's trace.
        trace = error if not isinstance(error, Reject) or error.__cause__ else None
        trace = self._trace_once(trace)
        if dead_letter:
            log.error(
                "handler rejected the message; moved to the dead-letter queue",
                error=_error(error),
                dead_letter_queue=dead_letter,
                exc_info=trace,
            )
        else:
            log.error(
                "handler rejected the message, but the queue has no dead-letter queue; "
                "kept and retried after the longest backoff",
                error=_error(error),
                exc_info=trace,
            )

    def rejected_copy_failed(
        self,
        message: Message,
        error: BaseException,
        duration: float,
        retry_in: float,
        last_attempt: bool,
    ) -> None:
        then = (
            "SQS moves it to the dead-letter queue on its next receive (its last), without "
            "the error attributes"
            if last_attempt
            else "it comes back after the backoff and is rejected again"
        )
        self._for(message, with_body=True).error(
            f"handler rejected the message, but its copy to the dead-letter queue failed; {then}",
            error=_error(error),
            retry_in=round(retry_in, 1),
        )

    def receive_repeated(self, message_id: str) -> None:
        self.log.warning(
            "a receive's answer named a message held already, under its receipt handle: "
            "left out (SQS never does so; is the endpoint a proxy replaying answers?)",
            message_id=message_id,
        )

    def handler_skipped(self, message: Message, reason: str) -> None:
        self._for(message).warning("message not run", reason=reason)

    def dead_letter_notes_cut(self, message: Message, notes: Sequence[str]) -> None:
        self._for(message).warning(
            "the dead-letter copy cuts or leaves out notes to fit the dead-letter queue's "
            "size limit",
            notes=list(notes),
        )

    def rejected_copy_refused(self, message: Message, error: BaseException, reason: str) -> None:
        self._for(message, with_body=True).error(
            "handler rejected the message, but the dead-letter queue refuses any copy of it; "
            "returned unrun until SQS's redrive moves it there (without the notes)",
            error=_error(error),
            reason=reason,
        )

    def step_failed_settled(self, message: Message, error: BaseException) -> None:
        self._for(message).error(
            "a step of the worker's own failed after the message was settled; it goes as decided",
            error=_error(error),
            exc_info=self._trace_once(error),
        )

    def step_failed(
        self, message: Message, error: BaseException, retry_in: float, last_attempt: bool
    ) -> None:
        then = (
            "SQS moves it to the dead-letter queue on its next receive"
            if last_attempt
            else "returned to the queue; the worker goes on"
        )
        self._for(message).error(
            f"a step of the worker's own around the handler failed on this message; {then}",
            error=_error(error),
            retry_in=round(retry_in, 1),
            exc_info=self._trace_once(error),
        )

    def delete_failed(self, message: Message, reason: str, will_retry: bool) -> None:
        if not will_retry:
            self.not_deleted += 1
        log = self._for(message)
        (log.warning if will_retry else log.error)(
            "delete failed", reason=reason, will_retry=will_retry
        )

    def deleted_after_lease_lost(self, message: Message) -> None:
        self._for(message).warning(
            "deleted after its lease was lost: SQS may have delivered it again meanwhile"
        )

    def returned(self, messages: Sequence[Message], delay: float, reason: str) -> None:
        if reason == "shutdown":
            self.log.info("handed messages back", count=len(messages))
        elif reason == HANDED_BACK_BEHIND:
            for message in messages:
                self._for(message).info(
                    "handed back: an earlier message of its FIFO group comes back first"
                )

    def leases_extended(self, messages: Sequence[Message], seconds: int) -> None:
        self.log.debug("leases extended", count=len(messages), seconds=seconds)

    def lease_lost(self, message: Message, reason: str) -> None:
        self._for(message).warning(
            "lease lost: another consumer may now have this message", reason=reason
        )

    def lease_near_cap(self, message: Message, seconds_left: float) -> None:
        self._for(message).warning(
            "message nears the 12-hour visibility cap; SQS will redeliver it at the cap",
            seconds_left=round(seconds_left),
        )

    def request_failed(self, action: str, error: TransportError) -> None:
        self.log.warning("SQS request failed; will retry", action=action, error=str(error))

    def duplicate_suppressed(self, message: Message) -> None:
        self._for(message).info("duplicate suppressed: its key was completed before; deleted")

    def duplicate_deferred(self, message: Message, retry_in: float) -> None:
        self._for(message).info(
            "duplicate deferred: its key is in progress elsewhere; looked at again later",
            retry_in=round(retry_in, 1),
        )

    def key_conflict(self, message: Message, outcome: str) -> None:
        if outcome == "reject":
            return  # the rejection's own line says it (KeyConflict), once
        self._for(message, with_body=True).error(
            "idempotency key conflict: the key was used before with another body",
            outcome="suppressed",
        )

    def claim_lost(self, message: Message, reason: str) -> None:
        self._for(message).warning("idempotency claim lost", reason=reason)

    def store_failed(self, operation: str, error: BaseException) -> None:
        self.log.warning("idempotency store call failed", operation=operation, error=str(error))

    def loop_blocked(self, seconds: float, where: str) -> None:
        self.log.warning(
            "the event loop is blocked: an async handler made a blocking call, and every "
            "coroutine waits for it; await it through asyncio.to_thread(...) or use an "
            "async client",
            blocked_for=round(seconds, 2),
            where=where,
        )

    def loop_unblocked(self, seconds: float) -> None:
        self.log.info("the event loop runs again", was_blocked_for=round(seconds, 2))

    def shutdown_started(self, waiting: int, running: int) -> None:
        self.log.info("shutting down", handing_back=waiting, running=running)

    def receives_awaited(self, receives: int, seconds: float) -> None:
        # Said, or a quiet stop of up to --wait-time looks like a hang.
        self.log.info(
            "waiting for the receives under way to end; what they return is handed back "
            "(a receive cut short would leave its messages invisible)",
            receives=receives,
            ends_within=f"{max(0.0, seconds):.0f}s",
        )

    def shutdown_finished(self, clean: bool, handed_back: int, unsettled: int) -> None:
        log = (
            self.log.info if clean and not unsettled and not self.not_deleted else self.log.warning
        )
        log(
            "stopped",
            clean=clean,
            handed_back=handed_back,
            unsent_deletes_or_returns=unsettled,
            not_deleted=self.not_deleted,
        )

    def burst_finished(self) -> None:
        self.log.info("queue is empty; burst mode stops")
