"""A bare boto3 loop, one thread: receive 10, run each, delete the 10 in one batch.

The floor of any boto3 consumer's CPU a message: ``python -m bench.peer_apps.boto3_loop``.
Plain bodies (the message's body is the job's ID).
"""

from __future__ import annotations

import os

import boto3

from . import work


def main() -> None:
    client = boto3.client("sqs")
    url = os.environ["PEER_QUEUE_URL"]
    while True:
        messages = client.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=1,
            VisibilityTimeout=work.visibility(),
        ).get("Messages", [])
        for message in messages:
            work.run(message["Body"])
        if messages:
            client.delete_message_batch(
                QueueUrl=url,
                Entries=[
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                    for i, m in enumerate(messages)
                ],
            )


if __name__ == "__main__":
    main()
