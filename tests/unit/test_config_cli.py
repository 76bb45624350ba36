"""Configuration layers, import strings, and the CLI's answers to bad input."""

from __future__ import annotations

import textwrap
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
    (tmp_path / "goodapp.py").write_text(
        textwrap.dedent("""
        import sqsworker

        @sqsworker.handler(queue="orders")
        def process(message):
            pass
    """)
    )
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
        (["run", "goodapp"], 2, "'goodapp' is not an import string: write MODULE:ATTR"),
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


def test_unknown_sqsworker_variables_are_named_with_the_nearest_option() -> None:
    env = {"SQSWORKER_CONCURRENCY": "4", "SQSWORKER_VISIBILTY_TIMEOUT": "60", "SQSWORKER_X": "1"}
    assert config.unknown_variables(env) == [
        "SQSWORKER_VISIBILTY_TIMEOUT is not an sqsworker option and is ignored: "
        "did you mean SQSWORKER_VISIBILITY_TIMEOUT?",
        "SQSWORKER_X is not an sqsworker option and is ignored: see sqsworker run --help",
    ]
