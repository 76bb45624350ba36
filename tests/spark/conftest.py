"""A real local SparkSession (local[2]) and moto's server, shared by the Spark tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from sqsworker.local import LocalSQS
from sqsworker.transports import Transport
from sqsworker.transports.sqs import SQSTransport

from ..conftest import unique

pytest.importorskip("pyspark")

from pyspark.sql import SparkSession

from spark_sink import SQSDataSource

from .cluster import StandaloneCluster, worker_python


@pytest.fixture(scope="session")
def spark(local_sqs: LocalSQS) -> Iterator[SparkSession]:
    """One session for every Spark test: it takes seconds to start.

    The JVM, and the Python workers it starts, keep the environment it was started
    with: moto's endpoint and credentials, as a deployment would have its own.
    """
    saved = dict(os.environ)
    os.environ.update(local_sqs.env())
    os.environ["PYSPARK_PYTHON"] = worker_python()  # or workers may run another Python
    try:
        session = (
            SparkSession.builder.master("local[2]")
            .appName("spark_sink tests")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .getOrCreate()
        )
    finally:
        os.environ.clear()
        os.environ.update(saved)
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(SQSDataSource)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """A Spark standalone master and two one-core workers, once per session."""
    running = StandaloneCluster(tmp_path_factory.mktemp("cluster")).start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def aws(local_sqs: LocalSQS, monkeypatch: pytest.MonkeyPatch) -> LocalSQS:
    """This process's own boto3 clients point at moto too."""
    for key, value in local_sqs.env().items():
        monkeypatch.setenv(key, value)
    return local_sqs


def make_queue(server: LocalSQS, name: str, **attributes: str) -> Transport:
    queue = unique(name.removesuffix(".fifo")) + (".fifo" if name.endswith(".fifo") else "")
    server.create_queue(queue, max_receive_count=None, **attributes)
    return SQSTransport.connect(queue, endpoint_url=server.endpoint_url, region="us-east-1")


def drain(queue: Transport) -> list[str]:
    """Receive and delete everything visible; the bodies, in order of receipt."""
    bodies = []
    while batch := queue.receive(10, 0, 30):
        bodies += [m.body for m in batch]
        queue.delete_batch([(str(i), m.receipt_handle) for i, m in enumerate(batch)])
    return bodies


def files(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())


def slot_files(path: Path) -> list[str]:
    """The write-ahead log's slots in a local ``walPath`` (its driver markers left out)."""
    return [name for name in files(path) if not name.startswith("_drivers/")]


def s3_bucket() -> str:
    """A new bucket on moto's S3 (this process's clients point there: the aws fixture)."""
    import boto3

    bucket = unique("wal")
    client = boto3.client("s3")
    client.create_bucket(Bucket=bucket)
    client.close()
    return bucket


def s3_keys(bucket: str, prefix: str = "") -> list[str]:
    import boto3

    client = boto3.client("s3")
    try:
        answer = client.list_objects_v2(Bucket=bucket, Prefix=prefix)
        return sorted(item["Key"] for item in answer.get("Contents", []))
    finally:
        client.close()
