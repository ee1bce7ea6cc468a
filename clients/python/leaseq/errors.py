"""The errors of the worker SDK, one tree, mapped from the service's problem `code`.

    ClientError
     ├── Unreachable                no answer: connect refused, reset, timed out
     └── ApiError                   the service answered with a problem (status, code)
          ├── QueueNotFound             404 queue_not_found
          ├── QueueAlreadyExists        409 queue_already_exists
          ├── LeaseLost                 409 lease_lost: the claim is gone, stop working
          ├── InvalidReceiptHandle      400 invalid_receipt_handle
          ├── MessageTooLarge           413 message_too_large
          ├── RequestTooLarge           413 request_too_large
          ├── ValidationError           422 validation_error
          ├── Forbidden                 403 forbidden
          └── ServiceUnavailable        503 database_unavailable

    HandlerCancelled                a BaseException, like asyncio.CancelledError, so
                                    that a handler's `except Exception` does not
                                    swallow the watchdog's cancellation

This module knows the service only by its wire format: it imports nothing of the
server side.
"""

from __future__ import annotations

import enum
from typing import Any


class ClientError(Exception):
    """A request to leaseq failed."""


class Unreachable(ClientError):
    """The service did not answer (connection refused or reset, or a timeout)."""


class ApiError(ClientError):
    """The service answered with an error (problem+json with a stable `code`)."""

    def __init__(self, status: int, code: str, detail: str, body: Any = None) -> None:
        self.status = status
        self.code = code
        self.detail = detail
        self.body = body
        super().__init__(f"{status} {code}: {detail}")

    @property
    def transient(self) -> bool:
        """Worth retrying later: the service or its database is overloaded or down."""
        return self.status >= 500 or self.status == 429


class QueueNotFound(ApiError):
    """The queue does not exist."""


class QueueAlreadyExists(ApiError):
    """A queue with this name exists with other attributes."""


class LeaseLost(ApiError):
    """The claim named by the receipt handle is gone: another receive holds the
    message, or it was deleted. Whatever the handler still does is a duplicate."""


class InvalidReceiptHandle(ApiError):
    """The service did not issue this receipt handle for this queue."""


class MessageTooLarge(ApiError):
    """The message is larger than the queue's max_message_bytes."""


class RequestTooLarge(ApiError):
    """The request body is larger than the service accepts."""


class ValidationError(ApiError):
    """A parameter is outside its documented limits."""


class Forbidden(ApiError):
    """The API key's scopes do not allow the request; through the SQL API
    (`leaseq.sql`), the calling role has no grant for the queue."""


class ServiceUnavailable(ApiError):
    """The service cannot reach its database right now."""


ERRORS: dict[str, type[ApiError]] = {
    "queue_not_found": QueueNotFound,
    "queue_already_exists": QueueAlreadyExists,
    "lease_lost": LeaseLost,
    "invalid_receipt_handle": InvalidReceiptHandle,
    "message_too_large": MessageTooLarge,
    "request_too_large": RequestTooLarge,
    "validation_error": ValidationError,
    "forbidden": Forbidden,
    "database_unavailable": ServiceUnavailable,
}
"""problem `code` -> exception class; an unknown code is a plain ApiError."""


def api_error(status: int, code: str, detail: str, body: Any = None) -> ApiError:
    return ERRORS.get(code, ApiError)(status, code, detail, body)


class CancelReason(enum.StrEnum):
    """Why the watchdog cancelled a handler."""

    LEASE_LOST = "lease_lost"
    """An extension or checkpoint answered 409: someone else holds the message now."""
    LEASE_EXPIRED = "lease_expired"
    """The lease ran out on this worker's monotonic clock (beats kept failing, or the
    process was stopped): the message may already be someone else's."""
    SHUTDOWN = "shutdown"
    """The worker is stopping and the grace period is over; the message is released."""


class HandlerCancelled(BaseException):
    """The handler must stop: its lease is gone, or the worker is shutting down."""

    def __init__(self, reason: CancelReason) -> None:
        self.reason = reason
        super().__init__(f"handler cancelled: {reason.value}")
