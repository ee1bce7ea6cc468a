"""The one error tree of leaseq.

    LeaseqError
     ├── QueueError                  a request the queue engine refuses
     │    ├── QueueNotFound
     │    ├── QueueAlreadyExists
     │    ├── LeaseLost              the claim named by a receipt handle is gone
     │    ├── InvalidReceiptHandle   forged, garbled, or for another queue
     │    ├── MessageTooLarge
     │    ├── InvalidParameter       a value outside its documented limits
     │    │    ├── TooManyTags        more tags than a queue may have
     │    │    └── MissingParameter   a parameter the queue needs is missing (a FIFO group)
     │    ├── InvalidRedrivePolicy   a dead-letter queue that is missing or the queue itself
     │    ├── QueueInUse             named as another queue's dead-letter queue
     │    ├── TaskNotFound           no such redrive task
     │    └── RedriveInProgress      a dead-letter queue already being redriven
     ├── AccessError                 the caller may not make this request
     │    ├── Unauthenticated        no valid API key where one is required
     │    ├── Forbidden              the key's scopes (or the page's origin) do not allow it
     │    ├── RateLimited            the key's request rate is spent for now
     │    ├── HostNotAllowed         a Host header this service does not answer to
     │    └── UnsupportedMediaType   a REST body that is not JSON
     ├── KeyNotFound                 no such (unrevoked) API key
     ├── DatabaseUnavailable         PostgreSQL cannot be reached right now
     ├── Overloaded                  the service is at a limit; retry later
     └── EmbeddedPostgresError       the embedded server could not be run

The engine raises these and knows nothing of HTTP; each front door (REST,
later SQS) maps them to its own status codes and error shapes.
"""

from __future__ import annotations


class LeaseqError(Exception):
    """leaseq failed."""

    def __init__(self, detail: str | None = None) -> None:
        self.detail = detail or (self.__doc__ or "").strip()
        super().__init__(self.detail)


class QueueError(LeaseqError):
    """The queue engine refused the request."""


class QueueNotFound(QueueError):
    """The queue does not exist."""


class QueueAlreadyExists(QueueError):
    """A queue with this name already exists with different attributes."""

    def __init__(self, detail: str | None = None, differing: tuple[str, ...] = ()) -> None:
        super().__init__(detail)
        self.differing = differing
        """The attributes (QueueAttributes' names) whose values differ."""


class LeaseLost(QueueError):
    """The lease is lost: the message was deleted or claimed again by another receive."""


class InvalidReceiptHandle(QueueError):
    """The receipt handle is not one this service issued for this queue."""


class MessageTooLarge(QueueError):
    """The message is larger than the queue's max_message_bytes."""


class InvalidParameter(QueueError):
    """A parameter is outside its allowed range."""


class TooManyTags(InvalidParameter):
    """A queue has at most 50 tags."""


class MissingParameter(InvalidParameter):
    """A parameter this queue needs is missing."""

    def __init__(self, parameter: str, detail: str | None = None) -> None:
        super().__init__(detail)
        self.parameter = parameter
        """The parameter's REST name (`group`, `deduplication_id`)."""


class InvalidRedrivePolicy(QueueError):
    """The redrive policy is invalid."""


class QueueInUse(QueueError):
    """The queue is another queue's dead-letter queue."""


class TaskNotFound(QueueError):
    """The redrive task does not exist."""


class RedriveInProgress(QueueError):
    """A redrive of this dead-letter queue is already running."""


class AccessError(LeaseqError):
    """The request is not allowed."""


class Unauthenticated(AccessError):
    """A valid API key is required."""


class Forbidden(AccessError):
    """The API key's scopes do not allow this request."""


class RateLimited(AccessError):
    """The API key's request rate is spent; retry later."""

    def __init__(self, retry_after: float, detail: str | None = None) -> None:
        super().__init__(detail)
        self.retry_after = retry_after


class HostNotAllowed(AccessError):
    """The Host header names a host this service does not answer to."""


class UnsupportedMediaType(AccessError):
    """The request body must be application/json."""


class KeyNotFound(LeaseqError):
    """No unrevoked API key has this id."""


class DatabaseUnavailable(LeaseqError):
    """The database is unavailable."""

    def __init__(self, detail: str | None = None, *, retry_after: int = 1) -> None:
        super().__init__(detail)
        self.retry_after = retry_after
        """Whole seconds after which a retry may succeed (HTTP's Retry-After): a
        lost connection is replaced at once, a failover takes seconds
        (docs/deploy.md)."""


class Overloaded(LeaseqError):
    """The service is at a limit; retry later."""

    def __init__(self, detail: str | None = None, *, retry_after: int = 1) -> None:
        super().__init__(detail)
        self.retry_after = retry_after
        """Whole seconds after which a retry may succeed (HTTP's Retry-After)."""


class EmbeddedPostgresError(LeaseqError):
    """The embedded PostgreSQL server could not be started."""
