"""The queue commands (`queues`, `send`, `peek`, `redrive`, `purge`) end to end on moto's
server, each in this process through `sqsworker.cli.main`, as a user would type it."""

from __future__ import annotations

import io
import json
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sqsworker.cli import main
from sqsworker.local import LocalSQS
from sqsworker.transports import Envelope, OutgoingMessage, send_all
from sqsworker.transports.sqs import SQSTransport

from ..conftest import unique

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _signals_restored() -> Iterator[None]:
    """`redrive` and `queues --watch` install SIGINT and SIGTERM handlers: put pytest's back."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for number, handler in saved.items():
        signal.signal(number, handler)


@pytest.fixture
def stdin(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    """Standard input that is not a terminal (as in a pipe), empty unless a test writes it."""
    fake = io.StringIO()
    monkeypatch.setattr(sys, "stdin", fake)
    return fake


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def drain(transport: SQSTransport) -> list[Envelope]:
    """Every message of the queue, each received once (and so hidden for the test's rest)."""
    got: list[Envelope] = []
    while batch := transport.receive(10, 0, 60):
        got += batch
    return got


def test_send_takes_arguments_files_and_stdin_in_batches_with_attributes(
    local_env: LocalSQS,
    capsys: pytest.CaptureFixture[str],
    stdin: io.StringIO,
    tmp_path: Path,
) -> None:
    name = unique("send")
    local_env.create_queue(name, max_receive_count=None)
    queue = SQSTransport.connect(name)

    code, out, _ = cli(
        capsys, "send", name, '{"id": 1}', "plain text", "--attribute", "source=cli",
        "--attribute", "tries:Number=2", "--idempotency-key", "order-1",
    )  # fmt: skip
    assert code == 0
    assert out.splitlines() == [
        "note: the 2 messages share the idempotency key 'order-1': a worker with an "
        "idempotency store runs one of them",
        f"sent 2 messages to {name}",
    ]
    got = drain(queue)
    assert sorted(e.body for e in got) == ["plain text", '{"id": 1}']
    attributes = got[0].message_attributes
    assert attributes["source"] == {"DataType": "String", "StringValue": "cli"}
    assert attributes["tries"] == {"DataType": "Number", "StringValue": "2"}
    assert attributes["idempotency-key"]["StringValue"] == "order-1"

    jsonl = tmp_path / "orders.jsonl"
    jsonl.write_text("".join(json.dumps({"id": i}) + "\n" for i in range(25)) + "\n")
    assert cli(capsys, "send", name, "--file", str(jsonl))[:2] == (
        0,
        f"sent 25 messages to {name}\n",
    )
    assert sorted(json.loads(e.body)["id"] for e in drain(queue)) == list(range(25))

    stdin.write("first line\nsecond line\n\n")
    stdin.seek(0)
    assert cli(capsys, "send", name)[0] == 0
    assert sorted(e.body for e in drain(queue)) == ["first line", "second line"]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (
            ["x", "--attribute", "colour"],
            "the attribute 'colour' has no '=': write it as NAME=VALUE",
        ),
        (["x", "--attribute", "n:Blob=1"], "use String or Number"),
        (["x", "--delay", "901"], "--delay 901 is out of range"),
        (["x", "--dedup-id", "d"], "is a standard queue: --dedup-id is for FIFO queues"),
        (["x", "--group-id", "ACME Corp"], "--group-id 'ACME Corp' is not one SQS takes"),
        (["x", "--attribute", "AWS.trace=1"], "the attribute name 'AWS.trace' is not one SQS"),
        (["x", "--attribute", "bad name=1"], "the attribute name 'bad name' is not one SQS"),
        (["x", "--attribute", "empty="], "the attribute 'empty' has no value"),
        (["x", "--attribute", "n:Number=abc"], "the attribute 'n' is a Number, but 'abc' is not"),
        (["bell\x07"], "message 2 holds a character SQS refuses (U+0007 at position 5)"),
        (["x" * 1_048_577], "message 2 is 1,048,577 bytes with its attributes"),
        ([], "there was no message to send: the input had no bodies"),
    ],
)
def test_send_refuses_bad_input_in_one_sentence_and_sends_nothing(
    local_env: LocalSQS,
    capsys: pytest.CaptureFixture[str],
    stdin: io.StringIO,
    argv: list[str],
    says: str,
) -> None:
    name = unique("send-bad")
    local_env.create_queue(name, max_receive_count=None)
    code, _, err = cli(capsys, "send", name, "ok", *argv) if argv else cli(capsys, "send", name)
    assert code == 2
    assert says in err and err.startswith("sqsworker: error: ") and err.count("\n") == 1
    assert drain(SQSTransport.connect(name)) == []


