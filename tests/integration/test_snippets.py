"""Every code block of README.md and docs/*.md that a reader would paste runs here as
written, or is checked the way it can be (an output shown, a file shown, a query), or
says in the Markdown why it is not run (tests/snippets.py collects them all).

The handlers run for real: each in a folder of its own as app.py, on an endpoint that
holds nothing but the queues `sqsworker local --queue` would make (the blocks name fixed
queues such as "orders"; ``fresh_sqs``), and the documented `sqsworker run` line as
written, in a shell like the reader's.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import sqlite3
import subprocess
import tomllib
from contextlib import closing
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml

from sqsworker.local import CREDENTIALS

from ..conftest import wait_until
from ..snippets import ROOT, Block, blocks, parse, snippet, stray_markers
from .conftest import BIN, fresh_sqs

pytestmark = pytest.mark.integration

# Every block a test runs or checks: by test, each block by its page and a piece of text
# that no other block of that page holds. A block not here needs a "not run" marker.
COVERED: dict[str, dict[str, list[tuple[str, str]]]] = {
    "tests/integration/test_snippets.py": {
        # run as written
        "test_the_readme_producer_sends_as_written": [
            ("README.md", "orders = sqsworker.Producer("),
        ],
        "test_the_first_handler_runs_with_each_command": [
            ("README.md", "# app.py\nimport"),
            ("README.md", "sqsworker run app:process --burst"),
        ],
        "test_two_handlers_run_in_one_process_with_each_command": [
            ("README.md", "# app.py: two handlers"),
            ("README.md", "sqsworker run app:orders app:emails"),
        ],
        "test_the_async_handler_runs_as_written": [
            ("docs/handlers.md", "async def thumbnail("),
            ("docs/handlers.md", "sqsworker run app:thumbnail"),
        ],
        "test_the_batch_handler_runs_as_written": [
            ("docs/handlers.md", "def ingest("),
            ("docs/handlers.md", "sqsworker run app:ingest"),
        ],
        "test_the_decorated_lambda_handler_runs_as_written": [
            ("docs/lambda.md", "@sqsworker.lambda_handler("),
        ],
        "test_a_handlers_log_line_is_the_one_the_page_shows": [
            ("docs/observability.md", "def process("),
            ("docs/observability.md", '"event":"charging the card"'),  # checked: the line
        ],
        "test_a_key_from_the_body_suppresses_the_second_payment": [
            ("docs/idempotency.md", "idempotency_key=lambda"),
        ],
        "test_the_transactional_handler_writes_each_payment_once": [
            ("docs/idempotency.md", "sqsworker run app:charge"),
            ("docs/idempotency.md", "message.transaction()"),
        ],
        "test_create_store_makes_the_table_the_page_describes": [
            ("docs/idempotency.md", "sqsworker create-store"),
        ],
        # checked the way it can be
        "test_a_bad_value_is_refused_with_the_sentence_the_page_shows": [
            ("docs/configuration.md", "sqsworker: error:"),
        ],
        "test_the_queues_table_is_the_one_the_page_shows": [
            ("docs/operating.md", "queue       visible  flight"),
        ],
        "test_the_queue_create_examples_run_as_written": [
            ("docs/operating.md", "sqsworker queues create orders"),
        ],
        "test_the_helm_install_values_render": [("docs/deployment.md", "helm install")],
        "test_the_spark_install_line_names_the_spark_extra": [("docs/spark.md", "pip install")],
    },
    "tests/chart/test_chart.py": {
        "test_the_postgresql_values_of_the_deployment_page_render": [
            ("docs/deployment.md", "secretRef"),
        ],
        "test_the_handlers_values_of_the_deployment_page_render": [
            ("docs/deployment.md", "handlers:\n  - handler"),
        ],
    },
    "tests/integration/test_readme_walkthrough.py": {
        "test_the_readme_walkthrough_runs_as_written": [
            ("README.md", ".venv/bin/sqsworker local"),
            ("README.md", "sqsworker redrive orders-dlq"),
        ],
        "test_the_send_examples_of_operating_queues_run_as_written": [
            ("docs/operating.md", "sqsworker send orders"),
        ],
        "test_the_readme_idempotency_example_runs_each_payment_once": [
            ("README.md", "def charge("),
            ("README.md", "sqsworker run app:charge"),
        ],
    },
    "tests/spark/test_docs.py": {
        "test_the_streaming_example_runs": [
            ("README.md", "from spark_sink import"),
            ("docs/spark.md", "spark.readStream"),
        ],
    },
    "tests/integration/test_lambda.py": {
        "test_the_powertools_handler_runs_unchanged_and_its_failures_reach_the_dlq": [
            ("docs/lambda.md", "--lambda --queue orders"),
        ],
    },
    "tests/unit/test_async_handlers.py": {  # checked
        "test_a_handler_blocking_the_loop_shows_in_health_logs_and_metrics_naming_where": [
            ("docs/handlers.md", "the event loop is blocked"),
        ],
    },
    "tests/unit/test_typed.py": {
        "test_the_handlers_page_typed_example_runs_as_written": [
            ("docs/handlers.md", "# shop.py"),
        ],
    },
    "tests/unit/test_testing_harness.py": {
        "test_the_pages_tests_pass_in_a_project_of_their_own": [
            ("docs/testing-your-handlers.md", "# app.py"),
            ("docs/testing-your-handlers.md", "# test_app.py"),
            ("docs/testing-your-handlers.md", "pytest test_app.py"),
        ],
    },
    "tests/unit/test_docs.py": {  # checked
        "test_the_iam_policy_file_is_the_one_the_deployment_page_shows": [
            ("docs/deployment.md", '"Version": "2012-10-17"'),
        ],
        "test_the_observability_page_queries_only_exported_metrics": [
            ("docs/observability.md", "sum by (queue)"),
        ],
        "test_the_pointer_the_large_messages_page_shows_is_the_one_read": [
            ("docs/large-messages.md", "PayloadS3Pointer"),
        ],
    },
}


def test_every_block_is_run_or_checked_or_says_why_not() -> None:
    covered: dict[Block, str] = {}
    for module, tests in COVERED.items():
        source = (ROOT / module).read_text()
        for name, named in tests.items():
            assert re.search(rf"^def {name}\(", source, re.M), f"{module} has no {name}"
            covered.update((snippet(page, naming), f"{module}::{name}") for page, naming in named)
    problems = []
    for block in blocks():
        kind = block.info or "no info string"
        if block.not_run is None and block not in covered:
            problems.append(f"{block} ({kind}): run or check it in a test listed in COVERED, or")
            problems.append('  mark it: "<!-- snippet: not run (why) -->" on the line before')
        elif block.not_run == "":
            problems.append(f"{block} ({kind}): its marker gives no reason")
        elif block.not_run is not None and block in covered:
            problems.append(f"{block} ({kind}): marked not run, but {covered[block]} runs it")
    problems += [
        f"{marker}: stands before no fence, or is not spelt <!-- snippet: not run (why) -->"
        for marker in stray_markers()
    ]
    assert not problems, "\n".join(problems)


def test_the_collector_finds_every_fence_and_its_marker() -> None:
    page = """# A page
