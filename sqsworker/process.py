"""Several handlers in one process: ``sqsworker run app:orders app:payments``, or
``sqsworker run app`` for every handler the module defines.

Each handler runs its own ``Worker`` on its own queue, with its own threads, options,
leases and idempotency store, so a slow queue never starves another. The process has
one telemetry server, one log stream, one signal handler and one shutdown: every
worker stops receiving at once and they shut down side by side.
"""

from __future__ import annotations

import gc
import importlib
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import structlog

from . import config
from .config import PROCESS_OPTIONS, WorkerConfig
from .errors import ConfigError, ImportStringError, StartupError
from .handler import Handler, as_handler
from .health import Health, ProcessHealth
from .importer import import_from_string
from .metrics import queue_name
from .worker import Worker

# Container objects allocated, less those freed, between two young collections (CPython's
# default is 700; see ``settle_heap``).
YOUNG_COLLECTION_AFTER = 10_000


def settle_heap() -> None:
    """``sqsworker run``, once the handlers are imported and the workers built: what is
    alive then (modules, classes, the handlers' own startup state) is collected once and
    frozen, so the cyclic collector no longer walks it, and young collections come every
    10,000 allocations instead of 700.

    A message lives from its receive until SQS answers its delete: the messages in
    flight (a thousand coroutines, say) outlived the default young collection, were
    moved to older generations, and set off full collections over the whole heap. With
    these two settings, collection took 6 µs of a message's CPU instead of 19 (``async
    def``, 256 in flight, at an HTTP endpoint). A worker built in a program of the
    user's (``Worker``) leaves the collector as that program set it.
    """
    gc.collect()  # what startup left unreachable goes now: frozen, it never would
    gc.freeze()
    young, *older = gc.get_threshold()
    gc.set_threshold(max(young, YOUNG_COLLECTION_AFTER), *older)


@dataclass(frozen=True)
class Named:
    """A handler and the name its per-handler options use: the attribute it was found as."""

    name: str
    handler: Handler
    target: str


def find_handlers(targets: Sequence[str], as_lambda: bool = False) -> list[Named]:
    """The handlers ``targets`` name: ``MODULE:ATTR`` is one, ``MODULE`` every handler
    (``@sqsworker.handler``) among the module's attributes. ``as_lambda``: each
    ``MODULE:ATTR`` is a Lambda SQS handler of (event, context)."""
    found: list[Named] = []
    for target in targets:
        if ":" in target:
            attr = target.partition(":")[2]
            handler = as_handler(import_from_string(target), target, as_lambda)
            found.append(Named(attr.rsplit(".", 1)[-1], handler, target))
            continue
        # With --lambda, every handler the module holds must be a Lambda handler.
        found.extend(
            Named(n.name, as_handler(n.handler, n.target, as_lambda), n.target)
            for n in _module_handlers(target)
        )
    names: dict[str, Named] = {}
    for named in found:
        same = names.get(config.handler_env_name(named.name))
        if same is not None and same.handler is named.handler:
            raise ConfigError(
                f"the handler {named.target} is given twice (a MODULE alone names every "
                "handler of the module, and MODULE:ATTR one of them): name each handler once"
            )
        if same is not None:
            alike = (
                f"named {named.name!r}"
                if same.name == named.name
                else f"named {same.name!r} and {named.name!r}, alike in capitals"
            )
            raise ConfigError(
                f"two handlers are {alike} ({same.target} and {named.target}), and "
                "per-handler options (--set NAME.OPTION, SQSWORKER_NAME__OPTION) could not "
                "tell them apart: import one of them under another name"
            )
        names[config.handler_env_name(named.name)] = named
    return found


def _module_handlers(module_name: str) -> list[Named]:
    if not module_name or not all(part.isidentifier() for part in module_name.split(".")):
        raise ImportStringError(
            f"{module_name!r} is neither MODULE:ATTR nor a module name: write app:process "
            "for one handler, or app for every handler the module app defines"
        )
    import_from_string(f"{module_name}:__name__")  # the importer's sentences for a bad module
    module = importlib.import_module(module_name)
    handlers = [
        Named(name, value, f"{module_name}:{name}")
        for name, value in vars(module).items()
        if isinstance(value, Handler) and not name.startswith("_")
    ]
    if not handlers:
        raise ImportStringError(
            f"module {module_name!r} defines no @sqsworker.handler: decorate its handler "
            f"functions, or name one as {module_name}:FUNCTION"
        )
    return handlers


