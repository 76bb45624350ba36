"""The single configuration surface: one frozen dataclass, validated on construction.

Each field carries its own command-line flag, ``SQSWORKER_*`` environment variable,
parser and help text, so the CLI, the environment, the ``@handler`` decorator and
the docs all read the same list. Precedence: command line, environment,
decorator, default; within the command line and within the environment, an option
set for one handler (``--set orders.concurrency=4``, ``SQSWORKER_ORDERS__CONCURRENCY``)
wins over the same option set for every handler.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import keys
from .errors import ConfigError
from .stores import parse_url

MAX_VISIBILITY = 43_200  # SQS: 12 hours, counted from the receive
MAX_WAIT_TIME = 20  # SQS: longest long poll
RECEIVE_MARGIN = 2  # seconds a lease must outlast the long poll that returned its message
MAX_BATCH_SIZE = 1000  # messages one batch handler call is given, at most
MAX_BATCH_WINDOW = 300  # seconds a partial batch may wait
LOG_LEVELS = ("debug", "info", "warning", "error")
SQS_CLIENTS = ("lean", "boto3")  # the client of the hot SQS calls (transports/lean.py)
LOG_FORMATS = ("auto", "json", "console")
KEY_CONFLICT_OUTCOMES = ("reject", "suppress")
BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")

ENV_PREFIX = "SQSWORKER_"
HANDLER_SEPARATOR = "__"  # SQSWORKER_<HANDLER>__<OPTION>
# One for the whole process, whatever the handlers: the telemetry server, the log stream
# and the CPU its threads run on.
# --burst too: the process exits when every queue has drained, and a worker stopped early
# would leave the others' /readyz unready.
PROCESS_OPTIONS = ("metrics_port", "metrics_host", "log_level", "log_format", "burst", "pin_cpu")


def _parse_bool(raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("must be true or false")


def _parse_int(raw: str) -> int:
    try:
        return int(raw.strip())
    except ValueError:
        raise ValueError("must be a whole number") from None


def _parse_prefetch(raw: str) -> int | None:
    if raw.strip().lower() == "auto":
        return None
    try:
        return _parse_int(raw)
    except ValueError:
        raise ValueError("must be a whole number, or auto") from None


def _parse_float(raw: str) -> float:
    try:
        return float(raw.strip())
    except ValueError:
        raise ValueError("must be a number of seconds") from None


def _parse_optional_str(raw: str) -> str | None:
    return raw.strip() or None


def _parse_port(raw: str) -> int | None:
    if raw.strip().lower() in ("off", "none", ""):
        return None
    try:
        return int(raw.strip())
    except ValueError:
        raise ValueError("must be a port number, 0 for any free port, or off") from None


def _parse_exceptions(raw: str) -> tuple[type[BaseException], ...]:
    from .importer import import_exception

    return tuple(import_exception(part.strip()) for part in raw.split(",") if part.strip())


def _option(
    help: str,
    parse: Callable[[str], Any] = str,
    *,
    metavar: str | None = None,
    flag_only: bool = False,
    default_text: str | None = None,
) -> dict[str, Any]:
    return {
        "help": help,
        "parse": parse,
        "metavar": metavar,
        "flag_only": flag_only,
        "default_text": default_text,
    }


@dataclass(frozen=True)
class WorkerConfig:
    queue: str = field(
        default="", metadata=_option("Queue name or URL (a name is resolved with GetQueueUrl).")
    )
    concurrency: int = field(
        default=10,
        metadata=_option(
            "Messages processed at once: handler threads (coroutines for an async def "
            "handler; for a batch handler, batches, each on a thread).",
            _parse_int,
        ),
    )
    prefetch: int | None = field(
        default=None,
        metadata=_option(
            "Messages held beyond the running ones, waiting to start (leases kept alive). "
            "auto: a batch (10), plus what the handler threads could finish during one "
            "receive's round trip (concurrency x round trip / a message's time, measured as "
            "the worker runs), at most max(10, 2 x --concurrency).",
            _parse_prefetch,
            metavar="N|auto",
            default_text="auto",
        ),
    )
    batch_size: int | None = field(
        default=None,
        metadata=_option(
            "Batch handlers only: the most messages one call is given (1-1000; over 10 "
            "takes several receives).",
            _parse_int,
            default_text="10",
        ),
    )
    batch_window: float | None = field(
        default=None,
        metadata=_option(
            "Batch handlers only: the longest seconds a batch short of --batch-size waits "
            "for more messages before it runs (0-300).",
            _parse_float,
            default_text="0",
        ),
    )
    visibility_timeout: int = field(
        default=30,
        metadata=_option(
            "Seconds each lease lasts, at least --wait-time + 2; the lease thread renews it "
            "while the handler runs, so this is also how soon a crashed worker's messages "
            "come back.",
            _parse_int,
        ),
    )
    wait_time: int = field(
        default=20,
        metadata=_option("Long-poll seconds for each receive (0-20).", _parse_int),
    )
    shutdown_timeout: float = field(
        default=30.0,
        metadata=_option(
            "Seconds running handlers get to finish after SIGTERM before their messages "
            "are handed back.",
            _parse_float,
        ),
    )
    burst: bool = field(
        default=False,
        metadata=_option(
            "Exit 0 once the queue holds no visible, delayed or in-flight message.",
            _parse_bool,
        ),
    )
    endpoint_url: str | None = field(
        default=None,
        metadata=_option(
            "SQS endpoint URL (default: boto3's, which honours AWS_ENDPOINT_URL_SQS).",
            _parse_optional_str,
            metavar="URL",
        ),
    )
    region: str | None = field(
        default=None,
        metadata=_option(
            "AWS region (default: boto3's, from AWS_REGION or AWS_DEFAULT_REGION).",
            _parse_optional_str,
        ),
    )
    sqs_client: str = field(
        default="lean",
        metadata=_option(
            "Client of the hot SQS calls (receive, delete, visibility and send batches): "
            "lean (signed JSON requests with botocore's credentials, endpoint and TLS "
            "settings; a sixth of botocore's CPU) or boto3 (botocore's client for every call).",
            str.lower,
            metavar="lean|boto3",
        ),
    )
    log_level: str = field(
        default="info", metadata=_option("One of debug, info, warning, error.", str.lower)
    )
    log_format: str = field(
        default="auto",
        metadata=_option(
            "json (one JSON object per line), console, or auto: console on a terminal, "
            "json otherwise.",
            str.lower,
        ),
    )
    log_bodies: bool = field(
        default=False,
        metadata=_option(
            "Add the message body (first 4 KiB) to the log lines of failed messages. "
            "Off by default: bodies may hold personal data.",
            _parse_bool,
        ),
    )
    metrics_port: int | None = field(
        default=9000,
        metadata=_option(
            "Port serving /metrics, /healthz and /readyz; 0 picks a free port, off serves none.",
            _parse_port,
            metavar="PORT",
        ),
    )
    metrics_host: str = field(
        default="0.0.0.0",
        metadata=_option("Address the metrics and health server listens on."),
    )
    pin_cpu: bool = field(
        default=False,
        metadata=_option(
            "Run the process's threads on one CPU (the one it starts on; Linux). Its "
            "threads hand Python's GIL to each other often; on one CPU that costs far less "
            "(docs/deployment.md). Processes a handler starts inherit it: leave it off for "
            "handlers whose work runs in other processes or outside the GIL.",
            _parse_bool,
        ),
    )
    stall_timeout: float = field(
        default=120.0,
        metadata=_option(
            "Seconds past its expected length after which an SQS call or a pass of a "
            "receive or lease thread counts as stuck, failing /healthz.",
            _parse_float,
        ),
    )
    backoff_base: float = field(
        default=2.0,
        metadata=_option(
            "Delay before the first retry of a failed message; doubles with each receive.",
            _parse_float,
        ),
    )
    backoff_max: float = field(
        default=900.0,
        metadata=_option("Longest delay between retries of a failed message.", _parse_float),
    )
    non_retryable: tuple[type[BaseException], ...] = field(
        default=(),
        metadata=_option(
            "Exception classes (MODULE:CLASS, comma-separated) that skip the remaining "
            "attempts and go to the dead-letter queue.",
            _parse_exceptions,
            metavar="MODULE:CLASS,...",
        ),
    )
    delete_interval: float = field(
        default=0.2,
        metadata=_option(
            "Longest a finished message waits to be deleted in a batch of up to 10.",
            _parse_float,
        ),
    )
    idempotency_store: str | None = field(
        default=None,
        metadata=_option(
            "Where idempotency records live: sqlite:///PATH.db (one host), "
            "postgresql://USER@HOST:PORT/DB (shared, in your database; sqsworker[postgres]), "
            "dynamodb://TABLE (shared on AWS) or memory:// (tests). Unset: no idempotency keys.",
            _parse_optional_str,
            metavar="URL",
        ),
    )
    idempotency_key: keys.KeyPolicy = field(
        default=keys.DefaultKey(),
        metadata=_option(
            "How a message's idempotency key is found: auto (the idempotency-key attribute, "
            "else the FIFO deduplication id, else the message id), attribute:NAME, "
            "json:EXPRESSION (JMESPath into the body) or call:MODULE:ATTR.",
            keys.parse,
            metavar="POLICY",
        ),
    )
    idempotency_ttl: float = field(
        default=86_400.0,
        metadata=_option(
            "Seconds a completed key is remembered: duplicates arriving later run again.",
            _parse_float,
        ),
    )
    on_key_conflict: str = field(
        default="reject",
        metadata=_option(
            "When a key comes back with another body: reject (to the dead-letter queue) or "
            "suppress (delete it unrun, like a duplicate).",
            str.lower,
        ),
    )

    payload_bucket: str | None = field(
        default=None,
        metadata=_option(
            "The S3 bucket of offloaded bodies (messages over SQS's size limit, sent by "
            "sqsworker send, the Spark sink or AWS's extended clients): the only bucket the "
            "worker fetches them from. Unset: the bucket each message names.",
            _parse_optional_str,
            metavar="BUCKET",
        ),
    )
    delete_payloads: bool = field(
        default=False,
        metadata=_option(
            "Delete an offloaded body from S3 once its message is deleted. Off by default: "
            "another queue subscribed to the same topic may still need it; an S3 lifecycle "
            "rule clears old bodies instead.",
            _parse_bool,
        ),
    )

    def __post_init__(self) -> None:
        def fail(name: str, rule: str) -> None:
            value = getattr(self, name)
            raise ConfigError(f"{label(name)} {rule}; got {value!r}", field=name)

        if not self.queue.strip():
            raise ConfigError(
                "no queue was given: pass --queue NAME, set SQSWORKER_QUEUE, "
                "or use @sqsworker.handler(queue=...)",
                field="queue",
            )
        if not 1 <= self.concurrency <= 1000:
            fail("concurrency", "must be a whole number from 1 to 1000")
        if self.prefetch is not None and not 0 <= self.prefetch <= 1000:
            fail("prefetch", "must be a whole number from 0 to 1000, or auto")
        if self.batch_size is not None and not 1 <= self.batch_size <= MAX_BATCH_SIZE:
            fail("batch_size", f"must be a whole number from 1 to {MAX_BATCH_SIZE}")
        if self.batch_window is not None and not 0 <= self.batch_window <= MAX_BATCH_WINDOW:
            fail("batch_window", f"must be from 0 to {MAX_BATCH_WINDOW} seconds")
        if not 1 <= self.visibility_timeout <= MAX_VISIBILITY:
            fail("visibility_timeout", "must be from 1 to 43200 seconds (the SQS 12-hour limit)")
        if not 0 <= self.wait_time <= MAX_WAIT_TIME:
            fail("wait_time", "must be from 0 to 20 seconds (the SQS long-poll limit)")
        if self.visibility_timeout < self.wait_time + RECEIVE_MARGIN:
            raise ConfigError(
                f"--visibility-timeout ({self.visibility_timeout}) must be at least --wait-time "
                f"({self.wait_time}) + {RECEIVE_MARGIN}: a lease counts from the start of the "
                "long poll that returned the message, so a shorter one could run out before the "
                f"message arrives; use a visibility timeout of "
                f"{self.wait_time + RECEIVE_MARGIN} or more"
                + (
                    f", or a wait time of {self.visibility_timeout - RECEIVE_MARGIN} or less"
                    if self.visibility_timeout >= RECEIVE_MARGIN
                    else ""
                ),
                field="visibility_timeout",
            )
        if not self.shutdown_timeout > 0:
            fail("shutdown_timeout", "must be more than 0 seconds")
        if self.sqs_client not in SQS_CLIENTS:
            fail("sqs_client", "must be one of " + ", ".join(SQS_CLIENTS))
        if self.log_level not in LOG_LEVELS:
            fail("log_level", "must be one of " + ", ".join(LOG_LEVELS))
        if not 0 <= self.backoff_base <= MAX_VISIBILITY:
            fail("backoff_base", "must be from 0 to 43200 seconds")
        if not self.backoff_base <= self.backoff_max <= MAX_VISIBILITY:
            fail("backoff_max", "must be from the backoff base to 43200 seconds")
        if self.log_format not in LOG_FORMATS:
            fail("log_format", "must be one of " + ", ".join(LOG_FORMATS))
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            fail("metrics_port", "must be from 0 to 65535, or off")
        if not self.stall_timeout > 0:
            fail("stall_timeout", "must be more than 0 seconds")
        if not 0 <= self.delete_interval <= 10:
            fail("delete_interval", "must be from 0 to 10 seconds")
        if self.idempotency_store is not None:
            try:
                parse_url(self.idempotency_store)
            except ConfigError as exc:
                raise ConfigError(str(exc), field="idempotency_store") from None
        try:
            object.__setattr__(self, "idempotency_key", keys.as_policy(self.idempotency_key))
        except ValueError as exc:
            fail("idempotency_key", str(exc))
        if not self.idempotency_ttl >= 1:
            fail("idempotency_ttl", "must be at least 1 second")
        if self.on_key_conflict not in KEY_CONFLICT_OUTCOMES:
            fail("on_key_conflict", "must be one of " + ", ".join(KEY_CONFLICT_OUTCOMES))
        if self.payload_bucket is not None and not BUCKET_NAME.match(self.payload_bucket):
            fail(
                "payload_bucket",
                "must be an S3 bucket name (3-63 lowercase letters, digits, dots, hyphens)",
            )


def label(name: str) -> str:
    return name.replace("_", " ")


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def env_var(name: str) -> str:
    return ENV_PREFIX + name.upper()


def options() -> list[dataclasses.Field[Any]]:
    return list(dataclasses.fields(WorkerConfig))


def handler_env_name(handler: str) -> str:
    """``orders`` -> ``ORDERS``, ``send-email`` -> ``SEND_EMAIL``: the handler's part of
    ``SQSWORKER_<HANDLER>__<OPTION>``."""
    return re.sub(r"[^A-Za-z0-9]", "_", handler).upper()


def handler_env_var(handler: str, name: str) -> str:
    return ENV_PREFIX + handler_env_name(handler) + HANDLER_SEPARATOR + name.upper()


def unknown_variables(env: Mapping[str, str], handlers: Sequence[str] = ()) -> list[str]:
    """A warning for each SQSWORKER_ variable that names no option (a typo is otherwise
    silently ignored), with the nearest option's variable. ``handlers`` are the names of
    the handlers this process runs, for ``SQSWORKER_<HANDLER>__<OPTION>``."""
    known = [f.name.upper() for f in options()]
    by_env_name = {handler_env_name(h): h for h in handlers}
    warnings = []
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX):
            continue
        option = name.removeprefix(ENV_PREFIX)
        scope, separator, scoped = option.rpartition(HANDLER_SEPARATOR)
        if separator and scoped in known and scope not in by_env_name:
            running = ", ".join(sorted(by_env_name)) or "none"
            warnings.append(
                f"{name} is for a handler named {scope.lower()}, which this process does not "
                f"run, and is ignored (its handlers: {running.lower()})"
            )
            continue
        if separator and scope in by_env_name:
            option = scoped
        if option not in known:
            hint = _hint(name, sorted(by_env_name))
            warnings.append(f"{name} is not an sqsworker option and is ignored: {hint}")
    return warnings


def _hint(name: str, handlers: Sequence[str] = ()) -> str:
    """The variable ``name`` was likely meant to be, as a sentence's end."""
    known = [f.name.upper() for f in options()]
    if name != name.upper():
        return f"the names are in capitals: {name.upper()}"
    option = name.removeprefix(ENV_PREFIX)
    scope, separator, scoped = option.rpartition(HANDLER_SEPARATOR)
    if separator:
        near = difflib.get_close_matches(scoped, known, n=1, cutoff=0.6)
        if near:
            return f"did you mean {ENV_PREFIX}{scope}{HANDLER_SEPARATOR}{near[0]}?"
        return "see sqsworker run --help"
    for handler in handlers:  # one underscore where two belong: SQSWORKER_EMAILS_CONCURRENCY
        own = option.removeprefix(handler + "_")
        if own != option and own in known:
            return f"did you mean {ENV_PREFIX}{handler}{HANDLER_SEPARATOR}{own}?"
    near = difflib.get_close_matches(option, known, n=1, cutoff=0.6)
    return f"did you mean {ENV_PREFIX}{near[0]}?" if near else "see sqsworker run --help"


