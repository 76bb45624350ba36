"""The write-ahead log, the options and the driver's log lines: no Spark needed."""

from __future__ import annotations

import http.client
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from structlog.testing import capture_logs

from spark_sink.driver import SourceLog
from spark_sink.options import SourceOptions, SQSOptionError
from spark_sink.wal import LocalLog, LogUnusable, S3Log, Slot, open_log, parse_place
from sqsworker.clock import FakeClock
from sqsworker.lease import LeaseKeeper
from sqsworker.local import LocalSQS
from sqsworker.transports import Envelope
from sqsworker.transports.memory import MemorySQS

from .conftest import s3_bucket, s3_keys


def slot(seq: int, partition: int, *ids: str) -> Slot:
    messages = tuple(
        Envelope(i, f"handle-{i}", f"body {i}", {"ApproximateReceiveCount": "1"}) for i in ids
    )
    return Slot(seq, partition, 1_700_000_000.0, messages)


def test_a_slot_is_recorded_once_and_read_back_whole(tmp_path: Path) -> None:
    wal = LocalLog(str(tmp_path))
    first = slot(1, 0, "a", "b")
    assert wal.write(first) is first
    assert wal.write(slot(1, 0, "c")) == first  # the place is taken: the winner comes back
    assert wal.read(1, 0) == first
    assert wal.read(1, 1) is None
    assert [p.name for p in (tmp_path / "000000000001").iterdir()] == ["part-00000.json"]


def test_on_s3_a_slot_is_recorded_once_read_back_whole_and_dropped(aws: LocalSQS) -> None:
    bucket = s3_bucket()
    wal = S3Log(bucket, "orders/wal")
    assert wal.prepare() is None  # the bucket exists and honours conditional writes
    first = slot(1, 0, "a", "b")
    assert wal.write(first) is first
    assert wal.write(slot(1, 0, "c")) == first  # the object exists: the winner comes back
    wal.write(slot(1, 1))
    wal.write(slot(2, 0, "d"))
    assert wal.read(1, 0) == first and wal.read(1, 2) is None
    assert wal.names() == [(1, 0), (1, 1), (2, 0)]
    assert [s.key for s in wal.find([(1, 1), (1, 2), (2, 0)])] == [(1, 1), (2, 0)]
    wal.drop([(1, 0), (1, 1), (1, 2)])
    assert s3_keys(bucket) == ["orders/wal/000000000002/part-00000.json"]


