"""Receipt handles: opaque, URL-safe, signed names of one claim.

A handle carries the queue id, the message row id and the claim token, and an
HMAC-SHA256 tag over them with the server's secret. Anything that does not
verify is rejected before SQL sees it; a handle that verifies but whose claim
has been replaced simply matches no row (lease lost).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import struct
import uuid
from dataclasses import dataclass

from app.errors import InvalidReceiptHandle

_VERSION = 1
_LAYOUT = struct.Struct(">BQQ16s")  # version, queue id, message row id, claim token
_TAG_BYTES = 16
_MAX_LENGTH = 256
# base64 decoding skips characters outside its alphabet; check them first so a
# garbled handle is never "repaired" into a valid one.
_ALPHABET = re.compile(r"[A-Za-z0-9_-]+")


@dataclass(frozen=True)
class Receipt:
    queue_id: int
    message_row: int
    claim_token: uuid.UUID


class ReceiptSigner:
    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("the receipt secret must be at least 16 bytes")
        self._key = hashlib.sha256(b"leaseq receipt v1\x00" + secret).digest()

    def _tag(self, payload: bytes) -> bytes:
        return hmac.new(self._key, payload, hashlib.sha256).digest()[:_TAG_BYTES]

    def encode(self, receipt: Receipt) -> str:
        payload = _LAYOUT.pack(
            _VERSION, receipt.queue_id, receipt.message_row, receipt.claim_token.bytes
        )
        return base64.urlsafe_b64encode(payload + self._tag(payload)).rstrip(b"=").decode()

    def decode(self, handle: str, *, queue_id: int) -> Receipt:
        """The claim a handle names, if this server issued it for this queue."""
        if len(handle) > _MAX_LENGTH or not _ALPHABET.fullmatch(handle):
            raise InvalidReceiptHandle()
        try:
            raw = base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4))
        except (binascii.Error, ValueError):
            raise InvalidReceiptHandle() from None
        if len(raw) != _LAYOUT.size + _TAG_BYTES:
            raise InvalidReceiptHandle()
        # The last character of a handle carries 4 bits that decoding drops,
        # so 16 spellings decoded to the same bytes: a handle with its last
        # character changed still verified (and deleted the message). Only
        # the one spelling encode() produces is a handle.
        if base64.urlsafe_b64encode(raw).rstrip(b"=").decode() != handle:
            raise InvalidReceiptHandle()
        payload, tag = raw[: _LAYOUT.size], raw[_LAYOUT.size :]
        if not hmac.compare_digest(tag, self._tag(payload)):
            raise InvalidReceiptHandle()
        version, handle_queue, row, token = _LAYOUT.unpack(payload)
        if version != _VERSION:
            raise InvalidReceiptHandle()
        if handle_queue != queue_id:
            raise InvalidReceiptHandle("The receipt handle belongs to another queue.")
        return Receipt(queue_id=handle_queue, message_row=row, claim_token=uuid.UUID(bytes=token))
