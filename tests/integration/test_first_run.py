"""What a new user met on a first run: each answer of `sqsworker` a real process gives,
its exit code and its one sentence, on moto's server where a queue is involved."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
import textwrap
from pathlib import Path

import pytest

from sqsworker.local import LocalSQS
from sqsworker.transports import QueueInfo, send_all
from sqsworker.transports.sqs import SQSTransport

from ..conftest import unique, wait_until
from .conftest import local
from .scenario import Scenario

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


# -- creating queues ---------------------------------------------------------------------------


def info(name: str) -> QueueInfo:
    """``name``'s attributes, read through the environment ``local_env`` set."""
    transport = SQSTransport.connect(name)
    transport.close()
    return transport.info


def test_queues_create_makes_a_queue_and_its_dead_letter_queue(
    tmp_path: Path, local_env: LocalSQS
) -> None:
    name = unique("orders")
    done = sqsworker(
        tmp_path,
        *("queues", "create", name, "--dead-letter-queue", f"{name}-dlq"),
        *("--max-receives", "5", "--visibility-timeout", "60"),
        env=local_env.env(),
    )
    assert done.returncode == 0, done.stderr
    created = info(name)
    assert (created.fifo, created.visibility_timeout, created.max_receive_count) == (False, 60, 5)
    assert created.dead_letter_arn == info(f"{name}-dlq").arn
    assert done.stdout.splitlines() == [
        f"created the queue {name} (visibility timeout 60 s): {created.url}",
        f"its dead-letter queue: {name}-dlq (created), after 5 receives",
    ]
    again = sqsworker(
        tmp_path, "queues", "create", name, "--visibility-timeout", "60", env=local_env.env()
    )
    assert again.returncode == 0, again.stderr
    assert f"the queue {name} exists already, as asked" in again.stdout


def test_queues_create_gives_a_fifo_queue_twice_the_receives_by_default(
    tmp_path: Path, local_env: LocalSQS
) -> None:
    name = unique("payments")
    dlq = unique("payments-dlq")
    local_env.create_queue(f"{dlq}.fifo", max_receive_count=None)  # one that exists is used
    done = sqsworker(
        tmp_path,
        *("queues", "create", f"{name}.fifo", "--fifo", "--dead-letter-queue", f"{dlq}.fifo"),
        env=local_env.env(),
    )
    assert done.returncode == 0, done.stderr
    created = info(f"{name}.fifo")
    assert (created.fifo, created.max_receive_count) == (True, 6)
    assert f"its dead-letter queue: {dlq}.fifo (existed), after 6 receives" in done.stdout


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["jobs", "--fifo"],
            "the queue 'jobs' would be a FIFO queue, and a FIFO queue's name "
            "ends in .fifo: name it jobs.fifo",
        ),
        (
            ["jobs.fifo", "--dead-letter-queue", "jobs-dlq"],
            "--dead-letter-queue 'jobs-dlq' "
            "would be a FIFO queue, and a FIFO queue's name ends in .fifo: name it jobs-dlq.fifo",
        ),
        (["jobs", "--max-receives", "3"], "--max-receives needs --dead-letter-queue NAME"),
        (
            ["jobs", "--dead-letter-queue", "d", "--max-receives", "0"],
            "--max-receives 0 is out of range",
        ),
        (["jobs", "--visibility-timeout", "50000"], "--visibility-timeout 50000 is out of range"),
        (["no spaces"], "the queue 'no spaces' is not a queue name SQS accepts"),
        (["jobs", "--dead-letter-queue", "jobs"], "--dead-letter-queue names jobs itself"),
    ],
)
def test_queues_create_refuses_what_sqs_would_with_one_sentence(
    tmp_path: Path, local_env: LocalSQS, argv: list[str], said: str
) -> None:
    done = sqsworker(tmp_path, "queues", "create", *argv, env=local_env.env())
    assert done.returncode == 2
    assert done.stderr.startswith(f"sqsworker: error: {said}") and done.stderr.count("\n") == 1


def test_queues_create_refuses_to_change_a_queue_that_exists(
    tmp_path: Path, local_env: LocalSQS
) -> None:
    name = unique("orders")
    local_env.create_queue(name, max_receive_count=None, visibility_timeout=30)
    done = sqsworker(
        tmp_path, "queues", "create", name, "--visibility-timeout", "90", env=local_env.env()
    )
    assert done.returncode == 2
    assert done.stderr == (
        f"sqsworker: error: the queue {name} exists with other attributes than these "
        "(VisibilityTimeout=90): change them with SetQueueAttributes (the AWS console or CLI), "
        "or choose another name.\n"
    )
    assert info(name).visibility_timeout == 30


