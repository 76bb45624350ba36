"""``sqsworker run MODULE:ATTR``, ``sqsworker local``, ``sqsworker create-store``, and
the door to the commands that operate queues (``queues``, ``send``, ``peek``,
``redrive``, ``purge``: see ``commands/`` and ``operate/``).

The CLI owns the signals: the first SIGTERM or SIGINT starts a graceful
shutdown, a second SIGINT forces exit. Exit codes: 0 done, 1 could not start
or a handler outlived --shutdown-timeout, 2 bad usage, 130 forced.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
from collections.abc import Mapping, Sequence

import structlog
from prometheus_client import CollectorRegistry

from . import config, log_output, logs, tracing
from .cpu import pin_to_one
from .errors import ConfigError, StartupError
from .events import Observer, Observers, Tally
from .exits import EXIT_STARTUP, EXIT_USAGE, Signals, fail
from .importer import refuse_a_path
from .metrics import Metrics
from .process import Named, Process, configure, find_handlers, settle_heap
from .telemetry import TelemetryServer
from .version import __version__
from .worker import Worker


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sqsworker", description="Run SQS message handlers with leases kept alive."
    )
    parser.add_argument("--version", action="version", version=f"sqsworker {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser(
        "run",
        help="run handlers until SIGTERM",
        description="Run one handler, or several side by side (each on its own queue, with "
        "its own threads), until SIGTERM or SIGINT. Every option can also be set with an "
        "environment variable SQSWORKER_<OPTION>, for every handler, or "
        "SQSWORKER_<HANDLER>__<OPTION> (--set HANDLER.OPTION=VALUE) for one; the command "
        "line wins over the environment, and one handler's setting over every handler's.",
    )
    run.add_argument(
        "targets",
        nargs="+",
        metavar="TARGET",
        help="MODULE:ATTR for one handler (e.g. app:process), or MODULE for every "
        "@sqsworker.handler the module holds",
    )
    run.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="HANDLER.OPTION=VALUE",
        help="an option of one handler only, e.g. --set payments.concurrency=2 (repeat); "
        "HANDLER is the name it was imported as [env SQSWORKER_<HANDLER>__<OPTION>]",
    )
    run.add_argument(
        "--lambda",
        dest="as_lambda",
        action="store_true",
        help="the targets are Lambda SQS handlers of (event, context): each is given "
        "Lambda's SQS event for a batch and its result read as ReportBatchItemFailures, "
        "one batch at a time (docs/lambda.md)",
    )
    for f in config.options():
        default = f.metadata["default_text"] or (
            f.default if f.default not in ((), None, "") else "none"
        )
        text = f"{f.metadata['help']} [env {config.env_var(f.name)}; default {default}]"
        if f.type in ("bool", bool):
            run.add_argument(
                config.flag(f.name),
                dest=f.name,
                action="store_const",
                const="true",
                default=None,
                help=text,
            )
        else:
            run.add_argument(
                config.flag(f.name),
                dest=f.name,
                default=None,
                metavar=f.metadata["metavar"] or f.name.upper(),
                help=text,
            )

    store = commands.add_parser(
        "create-store",
        help="create the table of an idempotency store",
        description="Create the table an idempotency store needs: for dynamodb://TABLE a "
        "table with the partition key 'key', on-demand capacity and a time to live on 'ttl'; "
        "for sqlite:///PATH.db the schema. A table that exists is checked, not changed.",
    )
    store.add_argument("url", metavar="URL", help="e.g. dynamodb://orders-idempotency")
    store.add_argument("--region", default=None, help="AWS region (default: boto3's)")

    local = commands.add_parser(
        "local",
        help="start an embedded SQS endpoint for development",
        description="Start an SQS-compatible endpoint on localhost, create the queues (each "
        "with a dead-letter queue), print the environment to export, and serve until Ctrl-C.",
    )
    local.add_argument("--queue", action="append", default=[], help="queue to create (repeat)")
    local.add_argument("--host", default="127.0.0.1")
    local.add_argument(
        "--port", type=int, default=4566, help="port to serve on; 0 picks a free one [4566]"
    )
    local.add_argument(
        "--max-receive-count",
        type=int,
        default=None,
        help="receives before a message moves to the dead-letter queue [3; 6 for a FIFO "
        "queue, where a message handed back behind a failing one of its group uses up "
        "receives too: docs/fifo.md]",
    )
    local.add_argument("--visibility-timeout", type=int, default=30)
    from .commands import add_commands

    add_commands(commands)
    return parser


def _command_parser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The parser of the subcommand ``name`` (``run``, ``queues``, ...)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found: argparse.ArgumentParser = action.choices[name]
            return found
    return parser


def _unrecognized(extras: Sequence[str], command: argparse.ArgumentParser) -> str:
    """What argparse says of arguments it does not know, with the option a misspelt flag
    likely meant (``--concurency``: ``--concurrency``), as misspelt variables get."""
    flags = [extra.partition("=")[0] for extra in extras if extra.startswith("--")]
    if not flags:
        return f"unrecognized arguments: {' '.join(extras)}"
    known = [flag for action in command._actions for flag in action.option_strings]
    unknown = flags[0]
    near = difflib.get_close_matches(unknown, known, n=1, cutoff=0.6)
    hint = f"did you mean {near[0]}?" if near else f"see {command.prog} --help"
    return f"{unknown} is not an option: {hint}"


def run(
    targets: Sequence[str],
    cli_options: dict[str, str | None],
    sets: Sequence[str] = (),
    as_lambda: bool = False,
) -> int:
    try:
        for target in targets:  # before any import: importing app.py would run app
            refuse_a_path(target)
        handlers = find_handlers(targets, as_lambda)
        configs = configure(handlers, cli_options, sets, os.environ)
    except ConfigError as exc:
        fail(str(exc))
        return EXIT_USAGE
    try:
        unused_keys = _keys_without_a_store(handlers, configs, cli_options, sets, os.environ)
    except ConfigError as exc:
        fail(str(exc))
        return EXIT_USAGE
    first = configs[0]  # the process-wide options are the same in every handler's
    cpu = None
    if first.pin_cpu:  # before any thread of ours starts: they inherit it
        try:
            cpu = pin_to_one()
        except ConfigError as exc:
            fail(str(exc))
            return EXIT_USAGE
    logs.configure(first.log_level, first.log_format)
    log = structlog.get_logger("sqsworker")
    if cpu is not None:
        log.info("threads pinned to one CPU", cpu=cpu)
    unknown = config.unknown_variables(os.environ, [h.name for h in handlers])
    for warning in [*unknown, *unused_keys]:
        log.warning(warning)
    several = len(handlers) > 1
    registry = CollectorRegistry() if first.metrics_port is not None else None
    workers: dict[str, Worker] = {}
    tallies: dict[str, Tally] = {}
    for named, cfg in zip(handlers, configs, strict=True):
        tally = tallies[named.name] = Tally()
        # Several handlers share one log stream: each line says whose it is.
        own_log = log.bind(handler=named.handler.name) if several else None
        observers: list[Observer] = [
            logs.LogObserver(named.handler.name, own_log, log_bodies=cfg.log_bodies),
            tally,
        ]
        metrics = None
        if registry is not None:
            metrics = Metrics(cfg.queue, named.handler.name, registry=registry)
            observers.append(metrics)
        try:  # an option that cannot work with this handler (--batch-size on one of one)
            worker = Worker(named.handler, cfg, observer=Observers(observers))
        except ConfigError as exc:
            fail(str(exc))
            return EXIT_USAGE
        workers[named.name] = worker
        if metrics:
            metrics.watch(worker)
    process = Process(workers)
    signals = Signals()
    signals.install()
    server: TelemetryServer | None = None
    if registry is not None and first.metrics_port is not None:
        try:
            server = TelemetryServer(
                registry, process.health, first.metrics_host, first.metrics_port
            ).start()
        except OSError as exc:
            fail(
                f"could not serve metrics on {first.metrics_host}:{first.metrics_port} "
                f"({exc.strerror or exc}); choose another --metrics-port, or pass off"
            )
            return EXIT_STARTUP
    # Coroutine handlers past the shutdown timeout may hold helper threads (their own
    # asyncio.to_thread calls too) that the interpreter would wait for at exit: then the
    # process leaves at once, as thread handlers' daemon threads let it.
    abandoned: int | None = None
    settle_heap()
    try:
        try:
            process.start()
        except StartupError as exc:
            fail(str(exc))  # said at once: stopping the handlers that did start may take a poll
            process.request_stop()
            process.shutdown()
            return EXIT_STARTUP
        except BaseException:
            process.request_stop()
            process.shutdown()
            raise
        if server:
            log.info(
                "serving /metrics, /healthz and /readyz",
                address=f"http://{first.metrics_host}:{server.port}",
                port=server.port,
            )
        while not process.wait(0.2):  # signal handlers take no locks; act on their flag here
            if signals.received.is_set():
                process.request_stop()
        code = process.shutdown()
        if code != 0 and any(w.handler.is_async for w in workers.values()):
            abandoned = code
        for name, tally in tallies.items():
            logs.summary(
                tally.counts, **({"handler": workers[name].handler.name} if several else {})
            )
        return code
    finally:
        if server:
            server.stop()
        tracing.shutdown()  # the spans still buffered go out before the process ends
        log_output.close()  # the lines still gathered too, and those logged from now on
        if abandoned is not None:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(abandoned)


def _keys_without_a_store(
    handlers: Sequence[Named],
    configs: Sequence[config.WorkerConfig],
    cli_options: Mapping[str, str | None],
    sets: Sequence[str],
    env: Mapping[str, str],
) -> list[str]:
    """Raise ``ConfigError`` for a handler given an idempotency key policy but no store:
    without a store no key is derived, and a handler relying on one (its
    ``message.transaction()``, its ``message.idempotency_key``) would fail every attempt.

    The one case warned of instead: a key policy set for every handler of a process
    (``--idempotency-key``, ``SQSWORKER_IDEMPOTENCY_KEY``) that reaches a handler without
    a store while another handler has one; it was meant for that one. Returns those warnings.
    """
    per_handler = config.parse_sets(
        sets, [h.name for h in handlers], {h.handler.name: h.name for h in handlers}
    )
    with_store = [h.name for h, c in zip(handlers, configs, strict=True) if c.idempotency_store]
    warnings = []
    for named, cfg in zip(handlers, configs, strict=True):
        if cfg.idempotency_store is not None:
            continue
        own_env = config.handler_env_var(named.name, "idempotency_key")
        if "idempotency_key" in per_handler.get(named.name, {}):
            declared = f"--set {named.name}.idempotency_key"
        elif own_env in env:
            declared = own_env
        elif "idempotency_key" in named.handler.options:
            declared = "its decorator's idempotency_key="
        elif (
            cli_options.get("idempotency_key") is not None
            or config.env_var("idempotency_key") in env
        ):
            every = (
                "--idempotency-key"
                if cli_options.get("idempotency_key") is not None
                else config.env_var("idempotency_key")
            )
            if with_store:
                warnings.append(
                    f"{every} applies to every handler, and the handler {named.name} has no "
                    "idempotency store, so it derives no keys (the handlers with a store: "
                    f"{', '.join(with_store)})"
                )
                continue
            declared = every
        else:
            continue
        raise ConfigError(
            f"the handler {named.target} is given an idempotency key policy ({declared}) but "
            "no idempotency store, so no key would be derived or checked: pass "
            "--idempotency-store URL (SQSWORKER_IDEMPOTENCY_STORE), e.g. "
            "sqlite:///idempotency.db, or drop the key policy"
        )
    return warnings


def local(args: argparse.Namespace) -> int:
    from .local import LocalSQS
    from .operate import dead_letter_name, default_max_receives

    problem = _local_problem(args)
    if problem:
        fail(problem)
        return EXIT_USAGE
    try:
        server = LocalSQS(args.host, args.port).start()
    except ConfigError as exc:
        fail(str(exc))
        return EXIT_USAGE
    except OSError as exc:
        fail(
            f"could not listen on {args.host}:{args.port} ({exc.strerror or exc}; LocalStack "
            "or another sqsworker local may be serving there): choose another --port, or "
            "--port 0 for a free one"
        )
        return EXIT_STARTUP
    try:
        receives = {
            name: args.max_receive_count or default_max_receives(name.endswith(".fifo"))
            for name in args.queue
        }
        for name in args.queue:
            server.create_queue(
                name,
                max_receive_count=receives[name],
                visibility_timeout=args.visibility_timeout,
            )
        print("# SQS is serving at " + server.endpoint_url + "; export these, then run workers:")
        for key, value in server.env().items():
            print(f"export {key}={value}")
        for name in args.queue:
            print(
                f"# queue {name} (dead-letter queue {dead_letter_name(name)}, after "
                f"{receives[name]} receives)"
            )
        sys.stdout.flush()
        signals = Signals()
        signals.install()
        signals.received.wait()
    finally:
        server.stop()
    return 0


def _local_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with ``sqsworker local``'s options, in one sentence; None if nothing."""
    if not 0 <= args.port <= 65535:
        return f"--port {args.port} is not a port: use 1 to 65535, or 0 for a free one"
    if args.max_receive_count is not None and args.max_receive_count < 1:
        return f"--max-receive-count {args.max_receive_count} must be 1 or more"
    if not 0 <= args.visibility_timeout <= config.MAX_VISIBILITY:
        return f"--visibility-timeout {args.visibility_timeout} must be 0 to 43200 seconds"
    for name in args.queue:
        base = name.removesuffix(".fifo")
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,76}", base):
            return (
                f"--queue {name!r} is not a queue name this can create: use up to 76 letters, "
                "digits, '-' and '_' (its dead-letter queue adds '-dlq'), and '.fifo' at the end "
                "for a FIFO queue"
            )
    return None


def create_store(url: str, region: str | None) -> int:
    from .stores import open_store, shown

    try:
        open_store(url, region=region, create=True).close()
    except ConfigError as exc:
        fail(str(exc))
        return EXIT_USAGE
    except StartupError as exc:
        fail(str(exc))
        return EXIT_STARTUP
    print(f"sqsworker: the idempotency store {shown(url)} is ready")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:2] == ["queues", "create"]:  # `queues` takes a PREFIX: `create` comes first
        from .commands import create_parser, run_command

        creating = create_parser()
        created, extras = creating.parse_known_args(argv[2:])
        if extras:
            creating.error(_unrecognized(extras, creating))
        return run_command(created)
    parser = _parser()
    args, extras = parser.parse_known_args(argv)
    if extras:
        command = _command_parser(parser, args.command)
        command.error(_unrecognized(extras, command))
    if args.command == "local":
        return local(args)
    if args.command == "create-store":
        return create_store(args.url, args.region)
    if args.command != "run":
        from .commands import run_command

        return run_command(args)
    options = {f.name: getattr(args, f.name) for f in config.options()}
    return run(args.targets, options, args.sets, args.as_lambda)


if __name__ == "__main__":
    sys.exit(main())
