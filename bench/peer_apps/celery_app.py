"""Celery on SQS (kombu's SQS transport), as Celery's "Using Amazon SQS" page sets it up.

``celery -A bench.peer_apps.celery_app worker`` consumes; ``job.delay(ID)`` produces
(Celery's envelope: a base64 JSON message with the task's name and arguments).
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from celery import Celery

from . import work

QUEUE = os.environ["PEER_QUEUE"]
_endpoint = urlsplit(os.environ["AWS_ENDPOINT_URL_SQS"])
_key = os.environ["AWS_ACCESS_KEY_ID"]
_secret = os.environ["AWS_SECRET_ACCESS_KEY"]

# kombu takes the endpoint from the broker URL's host (plain HTTP with is_secure False).
app = Celery("peers", broker=f"sqs://{_key}:{_secret}@{_endpoint.netloc}")
app.conf.broker_transport_options = {
    "region": os.environ.get("AWS_REGION", "us-east-1"),
    "is_secure": _endpoint.scheme == "https",
    "visibility_timeout": work.visibility(),
    "predefined_queues": {
        QUEUE: {
            "url": os.environ["PEER_QUEUE_URL"],
            "access_key_id": _key,
            "secret_access_key": _secret,
        }
    },
}
if "PEER_CELERY_POLLING_INTERVAL" in os.environ:  # kombu's default: 1 s
    app.conf.broker_transport_options["polling_interval"] = float(
        os.environ["PEER_CELERY_POLLING_INTERVAL"]
    )
app.conf.task_default_queue = QUEUE
# Celery deletes (acks) a message as its task starts, unless acks_late.
app.conf.task_acks_late = "PEER_CELERY_ACKS_LATE" in os.environ
app.conf.worker_hijack_root_logger = False


@app.task(name="job")
def job(job_id: str) -> None:
    work.run(job_id)