<!-- snippet: not run (needs a cluster) -->
```sh
kubectl apply
```

- a list item:

  <!-- snippet: not run () -->
  ~~~python
  print("indented")
  ~~~

<!-- snippet: not run (a blank line follows) -->

```
plain
```
"""
    found, stray = parse("page.md", page)
    assert [(b.line, b.info, b.text, b.not_run) for b in found] == [
        (3, "sh", "kubectl apply\n", "needs a cluster"),
        (10, "python", 'print("indented")\n', ""),
        (16, "", "plain\n", None),
    ]
    assert stray == ("page.md:14: <!-- snippet: not run (a blank line follows) -->",)


# In the environment rather than on the documented lines, which run as written: no
# metrics port (9000 may be taken, and tests run side by side), and 1 s polls, so that
# burst mode and SIGTERM end a second after the queue drains rather than 20.
QUICK = {"SQSWORKER_METRICS_PORT": "off", "SQSWORKER_WAIT_TIME": "1"}


def shell_env(exports: dict[str, str]) -> dict[str, str]:
    """A reader's shell after `. .venv/bin/activate` and the exports `sqsworker local` printed."""
    return {**os.environ, **exports, **QUICK, "PATH": f"{BIN}:{os.environ['PATH']}"}


def client(service: str, env: dict[str, str], region: str | None = None) -> Any:
    """A boto3 client of moto's server, as the exports `sqsworker local` printed give it."""
    endpoint = env[f"AWS_ENDPOINT_URL_{service.upper()}"]
    return _client(service, endpoint, region or env["AWS_REGION"])


@cache  # one per server: depth() is called while a test waits
def _client(service: str, endpoint: str, region: str) -> Any:
    return boto3.client(
        service,
        endpoint_url=endpoint,
        region_name=region,
        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    )


