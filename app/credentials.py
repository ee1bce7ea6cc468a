"""What a credential given in the settings must be: a key id's shape, a secret's
least estimated entropy, LEASEQ_ADMIN_KEY's `<key id>.<secret>` and
LEASEQ_SQS_CREDENTIALS' pairs. Each refusal names the setting, never the value."""

from __future__ import annotations

import math
import re

KEY_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
"""An API key id's shape (app/auth/tokens.py), here so a bootstrap key is checked
with the settings that name it."""

SECRET_BITS = 256
"""LEASEQ_SECRET's least estimated entropy: 32 bytes, as `openssl rand -hex 32` gives."""
KEY_SECRET_CHARS = 20
KEY_SECRET_BITS = 128
"""A key secret's least estimated entropy (LEASEQ_ADMIN_KEY, LEASEQ_SQS_CREDENTIALS):
a generated key's 40 characters estimate 238 bits and an AWS secret access key's
about as many; 128 is 32 hex digits or 22 random letters and digits, and what a
word, a short or a repetitive value estimates stays below it."""


def estimated_bits(text: str) -> float:
    """A generous estimate of a secret's entropy: its length times the bits of
    the smallest alphabet its characters come from (hex, or the classes it
    uses). It catches the mistakes (a word, a short or repetitive value), not a
    weak secret drawn from a strong-looking alphabet, which nothing here can."""
    if len(set(text)) < 8:
        return 0.0
    if all(c in "0123456789abcdef" for c in text) or all(c in "0123456789ABCDEF" for c in text):
        alphabet = 16
    else:
        alphabet = (
            26 * any(c.islower() for c in text) + 26 * any(c.isupper() for c in text)
            + 10 * any(c.isdigit() for c in text) + 33 * any(not c.isalnum() for c in text)
        )
    return len(text) * math.log2(alphabet)


def check_admin_key(token: str, where: str) -> str:
    """A bootstrap key `<key id>.<secret>`, or ValueError naming what is wrong."""
    key_id, sep, secret = token.partition(".")
    if not sep or not KEY_ID.fullmatch(key_id):
        raise ValueError(
            f"{where} must be <key id>.<secret>, the key id of letters, digits, _ and -"
        )
    check_key_secret(secret, f"{where}: the secret after the key id")
    return token


def check_key_secret(secret: str, where: str) -> None:
    """ValueError unless `secret` is as strong as a generated key's; the message
    names `where`, never the secret."""
    if len(secret) < KEY_SECRET_CHARS:
        raise ValueError(f"{where} must be at least {KEY_SECRET_CHARS} characters")
    if estimated_bits(secret) < KEY_SECRET_BITS:
        raise ValueError(
            f"{where} is too weak: it needs at least {KEY_SECRET_BITS} bits of entropy, "
            "such as 32 hex digits (make one: openssl rand -hex 20)"
        )


def parse_credentials(text: str) -> dict[str, str]:
    """`KEY1:secret1,KEY2:secret2` -> {key: secret}: the keys of LEASEQ_SQS_CREDENTIALS.
    Each pair is held to what a key's id and secret must be (check_key_secret): it
    is an admin:* key of both doors. The errors name the pair by its place, never
    by anything it holds."""
    pairs: dict[str, str] = {}
    where = "LEASEQ_SQS_CREDENTIALS"
    for place, item in enumerate((i.strip() for i in text.split(",") if i.strip()), 1):
        key, sep, secret = item.partition(":")
        key, secret = key.strip(), secret.strip()
        if not sep or not key or not secret:
            raise ValueError(f"{where} is ACCESS_KEY:SECRET pairs, comma-separated")
        if not KEY_ID.fullmatch(key):
            raise ValueError(
                f"{where}: pair {place} has a key id other than 1 to 128 letters, digits, "
                "_ and -"
            )
        check_key_secret(secret, f"{where}: pair {place}")
        pairs[key] = secret
    if not pairs:
        raise ValueError(f"{where} names no access key")
    return pairs
