"""SQS's message attributes: the typed user attributes a send carries (checked as
SQS checks them) and a receive returns, and the system attributes, among them
the one a sender may set, AWSTraceHeader."""

from __future__ import annotations

import base64
import binascii
import re
from decimal import Decimal, InvalidOperation
from typing import Any

from app.queue import limits
from app.queue.models import MessageAttribute, ReceivedMessage
from app.queue.tracecontext import TRACEPARENT, to_xray
from app.sqs import md5
from app.sqs.context import check_text
from app.sqs.errors import SqsError

_DATA_TYPE = re.compile(r"^(String|Number|Binary)(\.[^\x00-\x1f]{1,})?$")
# SQS's attribute names: letters of any script (AWS accepts "attr.1øßä"), digits,
# "_", "-" and "." (\w of a str pattern is Unicode's). REST's names stay ASCII
# (limits.ATTRIBUTE_NAME): an SQS client may send names REST would refuse.
_NAME = re.compile(r"[\w.\-]{1,256}")
# What MessageAttributeNames asks for every attribute with.
_EVERY = ("All", ".*", "*")
DEAD_LETTER_SOURCE = "DeadLetterQueueSourceArn"
SYSTEM = (
    "SenderId", "SentTimestamp", "ApproximateReceiveCount", "ApproximateFirstReceiveTimestamp",
    # FIFO queues' messages only.
    "MessageGroupId", "MessageDeduplicationId", "SequenceNumber",
    # Only on messages sent with one.
    md5.TRACE_HEADER,
    # Only on messages moved to a dead-letter queue: the queue they came from.
    DEAD_LETTER_SOURCE,
)
# Message system attributes SQS may return that leaseq never has.
SYSTEM_NOT_PRESENT = ("SqsManagedSseEnabled",)
# SQS documents no bound on a trace header (nor counts it in the message size):
# this one is leaseq's, so that the one uncounted field cannot carry a payload.
TRACE_HEADER_BYTES = 8192


def shown(text: str) -> str:
    """A refused value as an error may echo it: without the characters XML cannot
    carry (a Query answer echoing a control character is no XML a client parses)."""
    return limits.NOT_TEXT_CHAR.sub("", text)


def _empty_value(name: str, base_type: str) -> str:
    return (
        f"Message (user) attribute '{name}' must contain a non-empty value of type "
        f"'{base_type}'."
    )


def parse(value: Any) -> dict[str, MessageAttribute]:
    """A send's MessageAttributes, checked with SQS's errors, as typed attributes."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SqsError("InvalidParameterValue", "MessageAttributes must be a map.")
    if len(value) > limits.MAX_ATTRIBUTES:
        raise SqsError(
            "InvalidParameterValue",
            f"Number of message attributes [{len(value)}] exceeds the allowed maximum "
            f"[{limits.MAX_ATTRIBUTES}].",
        )
    typed: dict[str, MessageAttribute] = {}
    for name, entry in value.items():
        if not _legal_name(name):
            raise SqsError(
                "InvalidParameterValue", f"Message attribute name '{shown(name)}' is invalid."
            )
        if not isinstance(entry, dict):
            raise SqsError("InvalidParameterValue", f"Message attribute '{name}' is invalid.")
        data_type = entry.get("DataType")
        if not isinstance(data_type, str) or not data_type:
            raise SqsError(
                "InvalidParameterValue", f"The message attribute '{name}' must contain a "
                f"non-empty message attribute type."
            )
        if not _DATA_TYPE.fullmatch(data_type) or len(data_type) > 256:
            raise SqsError(
                "InvalidParameterValue",
                f"The type of message attribute '{name}' is invalid. You must use only the "
                f"following supported type prefixes: Binary, Number, String.",
            )
        if entry.get("StringListValues") or entry.get("BinaryListValues"):
            raise SqsError(
                "InvalidParameterValue", "Message attribute list values are not supported."
            )
        string_value, binary_value = entry.get("StringValue"), entry.get("BinaryValue")
        if data_type.startswith("Binary"):
            if not isinstance(binary_value, str) or string_value is not None:
                raise SqsError(
                    "InvalidParameterValue",
                    f"The message attribute '{name}' with type 'Binary' must use field "
                    f"'Binary'.",
                )
            try:
                raw = base64.b64decode(binary_value, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise SqsError(
                    "InvalidParameterValue", f"Message attribute '{name}' is not base64."
                ) from exc
            if not raw:
                raise SqsError("InvalidParameterValue", _empty_value(name, "Binary"))
            typed[name] = MessageAttribute(data_type=data_type, binary_value=raw)
            continue
        if string_value is None or string_value == "":
            # SQS's words, for a missing and for an empty value alike.
            raise SqsError("InvalidParameterValue", _empty_value(name, data_type.split(".")[0]))
        if not isinstance(string_value, str) or binary_value is not None:
            raise SqsError(
                "InvalidParameterValue",
                f"The message attribute '{name}' with type '{data_type.split('.')[0]}' must "
                f"use field 'String'.",
            )
        try:
            check_text(string_value, f"the message attribute '{name}'")
        except SqsError as error:
            # SQS answers InvalidParameterValue here (InvalidMessageContents for a body).
            raise SqsError("InvalidParameterValue", error.message) from None
        if data_type.startswith("Number"):
            try:
                number = Decimal(string_value)
            except InvalidOperation:
                number = None
            if number is None or not number.is_finite() or len(string_value) > 40:
                raise SqsError(
                    "InvalidParameterValue",
                    f"Can't cast the value of message (user) attribute '{name}' to a number.",
                )
        typed[name] = MessageAttribute(data_type=data_type, string_value=string_value)
    return typed


def _trace_refused(detail: str) -> SqsError:
    return SqsError(
        "InvalidParameterValue",
        f"The message system attribute '{md5.TRACE_HEADER}' is reserved for AWS X-Ray trace "
        f"header. {detail}",
    )


def trace_of(message: ReceivedMessage) -> str | None:
    """Its AWSTraceHeader: the sender's, else its REST `traceparent` attribute in
    X-Ray's form (None: it carries no trace)."""
    if message.trace_header is not None:
        return message.trace_header
    traceparent = message.attributes.get(TRACEPARENT)
    return None if traceparent is None else to_xray(traceparent)


