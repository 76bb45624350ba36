"""Spark Structured Streaming over SQS, with sqsworker's queue semantics.

    from spark_sink import SQSDataSource, write_once
    spark.dataSource.register(SQSDataSource)
    stream = spark.readStream.format("sqs").option("queue", "orders") \\
        .option("walPath", "/shared/orders/wal").load()
    stream.writeStream.foreachBatch(write_once("/shared/orders/out")) \\
        .option("checkpointLocation", "/shared/orders/checkpoint").start()

See docs/spark.md.
"""

from .options import SQSOptionError
from .output import read_output, write_once
from .sink import SQSSendError
from .source import SCHEMA, SQSDataSource

__all__ = ["SCHEMA", "SQSDataSource", "SQSOptionError", "SQSSendError", "read_output", "write_once"]