def test_on_s3_racing_writers_of_one_slot_have_one_winner(aws: LocalSQS) -> None:
    bucket = s3_bucket()
    start = threading.Barrier(8)
    recorded: list[Slot] = []

    def write(n: int) -> None:
        wal = S3Log(bucket, "wal")  # a client each, as executors have
        start.wait()
        recorded.append(wal.write(slot(3, 0, f"m{n}")))
        wal.close()

    threads = [threading.Thread(target=write, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(recorded) == 8
    assert len({tuple(m.message_id for m in s.messages) for s in recorded}) == 1  # one winner


def test_a_bucket_that_does_not_exist_is_refused(aws: LocalSQS) -> None:
    with pytest.raises(LogUnusable, match="names a bucket that does not exist"):
        S3Log("no-such-bucket-here", "wal").prepare()


@pytest.mark.parametrize(
    ("path", "sentence"),
    [
        ("wal", "a relative path, which each executor would resolve in its own working folder"),
        ("./x/wal", "a relative path"),
        ("s3a://b/wal", "scheme 's3a' it cannot use (the log goes through S3's own API"),
        ("hdfs://nn/wal", "scheme 'hdfs' it cannot use"),
        ("s3://No_Bucket/wal", "with an S3 bucket name"),
    ],
)
def test_a_place_the_log_cannot_use_is_refused_in_one_sentence(path: str, sentence: str) -> None:
    with pytest.raises(LogUnusable, match=re.escape(sentence)):
        parse_place(path)
    with pytest.raises(SQSOptionError, match=re.escape(sentence)):
        SourceOptions.parse({"queue": "q", "walPath": path})


def test_places_the_log_can_use() -> None:
    assert parse_place("s3://orders-bucket/q1/wal/") == ("s3", "orders-bucket", "q1/wal")
    assert parse_place("file:///mnt/efs/wal") == ("local", "/mnt/efs/wal", "")
    assert isinstance(open_log("/mnt/efs/wal"), LocalLog)


def test_a_task_refuses_a_local_folder_without_the_drivers_marker(tmp_path: Path) -> None:
    # On a cluster, a folder on each machine's own disk: the executor's has no marker.
    marker = LocalLog(str(tmp_path / "driver")).prepare()
    LocalLog(str(tmp_path / "driver")).confirm(marker)  # the driver's folder: accepted
    with pytest.raises(LogUnusable, match="the marker the driver left there at start is missing"):
        LocalLog(str(tmp_path / "executor")).confirm(marker)


def test_storage_that_ignores_conditional_writes_is_refused(
    aws: LocalSQS, monkeypatch: pytest.MonkeyPatch
) -> None:
    # S3 before August 2024, and some S3-compatible stores: If-None-Match is not honoured.
    bucket = s3_bucket()
    server = _IgnoringConditions(aws.endpoint_url)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with monkeypatch.context() as patched:
            patched.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{server.server_address[1]}")
            with pytest.raises(LogUnusable, match="does not honour conditional writes"):
                S3Log(bucket, "wal").prepare()
    finally:
        server.shutdown()
        server.server_close()
    assert s3_keys(bucket) == []  # the probe is gone


class _IgnoringConditions(ThreadingHTTPServer):
    """Forwards every request to moto's server without its If-None-Match header."""

    daemon_threads = True

    def __init__(self, upstream: str) -> None:
        target = urlsplit(upstream)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def forward(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                body = self.rfile.read(length) if length else b""
                headers = {
                    k: v
                    for k, v in self.headers.items()
                    if k.lower() not in ("if-none-match", "connection")
                }
                connection = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
                try:
                    connection.request(self.command, self.path, body, headers)
                    answer = connection.getresponse()
                    data = answer.read()
                finally:
                    connection.close()
                self.send_response_only(answer.status)
                for name, value in answer.getheaders():
                    if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = forward

        super().__init__(("127.0.0.1", 0), Handler)


def test_racing_writers_of_one_slot_have_one_winner(tmp_path: Path) -> None:
    wal = LocalLog(str(tmp_path))
    start = threading.Barrier(8)
    recorded: list[Slot] = []

    def write(n: int) -> None:
        start.wait()
        recorded.append(wal.write(slot(3, 0, f"m{n}")))

    threads = [threading.Thread(target=write, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({tuple(m.message_id for m in s.messages) for s in recorded}) == 1  # one winner


def test_committed_batches_are_forgotten(tmp_path: Path) -> None:
    wal = LocalLog(str(tmp_path))
    for seq in (1, 2, 3):
        wal.write(slot(seq, 0, f"m{seq}"))
    wal.drop_through(2)
    assert [(s.seq, s.partition) for s in wal.slots()] == [(3, 0)]


def test_a_file_that_cannot_be_read_is_reported_once_and_the_others_are_read(
    tmp_path: Path,
) -> None:
    wal = LocalLog(str(tmp_path))
    wal.write(slot(2, 0, "m"))
    (tmp_path / "000000000001").mkdir()
    (tmp_path / "000000000001" / "part-00000.json").write_text("{not json")
    (tmp_path / "000000000001" / "part-0a.json").write_text("not a slot's name")
    with capture_logs() as logs:
        assert [(s.seq, s.partition) for s in wal.slots()] == [(2, 0)]
        assert [(s.seq, s.partition) for s in wal.slots()] == [(2, 0)]
    [line] = logs
    assert line["log_level"] == "error" and line["path"].endswith("part-00000.json")


def test_the_driver_reads_only_the_slots_it_does_not_know(tmp_path: Path) -> None:
    wal = LocalLog(str(tmp_path))
    for seq, partition in [(1, 0), (1, 1), (2, 0)]:
        wal.write(slot(seq, partition, f"m{seq}-{partition}"))
    wal.path(1, 0).write_text("not read")  # a known slot's file is not parsed again
    assert [(s.seq, s.partition) for s in wal.slots(skip={(1, 0)})] == [(1, 1), (2, 0)]


@pytest.mark.parametrize(
    ("options", "sentence"),
    [
        ({"walPath": "/w"}, "the sqs option 'queue' is missing"),
        (
            {"queue": "q", "walPath": "/w", "numPartitions": "0"},
            "'numPartitions' must be from 1 to 1000; got 0",
        ),
        ({"queue": "q", "walPath": "/w", "waitTimeSeconds": "x"}, "must be a whole number"),
        (
            {"queue": "q", "walPath": "/w", "receivesInFlight": "0"},
            "'receivesInFlight' must be from 1 to 16; got 0",
        ),
        (
            {"queue": "q", "walPath": "/w", "visibilityTimeout": "30", "waitTimeSeconds": "10"},
            "must be at most a sixth of 'visibilityTimeout'",
        ),
    ],
)
def test_options_name_what_is_wrong(options: dict[str, str], sentence: str) -> None:
    with pytest.raises(SQSOptionError, match=sentence.replace("(", r"\(")):
        SourceOptions.parse(options)


def test_options_ignore_case_as_spark_does() -> None:
    parsed = SourceOptions.parse({"QUEUE": "q", "walpath": "/w", "NUMPARTITIONS": "3"})
    assert (parsed.queue, parsed.wal_path, parsed.num_partitions) == ("q", "/w", 3)


def test_a_failed_delete_of_a_committed_message_says_what_is_known() -> None:
    memory = MemorySQS()
    memory.create_queue("orders")
    keeper = LeaseKeeper(memory.transport("orders"), FakeClock(), SourceLog("spark_sink"))
    refused, lost = keeper.add(slot(1, 0, "a", "b").messages, 0.0, 30)
    lost.disowned = True  # SQS said the handle no longer owns it: it may have deleted it
    with capture_logs() as logs:
        SourceLog("spark_sink").delete_failed(refused.message, "AccessDenied", False)
        SourceLog("spark_sink").delete_failed(lost.message, "receipt handle lost", False)
    assert [(line["log_level"], line["event"].split(":")[0]) for line in logs] == [
        ("error", "delete of a committed message failed"),  # it will certainly come again
        ("warning", "delete of a committed message not confirmed"),
    ]
    assert all("the pipeline drops it by its message_id" in line["event"] for line in logs)


def test_each_lease_is_dated_from_its_own_receive() -> None:
    # The driver keeps leases of hundreds of messages a partition, received over a
    # third of the visibility timeout: those received later are renewed later.
    messages = slot(1, 0, "a", "b", "c").messages
    recorded = Slot(1, 0, 100.0, messages, (100.0, 100.4, 100.0))
    again = Slot.loads(recorded.dumps())
    assert again == recorded
    assert [(began, [e.message_id for e in group]) for began, group in again.leases()] == [
        (100.0, ["a", "c"]),
        (100.4, ["b"]),
    ]
    assert [b for b, _ in Slot(1, 0, 100.0, messages).leases()] == [100.0]  # an older slot
