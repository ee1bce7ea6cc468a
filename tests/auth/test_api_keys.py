"""API keys on the REST door: 401 without one once keys exist, 403 outside a
key's scopes, key management, revocation seen by every process within a
second, expiry on the database clock, and per-key rate limits."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from conftest import AppClient
from support import eventually, make_queue, send

ADMIN = "LQBOOTSTRAPADMIN0001.admin-secret-0123456789abcdefghij"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def new_key(client: httpx.AsyncClient, *scopes: str, **extra: Any) -> str:
    response = await client.post(
        "/v1/keys", json={"name": "test", "scopes": list(scopes), **extra}, headers=bearer(ADMIN)
    )
    assert response.status_code == 201, response.text
    created = response.json()
    assert created["token"] == f"{created['id']}.{created['secret']}"
    return str(created["token"])


async def test_open_without_keys_and_closed_once_one_exists(app_factory: AppClient) -> None:
    client = await app_factory()
    await make_queue(client, "before")  # no key exists: the loopback service is open
    keys = client.app.state.keys  # type: ignore[attr-defined]
    info, secret = await keys.create("ops", ["admin:*"])
    refused = await client.get("/v1/queues")
    assert refused.status_code == 401
    assert refused.headers["content-type"] == "application/problem+json"
    assert refused.json()["code"] == "unauthenticated"
    assert refused.headers["www-authenticate"].startswith("Bearer")
    ok = await client.get("/v1/queues", headers=bearer(f"{info.id}.{secret}"))
    assert [q["name"] for q in ok.json()["queues"]] == ["before"]
    # health stays open; metrics and docs need a key unless opened by setting
    assert (await client.get("/healthz")).status_code == 200
    assert (await client.get("/readyz")).status_code == 200
    assert (await client.get("/metrics")).status_code == 401
    assert (await client.get("/openapi.json")).status_code == 401


async def test_open_paths_by_setting(app_factory: AppClient) -> None:
    client = await app_factory(admin_key=ADMIN, open_metrics=True, open_docs=True)
    assert (await client.get("/metrics")).status_code == 200
    assert (await client.get("/openapi.json")).status_code == 200
    assert (await client.get("/v1/queues")).status_code == 401


@pytest.mark.parametrize("token", [
    "garbage", "LQNOSUCHKEY000000000.wrong-secret", ADMIN + "x", ADMIN.split(".")[0] + ".",
])
async def test_bad_tokens_are_refused(app_factory: AppClient, token: str) -> None:
    client = await app_factory(admin_key=ADMIN)
    response = await client.get("/v1/queues", headers=bearer(token))
    assert response.status_code == 401
    assert response.json()["code"] == "unauthenticated"


async def test_scopes_cover_action_and_queue_pattern(app_factory: AppClient) -> None:
    client = await app_factory(admin_key=ADMIN)
    admin = bearer(ADMIN)
    for name in ("orders-eu", "orders-us", "billing"):
        assert (await client.post("/v1/queues", json={"name": name}, headers=admin)).is_success
    sender = bearer(await new_key(client, "send:orders-*"))
    worker = bearer(await new_key(client, "receive:orders-eu"))
    reader = bearer(await new_key(client, "read:orders-*"))

    sent = await client.post("/v1/queues/orders-eu/messages", json={"body": "x"}, headers=sender)
    assert sent.status_code == 201
    for denied in [
        client.post("/v1/queues/billing/messages", json={"body": "x"}, headers=sender),
        client.get("/v1/queues/orders-eu/receive", headers=sender),
        client.get("/v1/queues/orders-us/receive", headers=worker),
        client.post("/v1/queues/orders-eu/receive", json={}, headers=sender),
        client.post("/v1/queues/orders-us/receive", json={"delete": ["h"]}, headers=worker),
        client.post("/v1/queues/orders-eu/purge", headers=reader),
        client.delete("/v1/queues/orders-eu", headers=worker),
        client.post("/v1/queues", json={"name": "orders-new"}, headers=sender),
        client.get("/v1/keys", headers=reader),
        client.get("/v1/queues/billing/messages", headers=reader),
    ]:
        response = await denied
        assert response.status_code == 403, response.request.url
        assert response.json()["code"] == "forbidden"

    got = (await client.get("/v1/queues/orders-eu/receive", headers=worker)).json()["messages"]
    handle = got[0]["receipt_handle"]
    deleted = await client.delete(f"/v1/queues/orders-eu/messages/{handle}", headers=worker)
    assert deleted.status_code == 204
    listed = (await client.get("/v1/queues", headers=reader)).json()["queues"]
    assert [q["name"] for q in listed] == ["orders-eu", "orders-us"]
    peek = await client.get("/v1/queues/orders-us/messages", headers=reader)
    assert peek.status_code == 200


async def test_a_scoped_admin_manages_its_queues_but_not_keys(app_factory: AppClient) -> None:
    client = await app_factory(admin_key=ADMIN)
    team = bearer(await new_key(client, "admin:team-*"))
    assert (await client.post("/v1/queues", json={"name": "team-a"}, headers=team)).status_code \
        == 201
    assert (await client.post("/v1/queues", json={"name": "other"}, headers=team)).status_code \
        == 403
    assert (await client.post("/v1/queues/team-a/messages", json={"body": "x"},
                              headers=team)).status_code == 201
    keys = await client.post("/v1/keys", json={"name": "x", "scopes": ["admin:*"]}, headers=team)
    assert keys.status_code == 403


async def test_key_management(app_factory: AppClient) -> None:
    client = await app_factory(admin_key=ADMIN)
    admin = bearer(ADMIN)
    bad = await client.post("/v1/keys", json={"name": "x", "scopes": ["write:*"]}, headers=admin)
    assert bad.status_code == 422 and bad.json()["code"] == "validation_error"
    token = await new_key(client, "read:*", expires_in=3600)
    key_id = token.split(".")[0]
    listed = (await client.get("/v1/keys", headers=admin)).json()["keys"]
    mine = next(k for k in listed if k["id"] == key_id)
    assert mine["scopes"] == ["read:*"] and mine["expires_at"] is not None
    assert "secret" not in mine and "secret_hash" not in mine
    assert (await client.get("/v1/queues", headers=bearer(token))).status_code == 200
    assert (await client.delete(f"/v1/keys/{key_id}", headers=admin)).status_code == 204
    assert (await client.get("/v1/queues", headers=bearer(token))).status_code == 401
    again = await client.delete(f"/v1/keys/{key_id}", headers=admin)
    assert again.status_code == 404 and again.json()["code"] == "key_not_found"


async def test_the_secret_is_stored_only_as_hash_and_seal(app_factory: AppClient,
                                                          db: Any) -> None:
    client = await app_factory(admin_key=ADMIN)
    token = await new_key(client, "read:*")
    key_id, secret = token.split(".")
    row = await db.fetchrow("SELECT * FROM leaseq.api_keys WHERE id = $1", key_id)
    stored = b"".join(v if isinstance(v, bytes) else str(v).encode() for v in row.values())
    assert secret.encode() not in stored


async def test_revocation_reaches_another_process_within_a_second(
    app_factory: AppClient,
) -> None:
    one = await app_factory(admin_key=ADMIN)
    two = await app_factory(admin_key=ADMIN)
    token = await new_key(one, "read:*")
    assert (await two.get("/v1/queues", headers=bearer(token))).status_code == 200  # cached
    revoked = await one.delete(f"/v1/keys/{token.split('.')[0]}", headers=bearer(ADMIN))
    assert revoked.status_code == 204
    started = time.monotonic()

    async def refused() -> bool:
        return (await two.get("/v1/queues", headers=bearer(token))).status_code == 401

    await eventually(refused, seconds=1.0)
    assert time.monotonic() - started < 1.0


async def test_a_first_key_closes_every_process(app_factory: AppClient) -> None:
    one = await app_factory()
    two = await app_factory()
    assert (await two.get("/v1/queues")).status_code == 200
    await one.app.state.keys.create("ops", ["admin:*"])  # type: ignore[attr-defined]

    async def closed() -> bool:
        return (await two.get("/v1/queues")).status_code == 401

    await eventually(closed, seconds=1.0)


async def _used_until_expired(client: httpx.AsyncClient, scopes: list[str]) -> None:
    """A key of `scopes` that lives one second: it works, then it is refused."""
    keys = client.app.state.keys  # type: ignore[attr-defined]
    info, secret = await keys.create("brief", scopes, expires_in=1.0)
    token = bearer(f"{info.id}.{secret}")
    assert (await client.get("/v1/queues", headers=token)).status_code == 200

    async def expired() -> bool:
        return (await client.get("/v1/queues", headers=token)).status_code == 401

    await eventually(expired, seconds=5.0)


async def test_expiry_is_judged_on_the_database_clock(app_factory: AppClient) -> None:
    client = await app_factory(admin_key=ADMIN)
    await _used_until_expired(client, ["read:*"])


async def test_rate_limit_per_key(app_factory: AppClient) -> None:
    client = await app_factory(admin_key=ADMIN)
    token = bearer(await new_key(client, "read:*", rate_per_second=1))
    statuses = [(await client.get("/v1/queues", headers=token)) for _ in range(4)]
    assert [r.status_code for r in statuses[:2]] == [200, 200]
    limited = statuses[-1]
    assert limited.status_code == 429
    assert limited.json()["code"] == "rate_limited"
    assert int(limited.headers["retry-after"]) >= 1
    # another key is not affected
    assert (await client.get("/v1/queues", headers=bearer(ADMIN))).status_code == 200


async def test_keys_default_rate_setting(app_factory: AppClient) -> None:
    client = await app_factory(admin_key=ADMIN, key_rate=0.5)
    codes = [(await client.get("/v1/queues", headers=bearer(ADMIN))).status_code
             for _ in range(3)]
    assert codes == [200, 429, 429]


async def test_bootstrap_key_is_created_once(app_factory: AppClient, db: Any,
                                             tmp_path: Any) -> None:
    key_file = tmp_path / "admin-key"
    key_file.write_text(ADMIN + "\n")
    await app_factory(admin_key_file=key_file)
    await app_factory(admin_key_file=key_file)  # a second start, or a replica
    assert await db.fetchval("SELECT count(*) FROM leaseq.api_keys") == 1


async def test_a_send_key_works_end_to_end(app_factory: AppClient) -> None:
    client = await app_factory(admin_key=ADMIN)
    await client.post("/v1/queues", json={"name": "jobs"}, headers=bearer(ADMIN))
    client.headers.update(bearer(await new_key(client, "send:jobs", "receive:jobs")))
    await send(client, "jobs", "hello")
    got = (await client.get("/v1/queues/jobs/receive")).json()["messages"]
    assert got[0]["body"] == "hello"


async def test_revoking_the_last_key_locks_the_doors_for_good(app_factory: AppClient) -> None:
    client = await app_factory()
    await make_queue(client, "kept")
    token = await client.app.state.keys.create("only", ["admin:*"])  # type: ignore[attr-defined]
    info, secret = token
    mine = bearer(f"{info.id}.{secret}")
    assert (await client.delete(f"/v1/keys/{info.id}", headers=mine)).status_code == 204
    # No usable key is left: nobody gets in, and nobody may make a key over HTTP.
    for path in ("/v1/queues", "/v1/queues/kept"):
        assert (await client.get(path)).status_code == 401
        assert (await client.get(path, headers=mine)).status_code == 401
    made = await client.post("/v1/keys", json={"name": "x", "scopes": ["admin:*"]})
    assert made.status_code == 401
    # A process started afterwards on the same database agrees.
    later = await app_factory()
    assert (await later.get("/v1/queues")).status_code == 401


async def test_the_last_key_expiring_locks_the_doors(app_factory: AppClient) -> None:
    client = await app_factory()
    await _used_until_expired(client, ["admin:*"])
    assert (await client.get("/v1/queues")).status_code == 401
    assert (await (await app_factory()).get("/v1/queues")).status_code == 401


async def test_a_revoked_bootstrap_key_stays_revoked(app_factory: AppClient) -> None:
    client = await app_factory(admin_key=ADMIN)
    key_id = ADMIN.split(".")[0]
    assert (await client.delete(f"/v1/keys/{key_id}", headers=bearer(ADMIN))).status_code == 204
    again = await app_factory(admin_key=ADMIN)  # a restart with the variable still set
    assert (await again.get("/v1/queues", headers=bearer(ADMIN))).status_code == 401
    assert (await again.get("/v1/queues")).status_code == 401
