"""Receipt handles: opaque, URL-safe, signed names of one claim.

A handle carries the id of the key that signed it, the queue id, the message
row id and the claim token, and an HMAC-SHA256 tag over them. Anything that
does not verify is rejected before SQL sees it; a handle that verifies but
whose claim has been replaced simply matches no row (lease lost).

The keys live in the database (table receipt_keys), so every replica signs and
verifies with the same ones, and they survive redeploys. The newest key signs;
every key not yet retired verifies. Version 1 handles (before keys rotated)
carry no key id: they verify with the service's own secret, when it has one.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.errors import DatabaseUnavailable, InvalidReceiptHandle

_VERSION = 2
_LAYOUT = struct.Struct(">BHQQ16s")  # version, key id, queue id, message row id, claim token
_LAYOUT_V1 = struct.Struct(">BQQ16s")  # version, queue id, message row id, claim token
_TAG_BYTES = 16
_V2_CHARS = (_LAYOUT.size + _TAG_BYTES) * 4 // 3
"""A version 2 handle's length: 51 bytes, a multiple of 3, so base64 spells them
in 68 characters with no bits to spare: one spelling only."""
_MAX_LENGTH = 256
# base64 decoding skips characters outside its alphabet; check them first so a
# garbled handle is never "repaired" into a valid one.
_ALPHABET = re.compile(r"[A-Za-z0-9_-]+")


@dataclass(frozen=True)
class Receipt:
    queue_id: int
    message_row: int
    claim_token: uuid.UUID


def _derive(secret: bytes) -> Any:
    """The HMAC-SHA256 state of a key, ready for a message: each tag copies it
    (1.6 us) instead of keying a new one (2.5 us with hmac.digest)."""
    key = hashlib.sha256(b"leaseq receipt v1\x00" + secret).digest()
    return hmac.new(key, digestmod=hashlib.sha256)


class ReceiptSigner:
    """Signs with the current key; verifies with any key it holds."""

    def __init__(self, keys: dict[int, bytes], *, current: int | None = None,
                 legacy: bytes | None = None) -> None:
        self._legacy = None if legacy is None else _derive(legacy)
        self.set_keys(keys, current=current)

    def set_keys(self, keys: dict[int, bytes], *, current: int | None = None) -> None:
        """The keys to verify with and the one to sign with. No keys: not loaded
        yet (the database was not reached); every handle answers 503 meanwhile."""
        if not keys:
            self._keys = {}
            self.current = 0
            return
        for secret in keys.values():
            if len(secret) < 16:
                raise ValueError("a receipt key must be at least 16 bytes")
        self._keys = {key_id: _derive(secret) for key_id, secret in keys.items()}
        self.current = max(keys) if current is None else current
        if self.current not in self._keys:
            raise ValueError(f"the current receipt key {self.current} is not among the keys")

    @property
    def key_ids(self) -> list[int]:
        return sorted(self._keys)

    @staticmethod
    def _tag(key: Any, payload: bytes) -> bytes:
        mac = key.copy()
        mac.update(payload)
        digest: bytes = mac.digest()
        return digest[:_TAG_BYTES]

    def _loaded(self) -> None:
        if not self._keys:
            raise DatabaseUnavailable("The receipt keys are not loaded yet.")

    def encode(self, receipt: Receipt) -> str:
        self._loaded()
        payload = _LAYOUT.pack(
            _VERSION, self.current, receipt.queue_id, receipt.message_row,
            receipt.claim_token.bytes,
        )
        tag = self._tag(self._keys[self.current], payload)
        return base64.urlsafe_b64encode(payload + tag).rstrip(b"=").decode()

    def decode(self, handle: str, *, queue_id: int) -> Receipt:
        """The claim a handle names, if this server issued it for this queue."""
        self._loaded()
        if len(handle) > _MAX_LENGTH or not _ALPHABET.fullmatch(handle):
            raise InvalidReceiptHandle()
        try:
            raw = base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4))
        except (binascii.Error, ValueError):
            raise InvalidReceiptHandle() from None
        # The last character of a handle of another length carries bits that
        # decoding drops, so several spellings decoded to the same bytes: a
        # handle with its last character changed still verified (and deleted
        # the message). Only the one spelling encode() produces is a handle.
        if len(handle) != _V2_CHARS and (
            not raw or base64.urlsafe_b64encode(raw).rstrip(b"=").decode() != handle
        ):
            raise InvalidReceiptHandle()
        if raw[0] == _VERSION and len(raw) == _LAYOUT.size + _TAG_BYTES:
            payload, tag = raw[: _LAYOUT.size], raw[_LAYOUT.size :]
            _, key_id, handle_queue, row, token = _LAYOUT.unpack(payload)
            key = self._keys.get(key_id)
        elif raw[0] == 1 and len(raw) == _LAYOUT_V1.size + _TAG_BYTES:
            payload, tag = raw[: _LAYOUT_V1.size], raw[_LAYOUT_V1.size :]
            _, handle_queue, row, token = _LAYOUT_V1.unpack(payload)
            key = self._legacy
        else:
            raise InvalidReceiptHandle()
        if key is None or not hmac.compare_digest(tag, self._tag(key, payload)):
            raise InvalidReceiptHandle()
        if handle_queue != queue_id:
            raise InvalidReceiptHandle("The receipt handle belongs to another queue.")
        return Receipt(queue_id=handle_queue, message_row=row, claim_token=uuid.UUID(bytes=token))

    def decode_all(
        self, handles: Sequence[str], *, queue_id: int
    ) -> list[Receipt | InvalidReceiptHandle]:
        """`decode` for each handle of a batch: its claim, or why it names none."""
        decoded: list[Receipt | InvalidReceiptHandle] = []
        for handle in handles:
            try:
                decoded.append(self.decode(handle, queue_id=queue_id))
            except InvalidReceiptHandle as exc:
                decoded.append(exc)
        return decoded
