"""The worker SDK of leaseq: REST clients and a `Worker` with a heartbeat watchdog.

It talks to the service over HTTP only and depends on nothing but httpx and the
standard library: importing it loads none of the server's modules.
See docs/workers.md.
"""

from leaseq.backoff import Backoff
from leaseq.batching import SendBatcher
from leaseq.client import AsyncClient, Client, default_url
from leaseq.context import AsyncContext, Context
from leaseq.errors import (
    ApiError,
    CancelReason,
    ClientError,
    HandlerCancelled,
    InvalidReceiptHandle,
    LeaseLost,
    MessageTooLarge,
    QueueAlreadyExists,
    QueueNotFound,
    RequestTooLarge,
    ServiceUnavailable,
    Unreachable,
    ValidationError,
)
from leaseq.lease import LeaseClock
from leaseq.models import (
    Lease,
    Message,
    OutgoingMessage,
    PeekedMessage,
    PeekPage,
    Queue,
    QueueAttributes,
    QueuePage,
    QueueStats,
    RedriveTask,
    Released,
    RetryBackoff,
    Sent,
    Settled,
)
from leaseq.worker import Outcome, Worker, WorkerStats

__all__ = [
    "ApiError",
    "AsyncClient",
    "AsyncContext",
    "Backoff",
    "CancelReason",
    "Client",
    "ClientError",
    "Context",
    "HandlerCancelled",
    "InvalidReceiptHandle",
    "Lease",
    "LeaseClock",
    "LeaseLost",
    "Message",
    "MessageTooLarge",
    "Outcome",
    "OutgoingMessage",
    "PeekPage",
    "PeekedMessage",
    "Queue",
    "QueueAlreadyExists",
    "QueueAttributes",
    "QueueNotFound",
    "QueuePage",
    "QueueStats",
    "RedriveTask",
    "Released",
    "RequestTooLarge",
    "RetryBackoff",
    "SendBatcher",
    "Sent",
    "ServiceUnavailable",
    "Settled",
    "Unreachable",
    "ValidationError",
    "Worker",
    "WorkerStats",
    "default_url",
]
