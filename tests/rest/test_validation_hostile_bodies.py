"""Hostile REST bodies are refused as validation errors, never a 500: times outside
the window, refused characters named in the error, cursors nested too deeply, and
batches far past the hard cap refused before they are validated."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from support import make_queue

from app.api.message_schemas import _storable_json


def nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


# -- REST bodies ----------------------------------------------------------------


async def test_not_before_outside_the_window_is_a_validation_error(
    client: httpx.AsyncClient,
) -> None:
    queue = await make_queue(client, "scheduled")
    url = f"/v1/queues/{queue}/messages"
    for moment in ("0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00",
                   "1969-12-31T23:59:59Z", "9000-01-01T00:00:00Z"):
        for payload in ({"body": "x", "not_before": moment},
                        {"messages": [{"body": "x", "not_before": moment}]}):
            response = await client.post(url, json=payload)
            assert response.status_code == 422, (moment, response.text)
            assert response.json()["code"] == "validation_error"
    for moment in ("1970-01-01T00:00:00Z", "8999-12-31T23:59:59+14:00"):
        response = await client.post(url, json={"body": "x", "not_before": moment})
        assert response.status_code == 201, (moment, response.text)


async def test_refused_characters_are_named_in_the_error(client: httpx.AsyncClient) -> None:
    queue = await make_queue(client, "texts")
    url = f"/v1/queues/{queue}/messages"
    for payload, code_point in [
        ({"body": "ok\x00"}, "U+0000"),
        ({"body": "tab\tok", "attributes": {"a": "x\ufffe"}}, "U+FFFE"),
        ({"body": "ok\x1f\x00"}, "U+001F"),
    ]:
        response = await client.post(url, json=payload)
        assert response.status_code == 422, response.text
        messages = [error["msg"] for error in response.json()["errors"]]
        assert any(f"does not allow: {code_point}" in m for m in messages), messages
    accepted = {"body": "\t\n\r \ud7ff\ue000\ufffd\U00010000\U0010ffff"}
    assert (await client.post(url, json=accepted)).status_code == 201


def test_a_cursor_reports_its_first_fault() -> None:
    assert _storable_json(nested(64, leaf=[])) is not None
    for depth in (65, 100_000):
        with pytest.raises(ValueError, match="nested too deeply"):
            _storable_json(nested(depth))
    with pytest.raises(ValueError, match="U\\+0000"):
        _storable_json([{"k": "\x00"}, "\ud800", float("nan")])
    with pytest.raises(ValueError, match="cannot represent"):
        _storable_json([[float("inf")], "\x00"])
    with pytest.raises(ValueError, match="U\\+0001"):
        _storable_json({"a": 1, "\x01": 2})


@pytest.mark.parametrize("path,payload,refused_by", [
    ("", {"messages": [{}] * 5_000}, "parser"),
    ("/visibility", {"entries": [{}] * 5_000}, "parser"),
    ("/delete", {"receipt_handles": [0] * 5_000}, "parser"),
    # Strings have no parser hook: pydantic stops at the hard cap instead.
    ("/delete", {"receipt_handles": ["h"] * 5_000}, "pydantic"),
])
async def test_batches_past_the_hard_cap_stop_validating_at_once(
    client: httpx.AsyncClient, path: str, payload: dict[str, Any], refused_by: str
) -> None:
    queue = await make_queue(client, "capped")
    response = await client.post(f"/v1/queues/{queue}/messages{path}", json=payload)
    assert response.status_code == 422, response.text[:300]
    if refused_by == "parser":
        # The JSON parser stopped at the first value past a full batch.
        assert "stopped reading after" in response.json()["detail"]
    else:
        # One error for the list, none for its 5,000 entries: pydantic refused
        # the list before it validated any of them.
        assert [e["type"] for e in response.json()["errors"]] == ["too_long"]
