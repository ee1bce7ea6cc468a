"""The one error tree of leaseq.

    LeaseqError
     ├── QueueError                  a request the queue engine refuses
     │    ├── QueueNotFound
     │    ├── QueueAlreadyExists
     │    ├── LeaseLost              the claim named by a receipt handle is gone
     │    ├── InvalidReceiptHandle   forged, garbled, or for another queue
     │    ├── MessageTooLarge
     │    ├── InvalidParameter       a value outside its documented limits
     │    │    └── TooManyTags        more tags than a queue may have
     │    ├── InvalidRedrivePolicy   a dead-letter queue that is missing or the queue itself
     │    ├── QueueInUse             named as another queue's dead-letter queue
     │    ├── TaskNotFound           no such redrive task
     │    └── RedriveInProgress      a dead-letter queue already being redriven
     ├── DatabaseUnavailable         PostgreSQL cannot be reached right now
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


class InvalidRedrivePolicy(QueueError):
    """The redrive policy is invalid."""


class QueueInUse(QueueError):
    """The queue is another queue's dead-letter queue."""


class TaskNotFound(QueueError):
    """The redrive task does not exist."""


class RedriveInProgress(QueueError):
    """A redrive of this dead-letter queue is already running."""


class DatabaseUnavailable(LeaseqError):
    """The database is unavailable."""


class EmbeddedPostgresError(LeaseqError):
    """The embedded PostgreSQL server could not be started."""
