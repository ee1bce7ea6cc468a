"""The MD5 digests SQS returns, computed as SQS computes them (clients check them)."""

from __future__ import annotations

import hashlib
import struct

from app.queue.models import MessageAttribute

_STRING, _BINARY = 1, 2
TRACE_HEADER = "AWSTraceHeader"  # the one message system attribute a sender sets


def of_body(body: str) -> str:
    return hashlib.md5(body.encode("utf-8"), usedforsecurity=False).hexdigest()


def _field(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def of_attributes(attributes: dict[str, MessageAttribute]) -> str | None:
    """MD5OfMessageAttributes: over the attributes sorted by name, each as its
    length-prefixed name, length-prefixed data type, a transport byte (1 string,
    2 binary) and the length-prefixed value. None when there are none."""
    if not attributes:
        return None
    digest = hashlib.md5(usedforsecurity=False)
    for name in sorted(attributes):
        attribute = attributes[name]
        digest.update(_field(name.encode("utf-8")))
        digest.update(_field(attribute.data_type.encode("utf-8")))
        if attribute.binary_value is not None:
            digest.update(bytes([_BINARY]) + _field(attribute.binary_value))
        else:
            digest.update(bytes([_STRING]) + _field((attribute.string_value or "").encode()))
    return digest.hexdigest()


def of_system_attributes(trace_header: str | None) -> str | None:
    """MD5OfMessageSystemAttributes: the same digest as of_attributes, over the
    message's system attributes (AWSTraceHeader, the only one a sender sets, of
    type String). None when there are none."""
    if trace_header is None:
        return None
    return of_attributes(
        {TRACE_HEADER: MessageAttribute(data_type="String", string_value=trace_header)}
    )