def parse_sets(
    raw: Sequence[str], handlers: Sequence[str], aliases: Mapping[str, str] | None = None
) -> dict[str, dict[str, str]]:
    """``--set HANDLER.OPTION=VALUE`` arguments, as {handler: {option: value}}. ``aliases``
    maps other names of a handler (its full ``module.function``) to its name."""
    known = {f.name for f in options()}
    sets: dict[str, dict[str, str]] = {}
    for item in raw:
        target, equals, value = item.partition("=")
        handler, dot, option = target.strip().rpartition(".")
        if not equals or not dot or not handler or not option:
            raise ConfigError(
                f"--set {item!r} is not HANDLER.OPTION=VALUE: write it like "
                "--set payments.concurrency=2"
            )
        option = option.replace("-", "_").lower()
        handler = (aliases or {}).get(handler, handler)
        if handler not in handlers:
            raise ConfigError(
                f"--set {item!r} names the handler {handler!r}, which this process does not "
                f"run: its handlers are {', '.join(handlers)}"
            )
        if option not in known:
            near = difflib.get_close_matches(option, sorted(known), n=1, cutoff=0.6)
            hint = f"did you mean {handler}.{near[0]}?" if near else "see sqsworker run --help"
            raise ConfigError(f"--set {item!r}: {option!r} is not an option: {hint}")
        if option in PROCESS_OPTIONS:
            raise ConfigError(
                f"--set {item!r}: {label(option)} is one for the whole process, not per "
                f"handler: use {flag(option)} or {env_var(option)}"
            )
        sets.setdefault(handler, {})[option] = value
    return sets


