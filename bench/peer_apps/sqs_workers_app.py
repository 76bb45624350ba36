"""Doist's sqs-workers, as its README sets it up: ``python -m bench.peer_apps.sqs_workers_app``.

``job.delay(job_id=ID)`` produces (the arguments pickled, the job's name in a message
attribute). The queue's own visibility timeout applies: sqs-workers sets none.
"""

from __future__ import annotations

import os

from sqs_workers import SQSEnv

from . import work

QUEUE = os.environ["PEER_QUEUE"]

sqs = SQSEnv()
queue = sqs.queue(QUEUE)


@queue.processor("job")
def job(job_id: str) -> None:
    work.run(job_id)


if __name__ == "__main__":
    queue.process_queue(wait_second=1)
