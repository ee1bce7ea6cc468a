"""The worker SDK of leaseq: REST clients and a `Worker` with a heartbeat watchdog.

It talks to the service over HTTP only and depends on nothing but httpx (and rich,
for the operator's commands) and the standard library: importing it loads none of
the server's modules, and each name is imported when first used.
See docs/workers.md. `leaseq.sql` sends and acknowledges in your own transaction,
on your own database connection (docs/transactions.md).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from leaseq import sql
    from leaseq.backoff import Backoff
    from leaseq.batching import SendBatcher
    from leaseq.client import AsyncClient, Client, default_url
    from leaseq.context import AsyncContext, Context
    from leaseq.errors import (
        ApiError,
        CancelReason,
        ClientError,
        Forbidden,
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

# Imported when first used: `leaseq --help` and `leaseq queues` need none of it,
# and httpx alone takes a tenth of a second to import.
_WHERE = {
    "ApiError": "leaseq.errors",
    "AsyncClient": "leaseq.client",
    "AsyncContext": "leaseq.context",
    "Backoff": "leaseq.backoff",
    "CancelReason": "leaseq.errors",
    "Client": "leaseq.client",
    "ClientError": "leaseq.errors",
    "Context": "leaseq.context",
    "Forbidden": "leaseq.errors",
    "HandlerCancelled": "leaseq.errors",
    "InvalidReceiptHandle": "leaseq.errors",
    "Lease": "leaseq.models",
    "LeaseClock": "leaseq.lease",
    "LeaseLost": "leaseq.errors",
    "Message": "leaseq.models",
    "MessageTooLarge": "leaseq.errors",
    "Outcome": "leaseq.worker",
    "OutgoingMessage": "leaseq.models",
    "PeekPage": "leaseq.models",
    "PeekedMessage": "leaseq.models",
    "Queue": "leaseq.models",
    "QueueAlreadyExists": "leaseq.errors",
    "QueueAttributes": "leaseq.models",
    "QueueNotFound": "leaseq.errors",
    "QueuePage": "leaseq.models",
    "QueueStats": "leaseq.models",
    "RedriveTask": "leaseq.models",
    "Released": "leaseq.models",
    "RequestTooLarge": "leaseq.errors",
    "RetryBackoff": "leaseq.models",
    "SendBatcher": "leaseq.batching",
    "Sent": "leaseq.models",
    "ServiceUnavailable": "leaseq.errors",
    "Settled": "leaseq.models",
    "Unreachable": "leaseq.errors",
    "ValidationError": "leaseq.errors",
    "Worker": "leaseq.worker",
    "WorkerStats": "leaseq.worker",
    "default_url": "leaseq.client",
}


def __getattr__(name: str) -> Any:
    if name == "sql":  # a module of its own: `leaseq.sql.send(conn, ...)`
        return importlib.import_module("leaseq.sql")
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'leaseq' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "ApiError",
    "AsyncClient",
    "AsyncContext",
    "Backoff",
    "CancelReason",
    "Client",
    "ClientError",
    "Context",
    "Forbidden",
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
    "sql",
]