def send(env: dict[str, str], queue: str, body: str, key: str | None = None) -> str:
    """Send one message (with an ``idempotency-key`` attribute if ``key``); its id."""
    sqs = client("sqs", env)
    attributes = {"idempotency-key": {"DataType": "String", "StringValue": key}} if key else {}
    return str(
        sqs.send_message(
            QueueUrl=sqs.get_queue_url(QueueName=queue)["QueueUrl"],
            MessageBody=body,
            MessageAttributes=attributes,
        )["MessageId"]
    )


def send_all_of(env: dict[str, str], queue: str, bodies: list[str]) -> None:
    """Send ``bodies`` ten to a request."""
    sqs = client("sqs", env)
    url = sqs.get_queue_url(QueueName=queue)["QueueUrl"]
    for first in range(0, len(bodies), 10):
        entries = [
            {"Id": str(n), "MessageBody": body} for n, body in enumerate(bodies[first : first + 10])
        ]
        sqs.send_message_batch(QueueUrl=url, Entries=entries)


def depth(env: dict[str, str], queue: str) -> int:
    """Messages visible, in flight and delayed (moto's counts are exact)."""
    sqs = client("sqs", env)
    url = sqs.get_queue_url(QueueName=queue)["QueueUrl"]
    names = ["", "NotVisible", "Delayed"]
    counts = sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=[f"ApproximateNumberOfMessages{n}" for n in names]
    )["Attributes"]
    return sum(int(count) for count in counts.values())


@dataclass(frozen=True)
class Ran:
    code: int
    stderr: str

    def events(self, event: str) -> list[dict[str, Any]]:
        """The worker's JSON log lines (JSON, as stderr is not a terminal) of one event."""
        lines = [json.loads(line) for line in self.stderr.splitlines() if line.startswith("{")]
        return [line for line in lines if line["event"] == event]