def test_send_checks_every_line_of_a_file_before_sending_the_first(
    local_env: LocalSQS, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    name = unique("send-file")
    local_env.create_queue(name, max_receive_count=None)
    jsonl = tmp_path / "bad.jsonl"
    jsonl.write_text('{"id": 1}\n{"id": 2}\n{"id": 3,\n')
    code, _, err = cli(capsys, "send", name, "--file", str(jsonl))
    assert code == 2
    assert f"line 3 of {jsonl} is not JSON" in err
    assert drain(SQSTransport.connect(name)) == []


def test_send_to_a_fifo_queue_needs_a_group_and_keeps_it(
    local_env: LocalSQS, capsys: pytest.CaptureFixture[str]
) -> None:
    name = unique("send") + ".fifo"
    local_env.create_queue(name, max_receive_count=None)
    code, _, err = cli(capsys, "send", name, "a")
    assert code == 2 and "is a FIFO queue: pass --group-id" in err
    code, _, err = cli(capsys, "send", name, "a", "--group-id", "g")
    assert code == 2 and "pass --dedup-id, or enable ContentBasedDeduplication" in err
    code, _, err = cli(capsys, "send", name, "a", "b", "--group-id", "g", "--dedup-id", "p9")
    assert code == 2 and "--dedup-id names one message, and 2 were given" in err
    code, _, _ = cli(capsys, "send", name, "a", "--group-id", "customer-4", "--dedup-id", "p9")
    assert code == 0
    (got,) = drain(SQSTransport.connect(name))
    assert got.attributes["MessageGroupId"] == "customer-4"
    assert got.attributes["MessageDeduplicationId"] == "p9"


def test_a_missing_queue_is_one_sentence_and_exit_1(
    local_env: LocalSQS, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = cli(capsys, "send", unique("missing"), "x")
    assert code == 1
    assert "does not exist at" in err and err.count("\n") == 1


def test_queues_lists_depth_in_flight_and_the_dead_letter_queue(
    local_env: LocalSQS, capsys: pytest.CaptureFixture[str]
) -> None:
    name = unique("status")
    local_env.create_queue(name, max_receive_count=4, visibility_timeout=45)
    queue, dlq = SQSTransport.connect(name), SQSTransport.connect(f"{name}-dlq")
    send_all(queue, ["a", "b", "c"])
    send_all(dlq, ["dead"])
    queue.receive(1, 0, 60)  # one in flight

    code, out, _ = cli(capsys, "queues", name, "--json")
    assert code == 0
    rows = {row["name"]: row for row in map(json.loads, out.splitlines())}
    assert rows[name] == {
        "name": name,
        "url": queue.info.url,
        "visible": 2,
        "in_flight": 1,
        "delayed": 0,
        "fifo": False,
        "visibility_timeout": 45,
        "dead_letter_queue": f"{name}-dlq",
        "dead_letter_visible": 1,
        "max_receive_count": 4,
    }
    assert rows[f"{name}-dlq"]["dead_letter_queue"] is None

    code, out, _ = cli(capsys, "queues", name)
    above, header, first, second, note = out.splitlines()[:5]  # headers of two lines
    assert above.split() == ["in", "in", "max", "vis."]
    assert header.split()[:4] == ["queue", "visible", "flight", "delayed"]
    assert first.split() == [name, "2", "1", "0", f"{name}-dlq", "1", "4", "45", "s", "no"]
    assert second.split()[0] == f"{name}-dlq"
    assert "approximations" in note and "ApproximateAgeOfOldestMessage" in note


def test_peek_shows_messages_and_hands_each_back_at_once(
    local_env: LocalSQS, capsys: pytest.CaptureFixture[str]
) -> None:
    name = unique("peek")
    local_env.create_queue(name)
    dlq = SQSTransport.connect(f"{name}-dlq")
    send_all(dlq, ["x" * 400])
    dlq.send_batch(
        [
            OutgoingMessage(
                '{"id": 3}',
                message_attributes={
                    "sqsworker-error": {
                        "DataType": "String",
                        "StringValue": "ValueError: no items",
                    },
                    "sqsworker-source-message-id": {"DataType": "String", "StringValue": "m-1"},
                },
            )
        ]
    )
    code, out, _ = cli(capsys, "peek", f"{name}-dlq")
    assert code == 0
    assert out.startswith(f"2 messages of {name}-dlq, each visible again now. A peek is a receive")
    assert "handler error      ValueError: no items" in out
    assert "source message id  m-1" in out
    assert "x" * 300 + "... (400 characters)" in out

    # Visible again at once: a receive now gets both, at their second receive.
    again = drain(dlq)
    assert sorted(e.receive_count for e in again) == [2, 2]


def test_peek_refuses_a_queue_whose_messages_it_could_dead_letter_unless_forced(
    local_env: LocalSQS, capsys: pytest.CaptureFixture[str]
) -> None:
    name = unique("peek")
    local_env.create_queue(name, max_receive_count=3)
    queue = SQSTransport.connect(name)
    send_all(queue, ['{"id": 1}'])
    code, out, err = cli(capsys, "peek", name)
    assert (code, out) == (2, "")
    assert "a peek is a receive" in err and f"would move to {name}-dlq" in err
    assert "--force" in err

    code, out, _ = cli(capsys, "peek", name, "--force", "--json")
    assert code == 0
    (shown,) = json.loads(out)
    assert shown["body"] == '{"id": 1}' and shown["attributes"]["ApproximateReceiveCount"] == "1"
    (got,) = drain(queue)  # the refused peek received nothing; the forced one handed it back
    assert got.receive_count == 2


def test_redrive_moves_a_dead_letter_queue_back_here_where_sqs_cannot(
    local_env: LocalSQS, capsys: pytest.CaptureFixture[str]
) -> None:
    name = unique("redrive")
    local_env.create_queue(name)
    queue, dlq = SQSTransport.connect(name), SQSTransport.connect(f"{name}-dlq")
    send_all(dlq, [json.dumps({"id": i}) for i in range(23)])

    code, out, _ = cli(capsys, "redrive", f"{name}-dlq", "--dry-run")
    assert (code, out) == (
        0,
        f"would move about 23 messages from {name}-dlq to {name} (nothing was moved)\n",
    )
    assert dlq.counts().visible == 23

    code, out, _ = cli(capsys, "redrive", f"{name}-dlq")
    assert code == 0
    assert out.splitlines() == [
        "this endpoint has no message move task (StartMessageMoveTask): moving the messages "
        "here instead",
        f"moved 23 messages from {name}-dlq to {name}",
    ]
    assert sorted(json.loads(e.body)["id"] for e in drain(queue)) == list(range(23))
    assert dlq.counts().total == 0


def test_redrive_refuses_a_queue_that_is_no_dead_letter_queue_and_an_ambiguous_one(
    local_env: LocalSQS, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = unique("a"), unique("b")
    local_env.create_queue(first)
    client = local_env.client()
    dlq_arn = SQSTransport.connect(f"{first}-dlq").info.arn
    policy = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 3})
    client.create_queue(QueueName=second, Attributes={"RedrivePolicy": policy})
    send_all(SQSTransport.connect(f"{first}-dlq"), ["m"])

    code, _, err = cli(capsys, "redrive", first)
    assert code == 2 and f"{first} is not the dead-letter queue of any queue" in err
    code, _, err = cli(capsys, "redrive", f"{first}-dlq")
    assert code == 2 and "is the dead-letter queue of 2 queues" in err and "--to" in err
    assert cli(capsys, "redrive", f"{first}-dlq", "--to", second)[0] == 0
    assert [e.body for e in drain(SQSTransport.connect(second))] == ["m"]


def test_purge_asks_first_and_refuses_a_second_purge_within_60_seconds(
    local_env: LocalSQS, capsys: pytest.CaptureFixture[str], stdin: io.StringIO
) -> None:
    name = unique("purge")
    local_env.create_queue(name, max_receive_count=None)
    queue = SQSTransport.connect(name)
    send_all(queue, ["a", "b"])

    code, _, err = cli(capsys, "purge", name)  # no terminal to ask on
    assert code == 2 and f"purge deletes every message of {name}: confirm with --yes" in err
    assert queue.counts().visible == 2

    code, out, _ = cli(capsys, "purge", name, "--yes")
    assert code == 0 and out.startswith(f"purged {name} (about 2 messages)")
    assert queue.counts().total == 0
    code, _, err = cli(capsys, "purge", name, "--yes")
    assert code == 1 and "SQS allows one purge per queue every 60 seconds" in err


def test_local_on_a_busy_port_says_so_and_exits(local_sqs: LocalSQS) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sqsworker.cli", "local", "--port", str(local_sqs.port)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.startswith(
        f"sqsworker: error: could not listen on 127.0.0.1:{local_sqs.port}"
    )
    assert "--port 0 for a free one" in done.stderr and done.stderr.count("\n") == 1


