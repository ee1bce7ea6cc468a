"""SQS's errors: one exception carrying SQS's error name, and the translation of
the engine's LeaseqError tree into them.

Each error has a name (the JSON protocol's `__type`, which botocore turns into
an exception class), a code (the Query protocol's, sent in JSON responses too
as `x-amzn-query-error`), an HTTP status and a fault (Sender or Receiver).
"""

from __future__ import annotations

from app.errors import (
    DatabaseUnavailable,
    Forbidden,
    InvalidParameter,
    InvalidReceiptHandle,
    InvalidRedrivePolicy,
    LeaseLost,
    LeaseqError,
    MessageTooLarge,
    Overloaded,
    QueueAlreadyExists,
    QueueInUse,
    QueueNotFound,
    RateLimited,
    RedriveInProgress,
    TaskNotFound,
    TooManyTags,
    Unauthenticated,
)

_LEGACY = "AWS.SimpleQueueService."

# name -> (query code, HTTP status)
ERRORS: dict[str, tuple[str, int]] = {
    "QueueDoesNotExist": (_LEGACY + "NonExistentQueue", 400),
    "QueueNameExists": ("QueueAlreadyExists", 400),
    "ReceiptHandleIsInvalid": ("ReceiptHandleIsInvalid", 404),
    "MessageNotInflight": (_LEGACY + "MessageNotInflight", 400),
    "InvalidParameterValue": ("InvalidParameterValue", 400),
    "InvalidAttributeName": ("InvalidAttributeName", 400),
    "InvalidAttributeValue": ("InvalidAttributeValue", 400),
    "InvalidMessageContents": ("InvalidMessageContents", 400),
    "TooManyEntriesInBatchRequest": (_LEGACY + "TooManyEntriesInBatchRequest", 400),
    "BatchEntryIdsNotDistinct": (_LEGACY + "BatchEntryIdsNotDistinct", 400),
    "EmptyBatchRequest": (_LEGACY + "EmptyBatchRequest", 400),
    "InvalidBatchEntryId": (_LEGACY + "InvalidBatchEntryId", 400),
    "BatchRequestTooLong": (_LEGACY + "BatchRequestTooLong", 400),
    "MissingParameter": ("MissingParameter", 400),
    "OverLimit": ("OverLimit", 403),
    "UnsupportedOperation": (_LEGACY + "UnsupportedOperation", 400),
    "ResourceNotFoundException": ("ResourceNotFoundException", 404),
    "InvalidAction": ("InvalidAction", 400),
    # The JSON protocol's answer for a target that names no SQS action (a
    # service framework's error, not SQS's own: see NAMESPACES).
    "UnknownOperationException": ("UnknownOperationException", 400),
    "MissingAuthenticationToken": ("MissingAuthenticationToken", 403),
    "IncompleteSignature": ("IncompleteSignature", 403),
    "InvalidClientTokenId": ("InvalidClientTokenId", 403),
    "SignatureDoesNotMatch": ("SignatureDoesNotMatch", 403),
    "RequestExpired": ("RequestExpired", 400),
    "AccessDenied": ("AccessDenied", 403),
    # SQS's throttling error. Sent as 403 Sender, as SQS itself sends it: botocore
    # retries it with backoff in its legacy mode only in that form (its SQS retry
    # policy), and in standard mode (by name), as other SDKs do by name.
    "RequestThrottled": ("RequestThrottled", 403),
    "ServiceUnavailable": ("ServiceUnavailable", 503),
    "InternalError": ("InternalError", 500),
}


class SqsError(Exception):
    """An SQS error by its name (a key of ERRORS)."""

    def __init__(self, name: str, message: str) -> None:
        assert name in ERRORS, name
        super().__init__(message)
        self.name = name
        self.message = message

    @property
    def code(self) -> str:
        return ERRORS[self.name][0]

    @property
    def status(self) -> int:
        return ERRORS[self.name][1]

    @property
    def fault(self) -> str:
        return "Receiver" if self.status >= 500 else "Sender"


# The JSON protocol's `__type` namespace: SQS's, but for the framework's errors.
NAMESPACES = {"UnknownOperationException": "com.amazon.coral.service"}
# The JSON protocol's `__type` name where SQS's differs from the Query code (as
# recorded against SQS: botocore shows it as the error's QueryErrorCode).
JSON_NAMES = {
    "InvalidParameterValue": "InvalidParameterValueException",
    "MissingParameter": "MissingRequiredParameterException",
}
SQS_NAMESPACE = "com.amazonaws.sqs"
# SQS's words for a queue that does not exist, on each protocol.
NO_QUEUE = "The specified queue does not exist."
NO_QUEUE_QUERY = "The specified queue does not exist for this wsdl version."


# Engine error -> SQS error name. LeaseLost depends on the action (see actions.py).
_FROM_ENGINE: dict[type[LeaseqError], str] = {
    QueueNotFound: "QueueDoesNotExist",
    QueueAlreadyExists: "QueueNameExists",
    InvalidReceiptHandle: "ReceiptHandleIsInvalid",
    LeaseLost: "MessageNotInflight",
    MessageTooLarge: "InvalidParameterValue",
    TooManyTags: "OverLimit",
    InvalidParameter: "InvalidParameterValue",
    InvalidRedrivePolicy: "InvalidParameterValue",
    QueueInUse: "InvalidParameterValue",
    TaskNotFound: "ResourceNotFoundException",
    RedriveInProgress: "InvalidParameterValue",
    DatabaseUnavailable: "ServiceUnavailable",
    Overloaded: "RequestThrottled",
    Forbidden: "AccessDenied",
    RateLimited: "RequestThrottled",
    Unauthenticated: "MissingAuthenticationToken",
}


def from_engine(exc: Exception) -> SqsError:
    """The SQS error for an engine error (InternalError for anything unexpected)."""
    if isinstance(exc, SqsError):
        return exc
    for cls in type(exc).__mro__:
        if cls in _FROM_ENGINE:
            if cls is QueueNotFound:
                return SqsError("QueueDoesNotExist", NO_QUEUE)
            detail = getattr(exc, "detail", str(exc))
            return SqsError(_FROM_ENGINE[cls], detail)
    return SqsError("InternalError", "An internal error occurred.")
