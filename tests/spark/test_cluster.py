"""The documented pipeline on a Spark standalone cluster: executors in JVMs of their own,
sharing no folder with the driver, the write-ahead log on (moto's) S3.

The cluster (``cluster.py``) starts once per session; each query's driver runs in a
process of its own (``cluster_driver.py``). The wheel has no hadoop-aws jar, so the
checkpoint and the output stay on this machine's disk; the log goes through S3's API.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from sqsworker.local import LocalSQS
from sqsworker.transports import Transport, send_all

from ..conftest import wait_until
from .cluster import Driver, StandaloneCluster
from .conftest import make_queue, s3_bucket, s3_keys

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

MESSAGES = 3000
# Short leases, so that messages a killed executor had received come back soon.
OPTIONS = {
    "numPartitions": "2",
    "maxMessagesPerBatch": "1000",
    "visibilityTimeout": "6",
    "waitTimeSeconds": "1",
}


def start(
    cluster: StandaloneCluster, aws: LocalSQS, queue: Transport, wal: str, folder: Path
) -> Driver:
    config: dict[str, Any] = {
        "master": cluster.url,
        "queue": queue.info.url,
        "wal": wal,
        "checkpoint": str(folder / "checkpoint"),
        "output": str(folder / "out"),
        "options": OPTIONS,
    }
    return Driver(folder / "driver.log", config, aws.env())


def assert_drained_once(
    spark: SparkSession, queue: Transport, bucket: str, folder: Path, sent: list[str]
) -> None:
    rows = spark.read.parquet(str(folder / "out")).select("message_id").collect()
    ids = [row.message_id for row in rows]
    assert len(ids) == len(sent)  # none twice
    assert set(ids) == set(sent)  # none lost
    assert queue.counts().total == 0
    assert s3_keys(bucket, "orders/wal/") == []  # every batch's slots removed


@pytest.fixture
def orders(aws: LocalSQS) -> tuple[Transport, list[str]]:
    queue = make_queue(aws, "orders")
    return queue, send_all(queue, [f'{{"order": {i}}}' for i in range(MESSAGES)])


def test_a_cluster_drains_the_queue_each_message_once(
    cluster: StandaloneCluster,
    aws: LocalSQS,
    spark: SparkSession,
    tmp_path: Path,
    orders: tuple[Transport, list[str]],
) -> None:
    queue, sent = orders
    bucket = s3_bucket()
    driver = start(cluster, aws, queue, f"s3://{bucket}/orders/wal", tmp_path)
    assert driver.wait(240) == 0, driver.output()[-3000:]
    assert_drained_once(spark, queue, bucket, tmp_path, sent)
    # The executors ran in both workers' JVMs, in folders of their own.
    assert all(any((cluster.root / f"worker-{n}").iterdir()) for n in (0, 1))


def test_an_executor_killed_mid_query_loses_and_repeats_nothing(
    cluster: StandaloneCluster,
    aws: LocalSQS,
    spark: SparkSession,
    tmp_path: Path,
    orders: tuple[Transport, list[str]],
) -> None:
    queue, sent = orders
    bucket = s3_bucket()
    driver = start(cluster, aws, queue, f"s3://{bucket}/orders/wal", tmp_path)
    wait_until(lambda: driver.batches_done() >= 1, timeout=120, what="a first batch")
    victims = cluster.executors()
    assert victims and queue.counts().total > 0  # mid-query
    os.kill(victims[0], signal.SIGKILL)  # the JVM gets no chance to clean up
    assert driver.wait(240) == 0, driver.output()[-3000:]
    assert_drained_once(spark, queue, bucket, tmp_path, sent)


def test_a_driver_killed_mid_query_restarts_from_its_checkpoint(
    cluster: StandaloneCluster,
    aws: LocalSQS,
    spark: SparkSession,
    tmp_path: Path,
    orders: tuple[Transport, list[str]],
) -> None:
    queue, sent = orders
    bucket = s3_bucket()
    wal = f"s3://{bucket}/orders/wal"
    first = start(cluster, aws, queue, wal, tmp_path)
    wait_until(lambda: first.batches_done() >= 1, timeout=120, what="a first batch")
    first.kill()
    assert queue.counts().total > 0  # mid-query
    second = start(cluster, aws, queue, wal, tmp_path)
    assert second.wait(240) == 0, second.output()[-3000:]
    assert_drained_once(spark, queue, bucket, tmp_path, sent)


def test_a_relative_wal_path_on_a_cluster_is_refused_at_start(
    cluster: StandaloneCluster, aws: LocalSQS, tmp_path: Path
) -> None:
    # Each executor would resolve it in its own work folder: a log the driver never sees.
    queue = make_queue(aws, "orders")
    send_all(queue, ['{"order": 1}'])
    driver = start(cluster, aws, queue, "orders/wal", tmp_path)
    assert driver.wait(120) != 0
    assert "a relative path, which each executor would resolve in its own working" in (
        driver.output()
    )