def resolve(
    cli: Mapping[str, str | None],
    env: Mapping[str, str],
    decorator: Mapping[str, Any],
    *,
    handler: str | None = None,
    handler_cli: Mapping[str, str] | None = None,
) -> WorkerConfig:
    """Build the configuration from its layers, naming the source of any bad value.

    With ``handler``, the options set for that handler alone come first in each layer:
    ``handler_cli`` (from ``--set``) before the command line's flags, and
    ``SQSWORKER_<HANDLER>__<OPTION>`` before ``SQSWORKER_<OPTION>``.
    """
    handler_cli = handler_cli or {}
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for f in options():
        parse: Callable[[str], Any] = f.metadata["parse"]
        own_env = (
            handler_env_var(handler, f.name)
            if handler is not None and f.name not in PROCESS_OPTIONS
            else None
        )
        raw: str | None = None
        if f.name in handler_cli:
            raw, origin = handler_cli[f.name], f"--set {handler}.{f.name}"
        elif cli.get(f.name) is not None:
            raw, origin = cli[f.name], flag(f.name)
        elif own_env is not None and own_env in env:
            raw, origin = env[own_env], own_env
        elif env_var(f.name) in env:
            raw, origin = env[env_var(f.name)], env_var(f.name)
        elif f.name in decorator:
            values[f.name] = decorator[f.name]
            origins[f.name] = f"@sqsworker.handler({f.name}=...)"
            continue
        else:
            continue
        assert raw is not None
        try:
            values[f.name] = parse(raw)
        except ValueError as exc:
            raise ConfigError(f"{origin} {exc}; got {raw!r}", field=f.name) from None
        except ConfigError as exc:  # MODULE:ATTR naming nothing usable: the importer's words
            raise ConfigError(f"{origin}: {exc}", field=f.name) from None
        origins[f.name] = origin
    try:
        return WorkerConfig(**values)
    except ConfigError as exc:
        where = origins.get(exc.field or "")
        if where is None:
            raise
        raise ConfigError(f"{exc} (set by {where})", field=exc.field) from None
