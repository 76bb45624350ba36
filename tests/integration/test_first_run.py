"""What a new user met on a first run: each answer of `sqsworker` a real process gives,
its exit code and its one sentence, on moto's server where a queue is involved."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sqsworker.local import LocalSQS

from ..conftest import unique

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

KEYED_APP = """
import sqsworker

@sqsworker.handler(queue="payments", idempotency_key="json:payment_id")
def charge(message):
    with message.transaction() as db:
        db.execute("INSERT INTO charges VALUES (?)", (message.idempotency_key,))


@sqsworker.handler(queue="refunds")
def refund(message):
    pass
"""


def sqsworker(
    tmp_path: Path, *argv: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`sqsworker ARGV` in ``tmp_path`` (where the tests write their apps), run to its end."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-m", "sqsworker.cli", *argv],
        cwd=tmp_path,
        env={**os.environ, **(env or {}), "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def keyed_app(tmp_path: Path) -> Path:
    (tmp_path / "keyedapp.py").write_text(textwrap.dedent(KEYED_APP))
    return tmp_path


# -- an idempotency key policy without a store ---------------------------------------------


def test_a_key_policy_without_a_store_is_refused_at_start(
    keyed_app: Path,
) -> None:
    done = sqsworker(keyed_app, "run", "keyedapp:charge", "--metrics-port", "0")
    assert done.returncode == 2
    assert done.stderr == (
        "sqsworker: error: the handler keyedapp:charge is given an idempotency key policy "
        "(its decorator's idempotency_key=) but no idempotency store, so no key would be "
        "derived or checked: pass --idempotency-store URL (SQSWORKER_IDEMPOTENCY_STORE), "
        "e.g. sqlite:///idempotency.db, or drop the key policy.\n"
    )


@pytest.mark.parametrize(
    ("argv", "env", "named"),
    [
        (["--idempotency-key", "json:id"], {}, "(--idempotency-key)"),
        ([], {"SQSWORKER_IDEMPOTENCY_KEY": "json:id"}, "(SQSWORKER_IDEMPOTENCY_KEY)"),
        ([], {"SQSWORKER_REFUND__IDEMPOTENCY_KEY": "json:id"}, "(SQSWORKER_REFUND__"),
    ],
)
def test_a_key_policy_from_the_command_line_or_environment_is_refused_too(
    keyed_app: Path, argv: list[str], env: dict[str, str], named: str
) -> None:
    done = sqsworker(keyed_app, "run", "keyedapp:refund", "--metrics-port", "0", *argv, env=env)
    assert done.returncode == 2
    assert named in done.stderr and done.stderr.count("\n") == 1


def test_a_key_policy_for_every_handler_warns_of_one_without_a_store(
    keyed_app: Path, local_sqs: LocalSQS
) -> None:
    """--idempotency-key sets every handler's policy; with a store for one handler, it was
    meant for that one: the other is warned of, not refused, and the process starts (here
    it stops at the queues, which do not exist)."""
    done = sqsworker(
        keyed_app,
        *("run", "keyedapp", "--idempotency-key", "json:payment_id"),
        *("--set", "charge.idempotency_store=memory://", "--set", f"charge.queue={unique('p')}"),
        *("--set", f"refund.queue={unique('r')}", "--metrics-port", "0", "--log-format", "json"),
        env=local_sqs.env(),
    )
    assert done.returncode == 1, done.stderr
    assert (
        "--idempotency-key applies to every handler, and the handler refund has no "
        "idempotency store, so it derives no keys (the handlers with a store: charge)"
    ) in done.stderr
    assert "does not exist" in done.stderr


def test_a_key_policy_with_a_store_starts(keyed_app: Path, local_sqs: LocalSQS) -> None:
    queue = unique("payments")
    local_sqs.create_queue(queue)
    store = f"sqlite:///{keyed_app / 'keys.db'}"
    done = sqsworker(
        keyed_app,
        *("run", "keyedapp:charge", "--queue", queue, "--idempotency-store", store),
        *("--burst", "--wait-time", "1", "--metrics-port", "0"),
        env=local_sqs.env(),
    )
    assert done.returncode == 0, done.stderr
    assert "idempotency key policy" not in done.stderr


# -- did you mean ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "meant"),
    [
        ("app.py:process", "did you mean app:process (run from the folder that holds app.py)?"),
        ("./app.py", "did you mean app (run from the folder that holds app.py)?"),
        (
            "src/app.py:process",
            "did you mean src.app:process (or app:process with PYTHONPATH=src)?",
        ),
    ],
)
def test_a_file_path_for_a_module_gets_the_module_meant(
    tmp_path: Path, target: str, meant: str
) -> None:
    (tmp_path / "src").mkdir()
    for path in (tmp_path / "app.py", tmp_path / "src" / "app.py"):
        # Were it imported, this would say so: a path is refused before any import.
        path.write_text("print('imported')\n" + textwrap.dedent(KEYED_APP))
    done = sqsworker(tmp_path, "run", target)
    assert done.returncode == 2
    assert done.stderr == (
        f"sqsworker: error: {target!r} names a file, and sqsworker imports a module, as "
        f"python -m does: {meant}\n"
    )
    assert done.stdout == ""


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["run", "keyedapp:refund", "--concurency", "4"],
            "sqsworker run: error: --concurency is not an option: did you mean --concurrency?",
        ),
        (
            ["run", "--visibilty-timeout=60", "keyedapp:refund"],
            "sqsworker run: error: --visibilty-timeout is not an option: did you mean "
            "--visibility-timeout?",
        ),
        (
            ["queues", "--jsn"],
            "sqsworker queues: error: --jsn is not an option: did you mean --json?",
        ),
        (
            ["run", "keyedapp:refund", "--frobnicate"],
            "sqsworker run: error: --frobnicate is not an option: see sqsworker run --help",
        ),
    ],
)
def test_a_misspelt_flag_is_named_with_the_flag_it_likely_meant(
    keyed_app: Path, argv: list[str], said: str
) -> None:
    done = sqsworker(keyed_app, *argv)
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == said
    assert "imported" not in done.stdout


@pytest.mark.parametrize(
    ("classes", "said"),
    [
        (
            "builtins:KeyErr",
            "--non-retryable: module 'builtins' has no exception class 'KeyErr': did you mean "
            "builtins:KeyError?",
        ),
        (
            "builtins:Nothing",
            "--non-retryable: module 'builtins' has no exception class 'Nothing' (its exception "
            "classes: ArithmeticError, AssertionError, AttributeError, BaseException, ",
        ),
        (
            "keyedapp:Declined",
            "--non-retryable: module 'keyedapp' has no exception class 'Declined' (it holds none)",
        ),
    ],
)
def test_a_misspelt_exception_class_is_named_with_the_classes_it_likely_meant(
    keyed_app: Path, classes: str, said: str
) -> None:
    done = sqsworker(keyed_app, "run", "keyedapp:refund", "--non-retryable", classes)
    assert done.returncode == 2
    assert done.stderr.startswith(f"sqsworker: error: {said}")
    assert done.stderr.count("\n") == 1
