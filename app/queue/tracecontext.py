"""A message's trace, as either door names it: the W3C `traceparent` (REST's
message attribute, what the Python client sets and its worker continues) and AWS
X-Ray's trace header (SQS's AWSTraceHeader). The same trace and parent, one
written as the other, so a trace started on one door continues on the other."""

from __future__ import annotations

import re

TRACEPARENT = "traceparent"
"""The message attribute that carries a W3C trace context on REST."""

_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_ROOT = re.compile(r"1-([0-9a-f]{8})-([0-9a-f]{24})")
_SPAN = re.compile(r"[0-9a-f]{16}")


def to_xray(traceparent: str) -> str | None:
    """`00-<trace>-<parent>-<flags>` -> `Root=1-<8>-<24>;Parent=<16>;Sampled=<0|1>`
    (None: not a valid version-00 traceparent)."""
    match = _TRACEPARENT.fullmatch(traceparent.strip())
    if match is None:
        return None
    trace, parent, flags = match.groups()
    if trace == "0" * 32 or parent == "0" * 16:
        return None  # all zeros: invalid, says the W3C recommendation
    sampled = int(flags, 16) & 1
    return f"Root=1-{trace[:8]}-{trace[8:]};Parent={parent};Sampled={sampled}"


def to_traceparent(header: str) -> str | None:
    """An X-Ray trace header's root and parent as a traceparent (None: it names no
    parent, or is not one; X-Ray's `Lineage` and other fields have no W3C place)."""
    fields = {}
    for part in header.split(";"):
        name, _, value = part.strip().partition("=")
        fields[name] = value
    root = _ROOT.fullmatch(fields.get("Root", ""))
    parent = fields.get("Parent", "")
    if root is None or not _SPAN.fullmatch(parent) or parent == "0" * 16:
        return None
    sampled = "01" if fields.get("Sampled") == "1" else "00"
    return f"00-{root[1]}{root[2]}-{parent}-{sampled}"
