"""sqsworker: a consumer-side worker framework for Amazon SQS."""

from .batches import BatchFailure, BatchResult
from .config import WorkerConfig
from .errors import (
    ConfigError,
    LeaseLost,
    MessageDecodeError,
    QueueNotFound,
    Reject,
    Retry,
    SQSWorkerError,
    StartupError,
    TransportError,
)
from .events import Observer
from .handler import Handler, batch_handler, handler, lambda_handler
from .message import Message
from .policies import Backoff
from .producer import AsyncProducer, Producer, SendError, SendReport
from .version import __version__ as __version__
from .worker import Worker

__all__ = [
    "AsyncProducer",
    "Backoff",
    "BatchFailure",
    "BatchResult",
    "ConfigError",
    "Handler",
    "LeaseLost",
    "Message",
    "MessageDecodeError",
    "Observer",
    "Producer",
    "QueueNotFound",
    "Reject",
    "Retry",
    "SQSWorkerError",
    "SendError",
    "SendReport",
    "StartupError",
    "TransportError",
    "Worker",
    "WorkerConfig",
    "batch_handler",
    "handler",
    "lambda_handler",
]
