"""Operating queues: what ``sqsworker queues``, ``send``, ``peek``, ``redrive`` and
``purge`` do, without the terminal (``commands/`` draws the tables and progress bars).

- ``queues.py``: the queues of an account: list them with their depths, create one
  with its dead-letter queue, purge one;
- ``sending.py``: the messages to send, each checked as SQS would check it, in batches;
- ``peeking.py``: a look at messages that hands them back at once, and why each one of
  a dead-letter queue is there;
- ``redrive.py``: a dead-letter queue's messages moved back, by SQS or here.

Every SQS call goes through the boto3 transport, so these commands follow the same
credential, region and endpoint rules as ``sqsworker run``, and their errors read
the same. Input that cannot work raises ``ConfigError`` before anything is sent,
received or deleted.
"""

from __future__ import annotations

from .peeking import dead_letter_reasons, hand_back, peek, refuse_peek
from .queues import (
    Created,
    Queues,
    QueueStatus,
    check_queue_name,
    dead_letter_name,
    default_max_receives,
)
from .redrive import MoveReport, Redrive
from .sending import SendReport, batches, outgoing, parse_attribute, send

__all__ = [
    "Created",
    "MoveReport",
    "QueueStatus",
    "Queues",
    "Redrive",
    "SendReport",
    "batches",
    "check_queue_name",
    "dead_letter_name",
    "dead_letter_reasons",
    "default_max_receives",
    "hand_back",
    "outgoing",
    "parse_attribute",
    "peek",
    "refuse_peek",
    "send",
]