def trace_header(value: Any) -> str | None:
    """The AWSTraceHeader of a send's MessageSystemAttributes, checked (None: none).
    It is the only system attribute a sender may set; its type is String."""
    if value is None or value == {}:
        return None
    if not isinstance(value, dict):
        raise SqsError("InvalidParameterValue", "MessageSystemAttributes must be a map.")
    for name in value:
        if name != md5.TRACE_HEADER:
            raise SqsError(
                "InvalidParameterValue",
                f"Message system attribute name '{shown(name[:256])}' is invalid.",
            )
    entry = value[md5.TRACE_HEADER]
    if not isinstance(entry, dict) or entry.get("DataType") != "String" or (
        entry.get("BinaryValue") is not None
    ):
        raise _trace_refused("The type must be 'String'.")
    header = entry.get("StringValue")
    if not isinstance(header, str) or not header:
        raise SqsError(
            "InvalidParameterValue",
            f"Message (system) attribute '{md5.TRACE_HEADER}' must contain a non-empty value "
            f"of type 'String'.",
        )
    try:
        check_text(header, f"the message system attribute '{md5.TRACE_HEADER}'")
    except SqsError as error:
        raise SqsError("InvalidParameterValue", error.message) from None  # as for attributes
    if len(header.encode("utf-8")) > TRACE_HEADER_BYTES:
        raise _trace_refused(f"It must be at most {TRACE_HEADER_BYTES} bytes long.")
    return header


def _legal_name(name: str) -> bool:
    return (
        _NAME.fullmatch(name) is not None
        and ".." not in name
        and not name.startswith(".")
        and not name.endswith(".")
        and not name.lower().startswith(("aws.", "amazon."))
    )


def wanted(names: list[str], name: str) -> bool:
    """Whether MessageAttributeNames ask for `name`: All, `.*` and `*` every one;
    `prefix.*` the names that start with `prefix`, the text before `.*` (so `Hel.*`
    takes `Hello` and `Help.Me`, as AWS answers)."""
    for wanted in names:
        if wanted in _EVERY or wanted == name:
            return True
        if wanted.endswith(".*") and name.startswith(wanted[:-2]):
            return True
    return False


def chosen(
    names: list[str], typed: dict[str, MessageAttribute]
) -> dict[str, MessageAttribute]:
    """The attributes a receive returns of a message: those its MessageAttributeNames
    ask for. A name no attribute can bear (`AWS.`, `..foo`) is no error, it matches
    nothing; none matching, the answer has neither MessageAttributes nor their MD5
    (as SQS answers today, and LocalStack since: an empty map was AWS's JSON answer
    in 2023)."""
    return {k: v for k, v in typed.items() if wanted(names, k)}


def rendered(chosen: dict[str, MessageAttribute]) -> dict[str, dict[str, str | None]]:
    """Typed attributes as a receive answers them (binary values in base64)."""
    return {
        k: {"DataType": v.data_type, "StringValue": v.string_value}
        if v.binary_value is None
        else {
            "DataType": v.data_type,
            "BinaryValue": base64.b64encode(v.binary_value).decode("ascii"),
        }
        for k, v in chosen.items()
    }
