"""An embedded SQS-compatible endpoint (moto's server) for development, demos and tests."""

from __future__ import annotations

import json
import logging
from types import TracebackType
from typing import Any

import boto3

from .errors import ConfigError

REGION = "us-east-1"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local"}


class LocalSQS:
    """moto's SQS server on ``host:port`` (port 0 picks a free one), started and stopped here."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        try:
            from moto.server import ThreadedMotoServer
        except ImportError:
            raise ConfigError(
                "the embedded SQS needs moto's server: install it with "
                "pip install 'sqsworker[local]'"
            ) from None
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
        self._server = ThreadedMotoServer(ip_address=host, port=port, verbose=False)
        self.host = host
        self.port = port
        self.endpoint_url = ""

    def start(self) -> LocalSQS:
        self._server.start()
        _, port = self._server.get_host_and_port()
        self.port = port
        self.endpoint_url = f"http://{self.host}:{port}"
        return self

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> LocalSQS:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def env(self) -> dict[str, str]:
        """The environment a worker or boto3 client needs to reach this endpoint.

        moto's server also speaks DynamoDB, so a ``dynamodb://`` idempotency store works here.
        """
        return {
            "AWS_ENDPOINT_URL_SQS": self.endpoint_url,
            "AWS_ENDPOINT_URL_DYNAMODB": self.endpoint_url,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_REGION": REGION,
            **CREDENTIALS,
        }

    def client(self) -> Any:
        return boto3.client(
            "sqs",
            endpoint_url=self.endpoint_url,
            region_name=REGION,
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        )

    def create_queue(
        self,
        name: str,
        *,
        max_receive_count: int | None = 3,
        visibility_timeout: int = 30,
        **attributes: str,
    ) -> str:
        """Create ``name`` and, unless ``max_receive_count`` is None, its ``-dlq`` with a redrive
        policy. Returns the queue URL."""
        client = self.client()
        fifo = name.endswith(".fifo")
        base = {"VisibilityTimeout": str(visibility_timeout), **attributes}
        if fifo:
            base["FifoQueue"] = "true"
        if max_receive_count is not None:
            dlq_name = name.removesuffix(".fifo") + "-dlq" + (".fifo" if fifo else "")
            dlq_url = client.create_queue(
                QueueName=dlq_name, Attributes={"FifoQueue": "true"} if fifo else {}
            )["QueueUrl"]
            arn = client.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])[
                "Attributes"
            ]["QueueArn"]
            base["RedrivePolicy"] = json.dumps(
                {"deadLetterTargetArn": arn, "maxReceiveCount": max_receive_count}
            )
        return str(client.create_queue(QueueName=name, Attributes=base)["QueueUrl"])
