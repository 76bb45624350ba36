"""sqsworker: a consumer-side worker framework for Amazon SQS."""

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
from .handler import Handler, handler
from .message import Message
from .policies import Backoff
from .worker import Worker

__all__ = [
    "Backoff",
    "ConfigError",
    "Handler",
    "LeaseLost",
    "Message",
    "MessageDecodeError",
    "Observer",
    "QueueNotFound",
    "Reject",
    "Retry",
    "SQSWorkerError",
    "StartupError",
    "TransportError",
    "Worker",
    "WorkerConfig",
    "handler",
]
__version__ = "0.1.0"