def test_local_gives_fifo_queues_twice_the_receives_as_the_fifo_page_advises(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with local("--queue", "orders", "--queue", "payments.fifo") as exports:
        for key, value in exports.items():
            monkeypatch.setenv(key, value)
        for name, receives in (("orders", 3), ("payments.fifo", 6)):
            transport = SQSTransport.connect(name)
            transport.close()
            assert transport.info.max_receive_count == receives, name


# -- the queues table --------------------------------------------------------------------------


def on_a_terminal(argv: list[str], env: dict[str, str], columns: int = 80) -> str:
    """What `sqsworker ARGV` prints on a terminal ``columns`` wide (a pseudo-terminal)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    plain = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    with subprocess.Popen(
        [sys.executable, "-m", "sqsworker.cli", *argv],
        stdout=follower,
        stderr=subprocess.PIPE,
        env={**plain, **env, "NO_COLOR": "1", "TERM": "xterm"},
        cwd=ROOT,
    ) as proc:
        os.close(follower)
        out = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal closed: the process ended
                break
            if not chunk:
                break
            out += chunk
        assert proc.wait(60) == 0, proc.stderr.read() if proc.stderr else ""
    os.close(leader)
    return re.sub(r"\x1b\[[0-9;]*m", "", out.decode()).replace("\r\n", "\n")  # no styles


def test_the_queues_table_fits_80_columns_on_a_terminal(local_env: LocalSQS) -> None:
    prefix = unique("fits")
    local_env.create_queue(f"{prefix}-orders", max_receive_count=3)
    local_env.create_queue(f"{prefix}-payments-eu-west-1.fifo", max_receive_count=6)
    shown = on_a_terminal(["queues", prefix], local_env.env())
    table = shown.split("Counts are")[0].rstrip().splitlines()
    assert max(len(line) for line in table) <= 80, shown
    assert "…" not in shown
    header = " ".join(" ".join(table[:2]).split())
    assert header == "in in max vis. queue visible flight delayed DLQ DLQ receives timeout FIFO"
    assert [line.split()[-1] for line in table[3:] if line.split()[-1] in ("yes", "no")] == [
        "no",
        "no",
        "yes",
        "yes",
    ]


def test_the_watched_queues_table_leaves_out_the_fifo_column(local_env: LocalSQS) -> None:
    prefix = unique("watched")
    local_env.create_queue(f"{prefix}.fifo", max_receive_count=6)
    with subprocess.Popen(
        [sys.executable, "-m", "sqsworker.cli", "queues", prefix, "--watch", "0.2"],
        stdout=subprocess.PIPE,
        env={**os.environ, **local_env.env()},
        text=True,
        cwd=ROOT,
    ) as proc:
        assert proc.stdout is not None
        header = proc.stdout.readline() + proc.stdout.readline()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    assert "vis." in header and "FIFO" not in header


# -- peek on a dead-letter queue ---------------------------------------------------------------


def test_peek_on_a_dead_letter_queue_says_why_each_message_is_there(scenario: Scenario) -> None:
    """One message a worker rejected (its body is not JSON), one SQS moved after the
    queue's maxReceiveCount (3) failed receives: peek says which is which."""
    send_all(scenario.queue, ["<order>not json</order>"])
    scenario.send("fail", 1)
    worker = scenario.worker("--burst", "--backoff-base", "0.1", "--backoff-max", "0.2")
    assert worker.wait(60) == 0, scenario.logs()
    wait_until(lambda: scenario.dlq.counts().visible == 2, what="both in the DLQ")
    done = sqsworker(
        scenario.tmp_path,
        *("peek", scenario.dlq.info.name, "--json"),
        env=scenario.server.env(),
    )
    assert done.returncode == 0, done.stderr
    reasons = {m["body"][:7]: m.get("dead_letter_reason") for m in json.loads(done.stdout)}
    assert reasons == {
        "<order>": "a worker rejected it (the handler error below) and sent it here at once",
        '{"kind"': f"SQS moved it from {scenario.name}, whose maxReceiveCount is 3: "
        "received 4 times, this peek included",
    }
    shown = sqsworker(
        scenario.tmp_path, "peek", scenario.dlq.info.name, env=scenario.server.env()
    ).stdout
    assert shown.count("why here ") == 2
    assert (
        f"why here       SQS moved it from {scenario.name}, whose maxReceiveCount is 3: " in shown
    )
    assert "received 5 times, this peek included" in shown


# -- the Spark example after `make demo` -------------------------------------------------------


def test_the_spark_example_without_spark_says_to_run_make_test_first(tmp_path: Path) -> None:
    """`make demo` installs no Spark: the example says what to do, not ModuleNotFoundError.
    (pyspark is made unimportable the way Python documents: None in sys.modules.)"""
    example = ROOT / "examples" / "spark_orders.py"
    without_spark = (
        "import runpy, sys; sys.modules['pyspark'] = None; sys.argv = [sys.argv[1]]; "
        "runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    done = subprocess.run(
        [sys.executable, "-c", without_spark, str(example)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr == (
        "examples/spark_orders.py needs Spark, and pyspark is not installed here (`make demo` "
        "installs only the worker and the embedded SQS): run `make test` first, which installs "
        "Spark and the test tools into .venv (Spark also needs Java 17 or later), then "
        ".venv/bin/python examples/spark_orders.py again\n"
    )