def configure(
    handlers: Sequence[Named],
    cli: Mapping[str, str | None],
    sets: Sequence[str],
    env: Mapping[str, str],
) -> list[WorkerConfig]:
    """Each handler's configuration; raises ``ConfigError`` for what cannot work."""
    names = [h.name for h in handlers]
    per_handler = config.parse_sets(sets, names, {h.handler.name: h.name for h in handlers})
    for named in handlers:
        for option in PROCESS_OPTIONS:
            variable = config.handler_env_var(named.name, option)
            if variable in env:
                raise ConfigError(
                    f"{variable}: {config.label(option)} is one for the whole process, not "
                    f"per handler: set {config.env_var(option)} instead"
                )
    configs = [_resolve(h, cli, env, per_handler, several=len(handlers) > 1) for h in handlers]
    if len(handlers) == 1:
        return configs
    for index, (named, cfg) in enumerate(zip(handlers, configs, strict=True)):
        for other, other_cfg in zip(handlers[:index], configs[:index], strict=True):
            if not _same_queue(cfg.queue, other_cfg.queue):
                continue
            every = (
                " (--queue and SQSWORKER_QUEUE set every handler's queue)"
                if cli.get("queue") is not None or config.env_var("queue") in env
                else ""
            )
            raise ConfigError(
                f"the handlers {other.name} and {named.name} would both consume the queue "
                f"{queue_name(cfg.queue)}{every}, each taking messages meant for the other: "
                f"give each handler its own queue, with @sqsworker.handler(queue=...), "
                f"--set {named.name}.queue=... or "
                f"{config.handler_env_var(named.name, 'queue')}"
            )
    first = configs[0]
    for named, cfg in zip(handlers[1:], configs[1:], strict=True):
        for option in PROCESS_OPTIONS:
            if getattr(cfg, option) != getattr(first, option):
                raise ConfigError(
                    f"the handlers {handlers[0].name} and {named.name} ask for different "
                    f"{config.label(option)}s ({getattr(first, option)!r} and "
                    f"{getattr(cfg, option)!r}), and the process has one: set it with "
                    f"{config.flag(option)}"
                )
    return configs


def _resolve(
    named: Named,
    cli: Mapping[str, str | None],
    env: Mapping[str, str],
    per_handler: Mapping[str, Mapping[str, str]],
    *,
    several: bool,
) -> WorkerConfig:
    """One handler's configuration; with several handlers, an error says whose."""
    try:
        return config.resolve(
            cli,
            env,
            named.handler.options,
            handler=named.name,
            handler_cli=per_handler.get(named.name),
        )
    except ConfigError as exc:
        if not several:
            raise
        if exc.field == "queue" and "no queue was given" in str(exc):
            raise ConfigError(
                f"the handler {named.name} has no queue: give it one with "
                f"@sqsworker.handler(queue=...), --set {named.name}.queue=NAME or "
                f"{config.handler_env_var(named.name, 'queue')}",
                field="queue",
            ) from None
        raise ConfigError(f"handler {named.name}: {exc}", field=exc.field) from None


def _same_queue(a: str, b: str) -> bool:
    """Whether two queue options may name one queue: the same name, unless both are URLs
    that differ (another account's or region's queue may share the name)."""
    if queue_name(a) != queue_name(b):
        return False
    if "://" in a and "://" in b:
        return a.rstrip("/") == b.rstrip("/")
    return True


class Process:
    """The workers of one process, started, stopped and shut down together."""

    def __init__(self, workers: Mapping[str, Worker]) -> None:
        self.workers = dict(workers)

    def start(self) -> None:
        """Start every worker in turn. At the first that cannot start, raise its
        ``StartupError`` (naming its handler when there are several) at once: the ones
        already started run on until ``request_stop`` and ``shutdown``."""
        for name, worker in self.workers.items():
            try:
                worker.start()
            except StartupError as exc:
                if len(self.workers) == 1:
                    raise
                raise StartupError(f"handler {name}: {exc}") from exc

    def request_stop(self) -> None:
        for worker in self.workers.values():
            worker.request_stop()

    def wait(self, timeout: float) -> bool:
        """True once every worker has stopped receiving (a stop request, or burst mode
        found each queue empty)."""
        pending = [w for w in self.workers.values() if not w.wait(0)]
        if not pending:
            return True
        return pending[0].wait(timeout) and len(pending) == 1

    def shutdown(self) -> int:
        """Shut every started worker down at once (each within its own shutdown timeout):
        0 if every handler finished, else 1."""
        started = [w for w in self.workers.values() if w.started]
        if len(started) == 1:
            return started[0].shutdown()
        codes: list[int] = []

        def shut(worker: Worker) -> None:
            try:
                codes.append(worker.shutdown())
            except Exception:  # a fault of the worker's own: said, and the exit code is 1
                structlog.get_logger("sqsworker").exception(
                    "shutdown failed", handler=worker.handler.name
                )
                codes.append(1)

        threads = [
            threading.Thread(target=shut, args=(w,), name=f"sqsworker-shutdown-{i}")
            for i, w in enumerate(started)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return max(codes, default=0)

    def health(self) -> Health | ProcessHealth:
        if len(self.workers) == 1:
            return next(iter(self.workers.values())).health()
        # By the handler's full name, as the logs and the metrics name it.
        return ProcessHealth({w.handler.name: w.health() for w in self.workers.values()})
