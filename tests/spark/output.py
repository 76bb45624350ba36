"""A test sink on local disk: ``foreachBatch(write_once(path))``, each message once.

The tests that inject failures into a batch's sink (``foreachBatch``) write through
this. It reads and writes with ``pathlib``: local disk only, so it is no part of
spark_sink's API; a pipeline uses Spark's file sink after
``dropDuplicatesWithinWatermark(["message_id"])`` (docs/spark.md).

The source delivers at least once: a restart replays a batch, and a message
whose lease lapsed may come again in a later batch. ``write_once`` writes each
message to Parquet once, keyed by ``message_id``:

- duplicates within a batch are dropped;
- messages already in a committed batch of the output are dropped;
- each batch goes to its own folder, ``batch_id=<n>``, and counts only once its
  marker ``_committed/<n>`` exists. A replayed batch overwrites its own folder
  (a half-written attempt included) with the same rows, and a batch whose marker
  exists is skipped.

Read the output with ``read_output(spark, path)``, which reads committed batches
only. The check against earlier batches reads their ``message_id`` column: fine
for millions of rows; beyond, partition the output by date and look back only
over the window in which SQS can redeliver (the queue's retention period).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

MARKERS = "_committed"


def committed_batches(path: str) -> list[str]:
    markers = Path(path) / MARKERS
    if not markers.is_dir():
        return []
    return [str(Path(path) / f"batch_id={m.name}") for m in sorted(markers.iterdir())]


def read_output(spark: SparkSession, path: str) -> DataFrame | None:
    """The committed rows of a ``write_once`` output; None while there are none."""
    batches = committed_batches(path)
    if not batches:
        return None
    return spark.read.option("basePath", path).parquet(*batches)


def write_once(path: str, key: str = "message_id") -> Callable[[DataFrame, int], None]:
    """A ``foreachBatch`` function writing each ``key`` to Parquet under ``path`` once."""

    def write(batch: DataFrame, batch_id: int) -> None:
        marker = Path(path) / MARKERS / str(batch_id)
        if marker.exists():
            return  # a replay of a batch already written
        rows = batch.dropDuplicates([key])
        earlier = read_output(batch.sparkSession, path)
        if earlier is not None:
            rows = rows.join(earlier.select(key), key, "left_anti")
        rows.write.mode("overwrite").parquet(str(Path(path) / f"batch_id={batch_id}"))
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()

    return write
