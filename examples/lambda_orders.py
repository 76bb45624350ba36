"""A Lambda SQS handler written with AWS Lambda Powertools, as it runs on Lambda.

Nothing here knows of sqsworker: ``sqsworker run examples.lambda_orders:lambda_handler
--lambda`` gives it Lambda's SQS event and context for each batch and reads its
partial batch response (ReportBatchItemFailures). An order with a negative amount
fails; the others are written, one line each, to the file $ORDERS_LEDGER.
"""

from __future__ import annotations

import os
from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.batch import (
    BatchProcessor,
    EventType,
    process_partial_response,
)
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

processor = BatchProcessor(event_type=EventType.SQS)  # module-level, reused between batches
logger = Logger(service="orders")


def record_handler(record: SQSRecord) -> None:
    order = record.json_body
    if order["amount"] < 0:
        raise ValueError(f"order {order['id']} has a negative amount")
    with open(os.environ["ORDERS_LEDGER"], "a") as ledger:
        ledger.write(
            f"{order['id']} {record.message_id} {record.attributes.approximate_receive_count}\n"
        )
    logger.info("order stored", order=order["id"])


@logger.inject_lambda_context
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return process_partial_response(
        event=event, record_handler=record_handler, processor=processor, context=context
    )
