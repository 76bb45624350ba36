"""Spark Structured Streaming over SQS, with sqsworker's queue semantics.

    from spark_sink import SQSDataSource
    spark.dataSource.register(SQSDataSource)
    orders = spark.readStream.format("sqs").option("queue", "orders") \\
        .option("walPath", "s3://my-bucket/orders/wal").load()
    orders.withWatermark("received_at", "1 hour") \\
        .dropDuplicatesWithinWatermark(["message_id"]) \\
        .writeStream.format("parquet").option("path", "s3a://my-bucket/orders/out") \\
        .option("checkpointLocation", "s3a://my-bucket/orders/checkpoint").start()

See docs/spark.md.
"""

from .options import SQSOptionError
from .sink import SQSSendError
from .source import SCHEMA, SQSDataSource

__all__ = ["SCHEMA", "SQSDataSource", "SQSOptionError", "SQSSendError"]
