"""Key ids, secrets and the forms they are kept in.

A key is an id (`LQ` and 18 base32 characters, the shape of an AWS access key
id, so SQS clients take it as one) and a 40-character secret. REST requests
present both as `Authorization: Bearer <id>.<secret>`; SQS clients sign with
them (Signature Version 4).

The database keeps the SHA-256 of the secret, which is all a bearer check
needs. A SigV4 signature can only be checked by someone who holds the secret
itself, so the row also keeps the secret sealed: XORed with a pad that only
the service's master secret (`LEASEQ_SECRET`) can make, HMAC-SHA512 of the
key id. Each key id is used once, so each pad is too. A copy of the database
alone yields neither form of any key.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

from app.credentials import KEY_ID as KEY_ID  # the shape the settings check a key by

_SECRET_CHARS = 40
_SEAL_CONTEXT = b"leaseq api-key seal v1\x00"


def new_key_id() -> str:
    return "LQ" + base64.b32encode(secrets.token_bytes(15)).decode()[:18]


def new_secret() -> str:
    # 40 characters of base64url: 240 bits.
    return secrets.token_urlsafe(30)[:_SECRET_CHARS]


def secret_hash(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8")).digest()


def hash_matches(secret: str, expected: bytes) -> bool:
    return hmac.compare_digest(secret_hash(secret), expected)


def _pad(master: bytes, key_id: str, length: int) -> bytes:
    pad = b""
    counter = 0
    while len(pad) < length:
        block = _SEAL_CONTEXT + key_id.encode() + b"\x00" + counter.to_bytes(4, "big")
        pad += hmac.new(master, block, hashlib.sha512).digest()
        counter += 1
    return pad[:length]


def seal(master: bytes, key_id: str, secret: str) -> bytes:
    raw = secret.encode("utf-8")
    return bytes(a ^ b for a, b in zip(raw, _pad(master, key_id, len(raw)), strict=True))


def unseal(master: bytes, key_id: str, sealed: bytes, expected_hash: bytes) -> str | None:
    """The secret, or None when this master secret did not seal it."""
    raw = bytes(a ^ b for a, b in zip(sealed, _pad(master, key_id, len(sealed)), strict=True))
    try:
        secret = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return secret if hash_matches(secret, expected_hash) else None


def split_bearer(token: str) -> tuple[str, str] | None:
    """`<id>.<secret>` -> (id, secret); None for anything else. A secret is ASCII
    (every secret made is): a header cannot carry more, but a sign-in's JSON body
    can carry a lone surrogate, which no hash of UTF-8 takes."""
    key_id, sep, secret = token.partition(".")
    if (not sep or not secret or not KEY_ID.fullmatch(key_id) or len(secret) > 256
            or not secret.isascii()):
        return None
    return key_id, secret
