"""The consumers sqsworker is compared with, as their docs show them (``bench.peers`` runs them).

These modules run in ``bench/.venv-peers`` (``make bench-peers`` builds it from
``bench/peers-requirements.txt``), never in sqsworker's environment: they import Celery,
dramatiq and sqs-workers, and nothing of sqsworker. Each reads the same environment:

- ``AWS_ENDPOINT_URL_SQS``, ``AWS_REGION`` and the credentials: the endpoint under test;
- ``PEER_QUEUE`` and ``PEER_QUEUE_URL``: the queue;
- ``PEER_VISIBILITY``: the visibility timeout a framework is given, where it takes one;
- ``PEER_HANDLER``: ``noop``, or ``sleep:SECONDS`` to write "start ID PID" and "done ID PID"
  lines to ``$LEDGER`` around a sleep (``work.run``).
"""
