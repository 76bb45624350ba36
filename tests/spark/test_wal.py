"""The write-ahead log, the options and the driver's log lines: no Spark needed."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from spark_sink.options import SourceOptions, SQSOptionError
from spark_sink.source import _SourceLog
from spark_sink.wal import Slot, WriteAheadLog
from sqsworker.clock import FakeClock
from sqsworker.lease import LeaseKeeper
from sqsworker.transports import Envelope
from sqsworker.transports.memory import MemorySQS


def slot(seq: int, partition: int, *ids: str) -> Slot:
    messages = tuple(
        Envelope(i, f"handle-{i}", f"body {i}", {"ApproximateReceiveCount": "1"}) for i in ids
    )
    return Slot(seq, partition, 1_700_000_000.0, messages)


def test_a_slot_is_recorded_once_and_read_back_whole(tmp_path: Path) -> None:
    wal = WriteAheadLog(str(tmp_path))
    first = slot(1, 0, "a", "b")
    assert wal.write(first) is first
    assert wal.write(slot(1, 0, "c")) == first  # the place is taken: the winner comes back
    assert wal.read(1, 0) == first
    assert wal.read(1, 1) is None
    assert [p.name for p in (tmp_path / "000000000001").iterdir()] == ["part-00000.json"]


def test_racing_writers_of_one_slot_have_one_winner(tmp_path: Path) -> None:
    wal = WriteAheadLog(str(tmp_path))
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
    wal = WriteAheadLog(str(tmp_path))
    for seq in (1, 2, 3):
        wal.write(slot(seq, 0, f"m{seq}"))
    wal.drop_through(2)
    assert [(s.seq, s.partition) for s in wal.slots()] == [(3, 0)]


def test_a_file_that_cannot_be_read_is_reported_once_and_the_others_are_read(
    tmp_path: Path,
) -> None:
    wal = WriteAheadLog(str(tmp_path))
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
    wal = WriteAheadLog(str(tmp_path))
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
    keeper = LeaseKeeper(memory.transport("orders"), FakeClock(), _SourceLog("spark_sink"))
    refused, lost = keeper.add(slot(1, 0, "a", "b").messages, 0.0, 30)
    lost.disowned = True  # SQS said the handle no longer owns it: it may have deleted it
    with capture_logs() as logs:
        _SourceLog("spark_sink").delete_failed(refused.message, "AccessDenied", False)
        _SourceLog("spark_sink").delete_failed(lost.message, "receipt handle lost", False)
    assert [(line["log_level"], line["event"].split(":")[0]) for line in logs] == [
        ("error", "delete of a committed message failed"),  # it will certainly come again
        ("warning", "delete of a committed message not confirmed"),
    ]
    assert all("write_once drops it" in line["event"] for line in logs)