def run_worker(command: str, env: dict[str, str], cwd: Path, *queues: str) -> Ran:
    """Run one documented `sqsworker run` line, as written, until ``queues`` have drained.

    A line with --burst stops by itself. One without runs until SIGTERM, which it gets
    once the queue is empty, as a terminal's Ctrl-C or a rollout would send it: to the
    line's process group (bash runs a single command with exec, so SIGTERM reaches
    sqsworker itself, and the exit code is sqsworker's).
    """
    with subprocess.Popen(
        ["bash", "-c", command],
        env=env,
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as worker:
        try:
            wait_until(
                lambda: worker.poll() is not None or not any(depth(env, q) for q in queues),
                timeout=60,
                what=f"{command.strip()!r} to drain {', '.join(queues)}",
            )
            if "--burst" not in command:
                os.killpg(worker.pid, signal.SIGTERM)
            _, stderr = worker.communicate(timeout=60)
        finally:
            if worker.poll() is None:
                os.killpg(worker.pid, signal.SIGKILL)
    return Ran(worker.returncode, stderr)


def test_the_first_handler_runs_with_each_command(tmp_path: Path) -> None:
    """README, "Write a handler": app.py as written; each of the three command lines as
    written gets an order of its own, handles it, and exits 0."""
    (tmp_path / "app.py").write_text(snippet("README.md", "# app.py\nimport").text)
    lines = snippet("README.md", "sqsworker run app:process --burst").text.splitlines()
    assert len(lines) == 3
    with fresh_sqs("orders") as exports:
        env = shell_env(exports)
        for number, line in enumerate(lines, 1):
            send(env, "orders", json.dumps({"id": number}))
            ran = run_worker(line, env, tmp_path, "orders")
            assert ran.code == 0, ran.stderr
            (started,) = ran.events("worker started")
            assert started["concurrency"] == (32 if "SQSWORKER_CONCURRENCY=32" in line else 16)
            assert [logged["order"] for logged in ran.events("order received")] == [number]
            assert len(ran.events("message processed")) == 1
        assert depth(env, "orders") + depth(env, "orders-dlq") == 0


def test_two_handlers_run_in_one_process_with_each_command(tmp_path: Path) -> None:
    """README, "Several queues in one process": app.py as written; each command line as
    written serves both queues from one process, with each handler's concurrency as the
    line sets it, and exits 0 on SIGTERM."""
    (tmp_path / "app.py").write_text(snippet("README.md", "# app.py: two handlers").text)
    lines = snippet("README.md", "sqsworker run app:orders app:emails").text.splitlines()
    assert len(lines) == 3
    with fresh_sqs("orders", "emails") as exports:
        env = shell_env(exports)
        for number, line in enumerate(lines, 1):
            send(env, "orders", json.dumps({"id": number}))
            send(env, "emails", json.dumps({"to": f"customer-{number}@example.com"}))
            ran = run_worker(line, env, tmp_path, "orders", "emails")
            assert ran.code == 0, ran.stderr
            started = {e["queue"]: e["concurrency"] for e in ran.events("worker started")}
            assert started == {"orders": 16, "emails": 4 if number == 1 else 8}
            assert [e["order"] for e in ran.events("order received")] == [number]
            assert [e["to"] for e in ran.events("email sent")] == [f"customer-{number}@example.com"]
        assert sum(depth(env, q) for q in ("orders", "orders-dlq", "emails", "emails-dlq")) == 0


def test_the_async_handler_runs_as_written(tmp_path: Path) -> None:
    """docs/handlers.md: the async handler as written runs its coroutines concurrently on
    the event loop, and the documented line drains the queue and exits 0."""
    (tmp_path / "app.py").write_text(snippet("docs/handlers.md", "async def thumbnail(").text)
    (line,) = snippet("docs/handlers.md", "sqsworker run app:thumbnail").text.splitlines()
    with fresh_sqs("thumbnails") as exports:
        env = shell_env(exports)
        send_all_of(env, "thumbnails", [json.dumps({"image": f"img-{n}.png"}) for n in range(100)])
        ran = run_worker(line, env, tmp_path, "thumbnails")
        assert ran.code == 0, ran.stderr
        (started,) = ran.events("worker started")
        assert started["concurrency"] == 200
        made = sorted(e["image"] for e in ran.events("thumbnail made"))
        assert made == sorted(f"img-{n}.png" for n in range(100))
        assert depth(env, "thumbnails") == 0


def test_the_batch_handler_runs_as_written(tmp_path: Path) -> None:
    """docs/handlers.md: the batch handler as written inserts the events in batches of up
    to 50, and the two that are not events go to the dead-letter queue, the rest deleted."""
    (tmp_path / "app.py").write_text(snippet("docs/handlers.md", "def ingest(").text)
    (line,) = snippet("docs/handlers.md", "sqsworker run app:ingest").text.splitlines()
    with fresh_sqs("events") as exports:
        env = shell_env(exports)
        bodies = [json.dumps({"id": f"e{n}", "kind": "click"}) for n in range(118)]
        send_all_of(env, "events", [*bodies, "not json", json.dumps({"id": "e-no-kind"})])
        ran = run_worker(line, env, tmp_path, "events")
        assert ran.code == 0, ran.stderr
        with closing(sqlite3.connect(tmp_path / "events.db")) as db:
            ids = {row[0] for row in db.execute("SELECT id FROM events")}
        assert ids == {f"e{n}" for n in range(118)}
        rejected = ran.events("handler rejected the message; moved to the dead-letter queue")
        assert len(rejected) == 2, ran.stderr
        assert depth(env, "events") == 0 and depth(env, "events-dlq") == 2


def test_the_decorated_lambda_handler_runs_as_written(tmp_path: Path) -> None:
    """docs/lambda.md: the decorated Lambda handler as written is given Lambda's event,
    a batch at a time, and prints each record."""
    (tmp_path / "app.py").write_text(snippet("docs/lambda.md", "@sqsworker.lambda_handler(").text)
    with fresh_sqs("orders") as exports:
        env = shell_env(exports)
        ids = [send(env, "orders", json.dumps({"id": n})) for n in range(12)]
        with subprocess.Popen(
            [str(BIN / "sqsworker"), "run", "app:lambda_handler", "--burst"],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as worker:
            out, err = worker.communicate(timeout=60)
        assert worker.returncode == 0, err
        printed = [line.split(" ", 1) for line in out.splitlines()]
        assert sorted(i for i, _ in printed) == sorted(ids)
        assert depth(env, "orders") == 0


def test_a_handlers_log_line_is_the_one_the_page_shows(tmp_path: Path) -> None:
    """docs/observability.md: the handler as written logs the JSON line the page shows,
    with the message's own fields (only the id and the time differ)."""
    (tmp_path / "app.py").write_text(snippet("docs/observability.md", "def process(").text)
    shown = json.loads(snippet("docs/observability.md", '"event":"charging the card"').text)
    with fresh_sqs("orders") as exports:
        env = shell_env(exports)
        message_id = send(env, "orders", '{"id": 1}')
        # The page gives no command for this handler: the README's `--burst` line.
        ran = run_worker("sqsworker run app:process --burst", env, tmp_path, "orders")
    assert ran.code == 0, ran.stderr
    (logged,) = ran.events("charging the card")
    assert logged.keys() == shown.keys()
    assert logged["message_id"] == message_id
    varying = ("message_id", "timestamp")
    assert {k: v for k, v in logged.items() if k not in varying} == {
        k: v for k, v in shown.items() if k not in varying
    }


def test_a_key_from_the_body_suppresses_the_second_payment(tmp_path: Path) -> None:
    """docs/idempotency.md, "Keys": the handler whose key is the body's payment_id, run
    by the page's first command, gets one payment twice: it runs once, and the copy is
    deleted unrun."""
    (tmp_path / "app.py").write_text(snippet("docs/idempotency.md", "idempotency_key=lambda").text)
    command = snippet("docs/idempotency.md", "sqsworker run app:charge").text
    with fresh_sqs("payments") as exports:
        env = shell_env(exports)
        summaries = []
        # One copy per run: a copy received beside its original would wait for the
        # original's claim to end (up to the visibility timeout, 30 s) to be looked at.
        for _ in range(2):
            send(env, "payments", '{"payment_id": "p-1"}')
            ran = run_worker(command, env, tmp_path, "payments")
            assert ran.code == 0, ran.stderr
            summaries.append(ran.events("summary")[0])
        assert depth(env, "payments") + depth(env, "payments-dlq") == 0
    assert [(s["succeeded"], s["duplicates_suppressed"]) for s in summaries] == [(1, 0), (0, 1)]


def test_the_transactional_handler_writes_each_payment_once(tmp_path: Path) -> None:
    """docs/idempotency.md, "Exactly-once effects": the handler as written, run by the
    page's first command, gets one payment twice under one idempotency-key attribute;
    the ledger holds it once."""
    (tmp_path / "app.py").write_text(snippet("docs/idempotency.md", "message.transaction()").text)
    command = snippet("docs/idempotency.md", "sqsworker run app:charge").text
    # "The tables are yours: create them before the workers start." No primary key, so
    # that a second run of the effect would show as a second row.
    with closing(sqlite3.connect(tmp_path / "payments.db")) as db:
        db.execute("CREATE TABLE ledger (payment_id TEXT, amount INTEGER)")
    with fresh_sqs("payments") as exports:
        env = shell_env(exports)
        for _ in range(2):  # one copy per run, as above
            send(env, "payments", '{"id": "p-1", "amount": 1250}', key="p-1")
            ran = run_worker(command, env, tmp_path, "payments")
            assert ran.code == 0, ran.stderr
        assert depth(env, "payments") + depth(env, "payments-dlq") == 0
    with closing(sqlite3.connect(tmp_path / "payments.db")) as db:
        assert db.execute("SELECT payment_id, amount FROM ledger").fetchall() == [("p-1", 1250)]


def test_create_store_makes_the_table_the_page_describes() -> None:
    """docs/idempotency.md: `create-store` as written, against moto's server, which
    serves DynamoDB too; the table is the one the page describes."""
    command = snippet("docs/idempotency.md", "sqsworker create-store").text
    with fresh_sqs() as exports:  # no queue needed
        env = shell_env(exports)
        done = subprocess.run(
            ["bash", "-e", "-c", command], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        assert "the idempotency store dynamodb://orders-idempotency is ready" in done.stdout
        dynamodb = client("dynamodb", env, region="eu-west-1")
        table = dynamodb.describe_table(TableName="orders-idempotency")["Table"]
        ttl = dynamodb.describe_time_to_live(TableName="orders-idempotency")
    assert table["KeySchema"] == [{"AttributeName": "key", "KeyType": "HASH"}]
    assert table["AttributeDefinitions"] == [{"AttributeName": "key", "AttributeType": "S"}]
    assert table["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
    assert ttl["TimeToLiveDescription"] == {"AttributeName": "ttl", "TimeToLiveStatus": "ENABLED"}


def test_a_bad_value_is_refused_with_the_sentence_the_page_shows() -> None:
    """docs/configuration.md shows what a visibility timeout of 50000 gets: exactly that."""
    shown = snippet("docs/configuration.md", "sqsworker: error:").text
    done = subprocess.run(
        [BIN / "sqsworker", "run", "examples.orders:process", "--visibility-timeout", "50000"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stderr) == (2, shown)


def test_the_queues_table_is_the_one_the_page_shows() -> None:
    """docs/operating.md shows `sqsworker queues` on a fresh `orders` holding 3 messages."""
    shown = snippet("docs/operating.md", "queue       visible  flight").text
    with fresh_sqs("orders") as exports:
        env = shell_env(exports)
        for number in range(3):
            send(env, "orders", json.dumps({"id": number}))
        done = subprocess.run(
            ["sqsworker", "queues"], env=env, capture_output=True, text=True, timeout=60
        )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(shown), done.stdout  # then a note on SQS's counts


def test_the_readme_producer_sends_as_written(tmp_path: Path) -> None:
    """README.md: the Producer block, run as a script, sends 100 orders in 11 requests."""
    (tmp_path / "send.py").write_text(snippet("README.md", "orders = sqsworker.Producer(").text)
    with fresh_sqs("orders") as exports:
        env = shell_env(exports)
        ran = subprocess.run(
            [str(BIN / "python"), "send.py"],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout.strip() == "sent 100 orders in 11 requests"
        assert depth(env, "orders") == 100


def test_the_queue_create_examples_run_as_written() -> None:
    """docs/operating.md's `sqsworker queues create` lines, as written, on a fresh
    endpoint: each queue has the attributes the page says."""
    block = snippet("docs/operating.md", "sqsworker queues create orders").text
    with fresh_sqs() as exports:
        env = shell_env(exports)
        done = subprocess.run(
            ["bash", "-e", "-c", block], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        sqs = client("sqs", env)

        def attributes(name: str) -> dict[str, Any]:
            url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
            raw = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
            policy = json.loads(raw.get("RedrivePolicy", "{}"))
            return {
                "fifo": raw.get("FifoQueue") == "true",
                "visibility": int(raw["VisibilityTimeout"]),
                "dlq": policy.get("deadLetterTargetArn", ":").rsplit(":", 1)[-1],
                "receives": policy.get("maxReceiveCount"),
            }

        assert attributes("orders") == {
            "fifo": False,
            "visibility": 30,
            "dlq": "orders-dlq",
            "receives": 5,
        }
        assert attributes("payments.fifo") == {
            "fifo": True,
            "visibility": 30,
            "dlq": "payments-dlq.fifo",
            "receives": 6,
        }
        assert attributes("payments-dlq.fifo")["fifo"]
        assert attributes("reports") == {
            "fifo": False,
            "visibility": 300,
            "dlq": "",
            "receives": None,
        }


def test_the_helm_install_values_render() -> None:
    """docs/deployment.md's `helm install` needs a cluster: the same command with `helm
    template` renders the chart with its values as written (values.schema.json refuses a
    misspelt key or a bad value), and the worker gets them."""
    block = snippet("docs/deployment.md", "helm install").text
    command = block.replace("helm install", f"{BIN}/helm template", 1)
    done = subprocess.run(
        ["bash", "-e", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    rendered = {doc["kind"]: doc for doc in yaml.safe_load_all(done.stdout) if doc}
    (container,) = rendered["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "123456789012.dkr.ecr.eu-west-1.amazonaws.com/orders-worker:1.4.2"
    assert container["args"] == ["run", "app.handlers:process"]
    variables = {v["name"]: v.get("value") for v in container["env"]}
    assert variables["SQSWORKER_QUEUE"] == "https://sqs.eu-west-1.amazonaws.com/123456789012/orders"
    assert variables["SQSWORKER_REGION"] == "eu-west-1"
    assert rendered["ServiceAccount"]["metadata"]["annotations"] == {
        "eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/orders-worker"
    }


def test_the_spark_install_line_names_the_spark_extra() -> None:
    """docs/spark.md's `pip install` needs a package index: the extra it names must
    exist, and hold what its comment says."""
    command, _, comment = snippet("docs/spark.md", "pip install").text.partition("#")
    assert shlex.split(command) == ["pip", "install", "sqsworker[spark]"]
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extra = pyproject["project"]["optional-dependencies"]["spark"]
    pins = {re.split(r"[=<>]", r, maxsplit=1)[0]: r for r in extra}
    # the comment: "pyspark 4.3.0, pyarrow, pandas < 3"
    assert list(pins) == re.findall(r"[a-z]+", comment)
    assert pins["pyspark"] == "pyspark==" + re.findall(r"pyspark ([\d.]+)", comment)[0]
    assert pins["pandas"].endswith("<" + re.findall(r"pandas < (\d+)", comment)[0])
