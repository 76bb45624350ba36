"""Configuration layers, import strings, and the CLI's answers to bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from sqsworker import config
from sqsworker.cli import main
from sqsworker.errors import ConfigError


def test_precedence_is_cli_then_env_then_decorator_then_default() -> None:
    cfg = config.resolve(
        {"concurrency": "4", "queue": None},
        {"SQSWORKER_CONCURRENCY": "8", "SQSWORKER_QUEUE": "from-env", "SQSWORKER_PREFETCH": "3"},
        {"queue": "from-decorator", "visibility_timeout": 90, "prefetch": 1},
    )
    assert (cfg.concurrency, cfg.queue, cfg.prefetch, cfg.visibility_timeout) == (
        4,
        "from-env",
        3,
        90,
    )
    assert cfg.wait_time == 20


@pytest.mark.parametrize(
    ("cli", "env", "expected"),
    [
        ({"visibility_timeout": "50000"}, {}, "from 1 to 43200 seconds"),
        (
            {"concurrency": "-3"},
            {},
            "concurrency must be a whole number from 1 to 1000; got -3 (set by --concurrency)",
        ),
        ({"concurrency": "many"}, {}, "--concurrency must be a whole number; got 'many'"),
        ({}, {"SQSWORKER_WAIT_TIME": "30"}, "(set by SQSWORKER_WAIT_TIME)"),
        ({}, {"SQSWORKER_BURST": "maybe"}, "SQSWORKER_BURST must be true or false"),
    ],
)
def test_bad_values_name_the_option_and_its_source(
    cli: dict[str, str], env: dict[str, str], expected: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        config.resolve({"queue": "q", **cli}, env, {})
    assert expected in str(raised.value)


def test_a_missing_queue_says_how_to_give_one() -> None:
    with pytest.raises(ConfigError, match="--queue NAME, set SQSWORKER_QUEUE"):
        config.resolve({}, {}, {})


@pytest.fixture
def app_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    modules = {
        "goodapp": [("process", 'queue="orders"')],
        "twoapp": [("orders", 'queue="orders"'), ("payments", 'queue="payments"')],
        "clashapp": [("process", 'queue="refunds", metrics_port=9100')],
        "caseapp": [("orders", 'queue="orders"'), ("Orders", 'queue="orders-eu"')],
        "noqueueapp": [("orders", 'queue="orders"'), ("payments", "")],
    }
    for module, handlers in modules.items():
        lines = [
            "import sqsworker",
            *(["from twoapp import orders"] if module == "clashapp" else []),
        ]
        for name, options in handlers:
            lines += ["", f"@sqsworker.handler({options})", f"def {name}(message):", "    pass"]
        (tmp_path / f"{module}.py").write_text("\n".join(lines) + "\n")
    (tmp_path / "plainapp.py").write_text("def process(message):\n    pass\n")
    (tmp_path / "brokenapp.py").write_text("import a_dependency_that_is_missing\n")
    (tmp_path / "raisingapp.py").write_text("raise RuntimeError('bad settings')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


@pytest.mark.parametrize(
    ("argv", "code", "expected"),
    [
        (["run", "nosuchmodule:x"], 2, "no module named 'nosuchmodule' was found"),
        (
            ["run", "goodapp:missing"],
            2,
            "module 'goodapp' has no attribute 'missing' (its functions: process)",
        ),
        (["run", "plainapp"], 2, "module 'plainapp' defines no @sqsworker.handler"),
        (["run", "no such"], 2, "'no such' is neither MODULE:ATTR nor a module name"),
        (["run", "goodapp:process", "goodapp"], 2, "goodapp:process is given twice"),
        (["run", "goodapp", "clashapp"], 2, "two handlers are named 'process'"),
        (
            ["run", "twoapp", "--queue", "jobs"],
            2,
            "orders and payments would both consume the queue jobs (--queue and SQSWORKER_QUEUE "
            "set every handler's queue), each taking messages meant for the other: give each "
            "handler its own queue, with @sqsworker.handler(queue=...), --set payments.queue=... "
            "or SQSWORKER_PAYMENTS__QUEUE",
        ),
        (
            [
                "run",
                "twoapp",
                "--set",
                "orders.queue=https://q.example/1/jobs",
                "--set",
                "payments.queue=jobs",
            ],
            2,
            "would both consume the queue jobs",  # a name may be the URL's queue
        ),
        (["run", "twoapp", "--set", "orders"], 2, "'orders' is not HANDLER.OPTION=VALUE"),
        (["run", "twoapp", "--set", "order.concurrency=2"], 2, "handlers are orders, payments"),
        (["run", "twoapp", "--set", "orders.concurency=2"], 2, "mean orders.concurrency?"),
        (["run", "twoapp", "--set", "orders.metrics-port=1"], 2, "one for the whole process"),
        (["run", "twoapp", "--set", "orders.concurrency=0"], 2, "(set by --set orders.concu"),
        (["run", "clashapp"], 2, "orders and process ask for different metrics ports"),
        (["run", "caseapp"], 2, "named 'orders' and 'Orders', alike in capitals"),
        (
            ["run", "noqueueapp"],
            2,
            "the handler payments has no queue: give it one with @sqsworker.handler(queue=...), "
            "--set payments.queue=NAME or SQSWORKER_PAYMENTS__QUEUE",
        ),
        (["run", "twoapp", "--set", "orders.concurrency=x"], 2, "handler orders: --set orders.co"),
        (["run", "twoapp", "--set", "orders.burst=true"], 2, "burst is one for the whole process"),
        (["run", "brokenapp:x"], 2, "importing module 'brokenapp' failed: ModuleNotFoundError"),
        (["run", "raisingapp:x"], 2, "RuntimeError: bad settings at"),
        (["run", "goodapp:process", "--visibility-timeout", "50000"], 2, "43200"),
        (["run", "goodapp:process", "--concurrency", "-3"], 2, "got -3"),
    ],
)
def test_bad_input_gets_one_sentence_and_a_nonzero_exit(
    app_dir: Path, capsys: pytest.CaptureFixture[str], argv: list[str], code: int, expected: str
) -> None:
    assert main(argv) == code
    err = capsys.readouterr().err
    assert expected in err
    assert err.count("\n") == 1 and err.startswith("sqsworker: error: ")
    assert "Traceback" not in err


def test_the_configuration_page_lists_every_option() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    for f in config.options():
        assert f"`{config.flag(f.name)}`" in page and f"`{config.env_var(f.name)}`" in page, f.name


def test_one_handlers_option_wins_over_every_handlers_within_each_layer() -> None:
    def concurrency(cli: int | None, sets: dict[str, str], env: dict[str, str]) -> int:
        options = {"concurrency": None if cli is None else str(cli)}
        resolved = config.resolve(
            options, env, {"queue": "orders"}, handler="orders", handler_cli=sets
        )
        return resolved.concurrency

    env = {"SQSWORKER_CONCURRENCY": "4", "SQSWORKER_ORDERS__CONCURRENCY": "8"}
    assert concurrency(None, {}, {"SQSWORKER_CONCURRENCY": "4"}) == 4
    assert concurrency(None, {}, env) == 8
    assert concurrency(3, {}, env) == 3  # the command line wins over the environment
    assert concurrency(3, {"concurrency": "2"}, env) == 2
    # Another handler's variable is not this one's.
    assert concurrency(None, {}, {"SQSWORKER_PAYMENTS__CONCURRENCY": "8"}) == 10


def test_a_process_wide_option_set_for_one_handler_is_refused(
    app_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SQSWORKER_ORDERS__LOG_LEVEL", "debug")
    assert main(["run", "twoapp"]) == 2
    assert capsys.readouterr().err == (
        "sqsworker: error: SQSWORKER_ORDERS__LOG_LEVEL: log level is one for the whole "
        "process, not per handler: set SQSWORKER_LOG_LEVEL instead.\n"
    )


def test_a_handler_is_named_by_its_full_name_too() -> None:
    sets = config.parse_sets(
        ["app.emails.concurrency=8"], ["orders", "emails"], {"app.emails": "emails"}
    )
    assert sets == {"emails": {"concurrency": "8"}}


def test_queues_of_one_name_in_two_accounts_are_two_queues(
    app_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sqsworker.process import configure, find_handlers

    handlers = find_handlers(["twoapp"])
    sets = ["orders.queue=https://sqs.eu-west-1.amazonaws.com/111111111111/jobs"]
    sets += ["payments.queue=https://sqs.eu-west-1.amazonaws.com/222222222222/jobs"]
    configs = configure(handlers, {}, sets, {})
    assert [c.queue.split("/")[3] for c in configs] == ["111111111111", "222222222222"]


def test_misspelt_variables_get_the_variable_they_were_meant_to_be() -> None:
    env = {"SQSWORKER_ORDERS_CONCURRENCY": "4", "SQSWORKER_orders__concurrency": "4"}
    assert config.unknown_variables(env, ["orders"]) == [
        "SQSWORKER_ORDERS_CONCURRENCY is not an sqsworker option and is ignored: "
        "did you mean SQSWORKER_ORDERS__CONCURRENCY?",
        "SQSWORKER_orders__concurrency is not an sqsworker option and is ignored: "
        "the names are in capitals: SQSWORKER_ORDERS__CONCURRENCY",
    ]


def test_variables_for_handlers_not_run_here_are_named() -> None:
    env = {
        "SQSWORKER_ORDERS__CONCURRENCY": "4",
        "SQSWORKER_REFUNDS__CONCURRENCY": "2",
        "SQSWORKER_ORDERS__CONCURENCY": "4",
    }
    assert config.unknown_variables(env, ["orders", "payments"]) == [
        "SQSWORKER_ORDERS__CONCURENCY is not an sqsworker option and is ignored: "
        "did you mean SQSWORKER_ORDERS__CONCURRENCY?",
        "SQSWORKER_REFUNDS__CONCURRENCY is for a handler named refunds, which this process "
        "does not run, and is ignored (its handlers: orders, payments)",
    ]


def test_unknown_sqsworker_variables_are_named_with_the_nearest_option() -> None:
    env = {"SQSWORKER_CONCURRENCY": "4", "SQSWORKER_VISIBILTY_TIMEOUT": "60", "SQSWORKER_X": "1"}
    assert config.unknown_variables(env) == [
        "SQSWORKER_VISIBILTY_TIMEOUT is not an sqsworker option and is ignored: "
        "did you mean SQSWORKER_VISIBILITY_TIMEOUT?",
        "SQSWORKER_X is not an sqsworker option and is ignored: see sqsworker run --help",
    ]
