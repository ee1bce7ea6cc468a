"""Signing in to the dashboard is unauthenticated: its body carries only a key,
so it is read up to a few KiB, and a longer one is refused with 413 (and its
connection closed) without reading the rest."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
from conftest import AppClient

from app.ui.routes import SIGN_IN_BODY_BYTES

ADMIN = "LQBOOTSTRAPADMIN0001.admin-secret-0123456789abcdefghij"


async def test_a_declared_long_body_is_refused_unread(app_factory: AppClient) -> None:
    client = await app_factory(admin_key=ADMIN)
    padded = json.dumps({"key": ADMIN, "pad": "x" * 10_000})
    refused = await client.post("/ui/session", content=padded,
                                headers={"content-type": "application/json"})
    assert refused.status_code == 413, refused.text
    assert refused.headers["content-type"] == "application/problem+json"
    assert refused.json()["code"] == "request_too_large"
    assert refused.headers["connection"] == "close"
    assert "set-cookie" not in refused.headers


async def test_a_chunked_long_body_is_cut_off(app_factory: AppClient) -> None:
    client = await app_factory(admin_key=ADMIN)
    pulled = 0

    async def chunks() -> AsyncIterator[bytes]:
        nonlocal pulled
        yield b'{"key": "' + ADMIN.encode() + b'", "pad": "'
        for _ in range(1024):
            pulled += 1
            yield b"x" * 1024
        yield b'"}'

    refused = await client.post("/ui/session", content=chunks(),
                                headers={"content-type": "application/json"})
    assert refused.status_code == 413 and refused.json()["code"] == "request_too_large"
    assert pulled * 1024 <= 2 * SIGN_IN_BODY_BYTES


async def test_a_short_body_signs_in(app_factory: AppClient) -> None:
    client = await app_factory(admin_key=ADMIN)
    signed = await client.post("/ui/session", json={"key": ADMIN})
    assert signed.status_code == 200, signed.text
    assert len(json.dumps({"key": ADMIN})) < SIGN_IN_BODY_BYTES


async def test_a_deeply_nested_body_is_a_client_error(app_factory: AppClient) -> None:
    # Well within the size, far past the JSON parser's recursion limit.
    client = await app_factory(admin_key=ADMIN)
    deep = b"[" * (SIGN_IN_BODY_BYTES // 2) + b"]" * (SIGN_IN_BODY_BYTES // 2)
    refused = await client.post("/ui/session", content=deep,
                                headers={"content-type": "application/json"})
    assert refused.status_code == 422, refused.text
    assert refused.headers["content-type"] == "application/problem+json"
    assert refused.json()["code"] == "validation_error"
    assert "set-cookie" not in refused.headers


async def test_sign_ins_count_against_the_keys_rate(app_factory: AppClient) -> None:
    # Each sign-in stores a session: a key may not store them faster than its rate.
    client = await app_factory(admin_key=ADMIN, key_rate=0.5)
    first = await client.post("/ui/session", json={"key": ADMIN})
    assert first.status_code == 200, first.text
    second = await client.post("/ui/session", json={"key": ADMIN})
    assert second.status_code == 429, second.text
    assert second.json()["code"] == "rate_limited"
    assert "set-cookie" not in second.headers


@pytest.mark.parametrize("secret", ["\ud800x", "\u00e9t\u00e9-0123456789abcdefghij"],
                         ids=["lone surrogate", "not ascii"])
async def test_a_secret_no_key_could_have_is_refused_as_one(
    app_factory: AppClient, secret: str
) -> None:
    # The key id is real (key ids are not secret); the secret's characters no key
    # has. A lone surrogate, which JSON carries and UTF-8 does not, was a 500.
    client = await app_factory(admin_key=ADMIN)
    key_id = ADMIN.split(".", 1)[0]
    body = json.dumps({"key": f"{key_id}.{secret}"})  # ASCII, with \\u escapes
    refused = await client.post("/ui/session", content=body,
                                headers={"content-type": "application/json"})
    assert refused.status_code == 401, refused.text
    assert refused.json()["code"] == "unauthenticated"
    assert "set-cookie" not in refused.headers
