"""The documented pipeline on a Spark standalone cluster: executors in JVMs of their own,
sharing no folder with the driver, the write-ahead log on (moto's) S3.

The cluster (``cluster.py``) starts once per session; each query's driver runs in a
process of its own (``cluster_driver.py``). The wheel has no hadoop-aws jar, so the
checkpoint and the output stay on this machine's disk; the log goes through S3's API.

A driver on the cluster costs a SparkSession, executors and a first batch: the
scenarios that can share one query do. One query drains 3,000 messages with an
executor JVM killed after its first batch (after its driver had a relative
``walPath`` refused in the same session); another has its driver killed after its
first batch and restarted from its checkpoint. Each scenario's assertions are a test
of their own.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from sqsworker.local import LocalSQS
from sqsworker.transports import Transport, send_all

from ..conftest import wait_until
from .cluster import Driver, StandaloneCluster
from .conftest import make_queue, s3_bucket, s3_keys

# A module fixture's query runs in the setup of its first test: a whole scenario's time.
pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

MESSAGES = 3000
# Short leases, so that messages a killed executor had received come back soon.
OPTIONS = {
    "numPartitions": "2",
    "maxMessagesPerBatch": "1000",
    "visibilityTimeout": "6",
    "waitTimeSeconds": "1",
}
RELATIVE = "a relative path, which each executor would resolve in its own working"


@dataclass
class Run:
    """One scenario's query on the cluster, run to its end."""

    queue: Transport
    sent: list[str]
    bucket: str
    folder: Path
    exit_code: int
    output: str  # its drivers' output
    mid_query: bool  # the queue still held messages when the fault came
    killed: list[int]  # the pids SIGKILLed
    refused_queue: Transport | None = None  # the queue of a query refused at start


@pytest.fixture(scope="module")
def moto(local_sqs: LocalSQS) -> Iterator[LocalSQS]:
    """This process's own boto3 clients point at moto, for the module's queries."""
    with pytest.MonkeyPatch.context() as patch:
        for key, value in local_sqs.env().items():
            patch.setenv(key, value)
        yield local_sqs


def start(
    cluster: StandaloneCluster,
    aws: LocalSQS,
    queue: Transport,
    wal: str,
    folder: Path,
    **more: Any,
) -> Driver:
    config: dict[str, Any] = {
        "master": cluster.url,
        "queue": queue.info.url,
        "wal": wal,
        "checkpoint": str(folder / "checkpoint"),
        "output": str(folder / "out"),
        "options": OPTIONS,
        **more,
    }
    return Driver(folder / "driver.log", config, aws.env())


def orders(aws: LocalSQS) -> tuple[Transport, list[str]]:
    queue = make_queue(aws, "orders")
    return queue, send_all(queue, [f'{{"order": {i}}}' for i in range(MESSAGES)])


@pytest.fixture(scope="module")
def executor_killed(
    cluster: StandaloneCluster, moto: LocalSQS, tmp_path_factory: pytest.TempPathFactory
) -> Run:
    """3,000 messages, one executor JVM SIGKILLed after the first batch; before the
    query, the same driver has a relative walPath refused on another queue."""
    folder = tmp_path_factory.mktemp("executor-killed")
    queue, sent = orders(moto)
    other = make_queue(moto, "orders")
    send_all(other, ['{"order": 1}'])
    bucket = s3_bucket()
    wal = f"s3://{bucket}/orders/wal"
    refused = {"queue": other.info.url, "wal": "orders/wal"}
    with start(cluster, moto, queue, wal, folder, refused=refused) as driver:
        wait_until(driver.first_batch_done, timeout=300, what="a first batch")
        victims = cluster.executors()[:1]
        mid_query = queue.counts().total > 0
        for victim in victims:
            os.kill(victim, signal.SIGKILL)  # the JVM gets no chance to clean up
        code = driver.wait(300)
    return Run(queue, sent, bucket, folder, code, driver.output(), mid_query, victims, other)


@pytest.fixture(scope="module")
def driver_killed(
    cluster: StandaloneCluster, moto: LocalSQS, tmp_path_factory: pytest.TempPathFactory
) -> Run:
    """3,000 messages, the driver SIGKILLed after the first batch and started again on its
    checkpoint."""
    folder = tmp_path_factory.mktemp("driver-killed")
    queue, sent = orders(moto)
    bucket = s3_bucket()
    wal = f"s3://{bucket}/orders/wal"
    with start(cluster, moto, queue, wal, folder) as first:
        wait_until(first.first_batch_done, timeout=300, what="a first batch")
        first.kill()
    mid_query = queue.counts().total > 0
    with start(cluster, moto, queue, wal, folder) as second:
        code = second.wait(300)
    return Run(queue, sent, bucket, folder, code, second.output(), mid_query, [first.process.pid])


def assert_drained_once(spark: SparkSession, run: Run) -> None:
    assert run.exit_code == 0, run.output[-3000:]
    rows = spark.read.parquet(str(run.folder / "out")).select("message_id").collect()
    ids = [row.message_id for row in rows]
    assert len(ids) == len(run.sent)  # none twice
    assert set(ids) == set(run.sent)  # none lost
    assert run.queue.counts().total == 0
    assert s3_keys(run.bucket, "orders/wal/") == []  # every batch's slots removed


def test_a_cluster_drains_the_queue_each_message_once(
    cluster: StandaloneCluster, spark: SparkSession, executor_killed: Run
) -> None:
    assert_drained_once(spark, executor_killed)
    # The executors ran in both workers' JVMs, in folders of their own.
    assert all(any((cluster.root / f"worker-{n}").iterdir()) for n in (0, 1))


def test_an_executor_killed_mid_query_loses_and_repeats_nothing(
    spark: SparkSession, executor_killed: Run
) -> None:
    assert executor_killed.killed and executor_killed.mid_query
    assert_drained_once(spark, executor_killed)  # by the same driver, which exited 0


def test_a_driver_killed_mid_query_restarts_from_its_checkpoint(
    spark: SparkSession, driver_killed: Run
) -> None:
    assert driver_killed.mid_query
    assert_drained_once(spark, driver_killed)


def test_a_relative_wal_path_on_a_cluster_is_refused_at_start(executor_killed: Run) -> None:
    # Each executor would resolve it in its own work folder: a log the driver never sees.
    # Said before the pipeline proper started, in the same session.
    _, said, rest = executor_killed.output.partition("\nREFUSED ")
    assert said and RELATIVE in rest.partition("BATCH DONE")[0]
    assert executor_killed.refused_queue is not None
    assert executor_killed.refused_queue.counts().visible == 1  # nothing was received
