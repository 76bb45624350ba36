"""dramatiq with dramatiq_sqs's broker, as its README sets it up.

``dramatiq bench.peer_apps.dramatiq_app`` consumes; ``job.send(ID)`` produces (dramatiq's
envelope: a base64 JSON message with the actor's name and arguments).
"""

from __future__ import annotations

import os

import dramatiq
from dramatiq_sqs import SQSBroker

from . import work

QUEUE = os.environ["PEER_QUEUE"]

# Without visibility_timeout the broker receives with 12 hours; the bench sets the same
# timeout for every consumer.
broker = SQSBroker(visibility_timeout=work.visibility())
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name=QUEUE)
def job(job_id: str) -> None:
    work.run(job_id)
