"""Receipt handles: opaque, URL-safe, signed; anything else never reaches SQL."""

from __future__ import annotations

import stat
import uuid
from pathlib import Path

import pytest
from support import TEST_SECRET

from app.config import Settings
from app.errors import InvalidReceiptHandle
from app.queue.receipts import Receipt, ReceiptSigner

SECRET = b"0123456789abcdef0123"
RECEIPT = Receipt(queue_id=7, message_row=123456789, claim_token=uuid.uuid4())


def test_round_trip_and_url_safety() -> None:
    signer = ReceiptSigner({1: SECRET})
    handle = signer.encode(RECEIPT)
    assert handle.replace("-", "").replace("_", "").isalnum()
    assert signer.decode(handle, queue_id=7) == RECEIPT


def test_every_single_character_change_is_rejected() -> None:
    signer = ReceiptSigner({1: SECRET})
    handle = signer.encode(RECEIPT)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    for position in range(len(handle)):
        for replacement in alphabet:
            if replacement == handle[position]:
                continue
            forged = handle[:position] + replacement + handle[position + 1 :]
            with pytest.raises(InvalidReceiptHandle):
                signer.decode(forged, queue_id=7)


@pytest.mark.parametrize(
    "garbage",
    ["", "x", "not a handle", "AAAA", "%00", "a" * 5000, "é" * 60, "AQ==", "\x00" * 66],
)
def test_garbage_is_rejected(garbage: str) -> None:
    with pytest.raises(InvalidReceiptHandle):
        ReceiptSigner({1: SECRET}).decode(garbage, queue_id=7)


def test_another_secret_or_queue_is_rejected() -> None:
    handle = ReceiptSigner({1: SECRET}).encode(RECEIPT)
    with pytest.raises(InvalidReceiptHandle):
        ReceiptSigner({1: b"another secret of enough length"}).decode(handle, queue_id=7)
    with pytest.raises(InvalidReceiptHandle):
        ReceiptSigner({1: SECRET}).decode(handle, queue_id=8)


def test_secret_is_generated_once_and_kept_in_the_data_dir(tmp_path: Path) -> None:
    first = Settings(data_dir=tmp_path).master_secret()
    again = Settings(data_dir=tmp_path).master_secret()
    assert first == again and len(first) >= 32
    path = tmp_path / "receipt-secret"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["receipt-secret"]
    # A configured secret wins over the file.
    configured = Settings(data_dir=tmp_path, secret=TEST_SECRET)
    assert configured.master_secret() == TEST_SECRET.encode()


def test_handles_name_their_key_and_any_unretired_key_verifies() -> None:
    signer = ReceiptSigner({1: SECRET})
    old = signer.encode(RECEIPT)
    signer.set_keys({1: SECRET, 2: b"the second receipt key, rotated"}, current=2)
    new = signer.encode(RECEIPT)
    assert old != new
    assert signer.decode(old, queue_id=7) == signer.decode(new, queue_id=7) == RECEIPT
    signer.set_keys({2: b"the second receipt key, rotated"})  # key 1 retired
    assert signer.decode(new, queue_id=7) == RECEIPT
    with pytest.raises(InvalidReceiptHandle):
        signer.decode(old, queue_id=7)


def test_version_one_handles_verify_with_the_legacy_secret() -> None:
    import base64
    import hashlib
    import hmac
    import struct

    payload = struct.pack(">BQQ16s", 1, 7, RECEIPT.message_row, RECEIPT.claim_token.bytes)
    key = hashlib.sha256(b"leaseq receipt v1\x00" + SECRET).digest()
    tag = hmac.new(key, payload, hashlib.sha256).digest()[:16]
    handle = base64.urlsafe_b64encode(payload + tag).rstrip(b"=").decode()
    assert ReceiptSigner({1: b"x" * 32}, legacy=SECRET).decode(handle, queue_id=7) == RECEIPT
    with pytest.raises(InvalidReceiptHandle):
        ReceiptSigner({1: b"x" * 32}).decode(handle, queue_id=7)