def test_purge_on_a_terminal_takes_only_the_queue_name_as_yes(
    local_env: LocalSQS,
    capsys: pytest.CaptureFixture[str],
    stdin: io.StringIO,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = unique("purge")
    local_env.create_queue(name, max_receive_count=None)
    queue = SQSTransport.connect(name)
    send_all(queue, ["a"])
    monkeypatch.setattr(stdin, "isatty", lambda: True)
    stdin.write("yes\n" + name + "\n")
    stdin.seek(0)

    code, out, _ = cli(capsys, "purge", name)
    assert code == 2 and out.endswith("nothing was purged\n")
    assert queue.counts().visible == 1
    code, out, _ = cli(capsys, "purge", name)
    assert code == 0 and f"purged {name} (about 1 message)" in out
    assert queue.counts().total == 0


def test_redrive_of_a_fifo_message_within_its_deduplication_window_moves_it(
    local_env: LocalSQS, capsys: pytest.CaptureFixture[str]
) -> None:
    """The copy keeps the message's group. (Its deduplication id is a new one: see
    tests/unit/test_operate.py for why; moto forgets a deleted message's id.)"""
    name = unique("redrive") + ".fifo"
    local_env.create_queue(name, max_receive_count=1, visibility_timeout=30)
    queue = SQSTransport.connect(name)
    queue.send_batch([OutgoingMessage("pay 9", group_id="customer-4", deduplication_id="p9")])
    (first,) = queue.receive(1, 0, 30)
    queue.change_visibility_batch([("0", first.receipt_handle, 0)])
    assert queue.receive(1, 0, 30) == []  # past maxReceiveCount: SQS moved it to the DLQ
    dlq = SQSTransport.connect(name.removesuffix(".fifo") + "-dlq.fifo")
    assert dlq.counts().visible == 1

    assert cli(capsys, "redrive", dlq.info.name)[0] == 0
    (back,) = drain(queue)
    assert (back.body, back.attributes["MessageGroupId"]) == ("pay 9", "customer-4")
    assert dlq.counts().total == 0


def test_send_reads_stdin_that_is_not_utf8_as_one_sentence(
    local_env: LocalSQS, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    name = unique("send")
    local_env.create_queue(name, max_receive_count=None)
    raw = io.TextIOWrapper(io.BytesIO(b"ok\n\xff\xfe bad\n"), errors="surrogateescape")
    monkeypatch.setattr(sys, "stdin", raw)
    code, _, err = cli(capsys, "send", name)
    assert code == 2 and "standard input is not UTF-8 text" in err
    assert drain(SQSTransport.connect(name)) == []


def test_peek_prints_bodies_as_they_are(
    local_env: LocalSQS, capsys: pytest.CaptureFixture[str]
) -> None:
    name = unique("peek")
    local_env.create_queue(name, max_receive_count=None)
    body = '{"note": "[red]x[/red] [/oops] [b]"}'
    send_all(SQSTransport.connect(name), [body])
    code, out, _ = cli(capsys, "peek", name)
    assert code == 0 and body in out


def test_redrive_moves_large_bodies_in_requests_under_one_mebibyte(
    local_env: LocalSQS, capsys: pytest.CaptureFixture[str]
) -> None:
    name = unique("redrive")
    local_env.create_queue(name)
    dlq = SQSTransport.connect(f"{name}-dlq")
    for i in range(10):  # 2 MB in all: more than one request
        send_all(dlq, [str(i) * 200_000])
    code, out, _ = cli(capsys, "redrive", dlq.info.name)
    assert code == 0 and f"moved 10 messages from {name}-dlq to {name}" in out
    assert sorted(e.body[0] for e in drain(SQSTransport.connect(name))) == list("0123456789")
    assert dlq.counts().total == 0


def test_redrive_to_the_dead_letter_queue_itself_is_refused(
    local_env: LocalSQS, capsys: pytest.CaptureFixture[str]
) -> None:
    name = unique("redrive")
    local_env.create_queue(name)
    code, _, err = cli(capsys, "redrive", f"{name}-dlq", "--to", f"{name}-dlq")
    assert code == 2 and f"--to names {name}-dlq itself" in err


def test_a_misspelt_queue_gets_the_nearest_name(
    local_env: LocalSQS, capsys: pytest.CaptureFixture[str]
) -> None:
    name = unique("invoices")
    local_env.create_queue(name + ".fifo", max_receive_count=None)
    code, _, err = cli(capsys, "send", name, "x")
    assert code == 1 and err.endswith(f"; did you mean {name}.fifo?\n")


def test_peek_of_an_empty_queue_says_so(
    local_env: LocalSQS, capsys: pytest.CaptureFixture[str]
) -> None:
    name = unique("peek")
    local_env.create_queue(name, max_receive_count=None)
    assert cli(capsys, "peek", name)[:2] == (0, f"no message of {name} was visible to receive\n")


class CtrlC:
    """Signals for `queues --watch`: Ctrl-C comes during the second wait."""

    def __init__(self) -> None:
        self.received = threading.Event()
        self.waits = 0

        def wait(timeout: float | None = None) -> bool:
            self.waits += 1
            if self.waits == 2:
                self.received.set()
            return self.received.is_set()

        self.received.wait = wait  # type: ignore[method-assign]

    def install(self) -> None:
        pass


def test_queues_watch_into_a_pipe_prints_a_table_each_time(
    local_env: LocalSQS, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from sqsworker.commands import queues as queue_commands

    name = unique("watch")
    local_env.create_queue(name, max_receive_count=None)
    send_all(SQSTransport.connect(name), ["a", "b"])
    monkeypatch.setattr(queue_commands, "Signals", CtrlC)
    code, out, _ = cli(capsys, "queues", name, "--watch", "0.5")
    assert code == 0
    assert len(re.findall(rf"^{name} +2 +0 +0 ", out, re.M)) == 2, out
    assert out.count("every 0.5 s; Ctrl-C stops\n") == 2
    assert cli(capsys, "queues", name, "--watch", "0")[:1] == (2,)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--port", "99999"], "--port 99999 is not a port: use 1 to 65535, or 0 for a free one"),
        (["--queue", "bad name!"], "--queue 'bad name!' is not a queue name this can create"),
        (["--queue", "q" * 77], "is not a queue name this can create"),
        (["--max-receive-count", "0"], "--max-receive-count 0 must be 1 or more"),
        (["--visibility-timeout", "-1"], "--visibility-timeout -1 must be 0 to 43200 seconds"),
        (["--host", "no-such-host.invalid", "--port", "0"], "could not listen on no-such-host"),
    ],
)
def test_local_refuses_what_cannot_work_in_one_sentence(argv: list[str], says: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sqsworker.cli", "local", *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode in (1, 2)
    assert done.stderr.startswith("sqsworker: error: ") and says in done.stderr
    assert done.stderr.count("\n") == 1
