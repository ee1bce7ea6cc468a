"""The dashboard's routes without a browser: signing in puts the key in an
HttpOnly, SameSite=Strict cookie; the cookie stands for the key only on
requests the dashboard's script makes (its header), never on a plain or
cross-site request; the page forbids framing and scripts of others; the
overview's numbers are the queues' own and follow the key's scopes; the
sparkline series come from the counters."""

from __future__ import annotations

import httpx
import pytest
from conftest import AppClient
from support import make_queue, receive, send

from app.ui.throughput import Throughput

ADMIN = "LQBOOTSTRAPADMIN0001.admin-secret-0123456789abcdefghij"
DASHBOARD = {"x-leaseq-dashboard": "1"}


async def _keyed(app_factory: AppClient) -> httpx.AsyncClient:
    return await app_factory(admin_key=ADMIN)


async def _key(client: httpx.AsyncClient, *scopes: str) -> str:
    created = await client.post("/v1/keys", json={"name": "dash", "scopes": list(scopes)},
                                headers={"Authorization": f"Bearer {ADMIN}"})
    assert created.status_code == 201, created.text
    return str(created.json()["token"])


async def test_signing_in_sets_an_httponly_strict_cookie_the_script_uses(
    app_factory: AppClient,
) -> None:
    client = await _keyed(app_factory)
    admin = {"Authorization": f"Bearer {ADMIN}"}
    assert (await client.post("/v1/queues", json={"name": "orders"}, headers=admin)).is_success
    # The page itself is open (it holds nothing of a queue); its readings are not.
    page = await client.get("/ui")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    assert page.headers["x-frame-options"] == "DENY"
    assert (await client.get("/ui/api/session", headers=DASHBOARD)).status_code == 401

    bad = await client.post("/ui/session", json={"key": "LQNOSUCHKEY000000000.nope"})
    assert bad.status_code == 401 and bad.json()["code"] == "unauthenticated"
    assert "set-cookie" not in bad.headers
    form = await client.post("/ui/session", content=f"key={ADMIN}",
                             headers={"content-type": "application/x-www-form-urlencoded"})
    assert form.status_code == 415

    reader = await _key(client, "read:ord*")
    signed = await client.post("/ui/session", json={"key": reader})
    assert signed.status_code == 200, signed.text
    cookie = signed.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
    assert signed.json()["scopes"] == ["read:ord*"]

    # With the dashboard's header the cookie is the key: reads pass, admin does not.
    who = await client.get("/ui/api/session", headers=DASHBOARD)
    assert who.status_code == 200 and who.json()["keys_required"] is True
    assert (await client.get("/v1/queues/orders", headers=DASHBOARD)).status_code == 200
    purge = await client.post("/v1/queues/orders/purge", headers=DASHBOARD)
    assert purge.status_code == 403 and purge.json()["code"] == "forbidden"
    # Without it, the cookie alone authenticates nothing (a link, a form, an <img>).
    assert (await client.get("/v1/queues/orders")).status_code == 401
    # Another site's page is refused whatever it carries.
    cross = await client.get("/v1/queues/orders",
                             headers={**DASHBOARD, "origin": "http://evil.example"})
    assert cross.status_code == 403

    out = await client.delete("/ui/session")
    assert out.status_code == 204 and 'leaseq_session=""' in out.headers["set-cookie"]
    assert (await client.get("/ui/api/session", headers=DASHBOARD)).status_code == 401


async def test_a_revoked_key_in_the_cookie_stops_working(app_factory: AppClient) -> None:
    client = await _keyed(app_factory)
    token = await _key(client, "read:*")
    assert (await client.post("/ui/session", json={"key": token})).status_code == 200
    assert (await client.get("/ui/api/overview", headers=DASHBOARD)).status_code == 200
    key_id = token.split(".", 1)[0]
    revoked = await client.delete(f"/v1/keys/{key_id}",
                                  headers={"Authorization": f"Bearer {ADMIN}"})
    assert revoked.status_code in (200, 204), revoked.text
    assert (await client.get("/ui/api/overview", headers=DASHBOARD)).status_code == 401


async def test_the_overview_counts_what_the_queues_hold_and_follows_scopes(
    app_factory: AppClient,
) -> None:
    client = await app_factory()
    await make_queue(client, "orders-dlq")
    await make_queue(client, "orders", dead_letter_queue="orders-dlq", max_receive_count=1,
                     visibility_timeout=600)
    await make_queue(client, "billing")
    for i in range(4):
        await send(client, "orders", f"m{i}")
    await send(client, "orders", "later", delay=600)
    await receive(client, "orders", max=1)
    overview = (await client.get("/ui/api/overview")).json()
    by_name = {q["name"]: q for q in overview["queues"]}
    assert set(by_name) == {"orders", "orders-dlq", "billing"}
    orders = by_name["orders"]
    stats = (await client.get("/v1/queues/orders")).json()["stats"]
    assert (orders["visible"], orders["in_flight"], orders["delayed"]) == (
        stats["visible"], stats["in_flight"], stats["delayed"]) == (3, 1, 1)
    assert orders["dead_letter_queue"] == "orders-dlq" and orders["oldest_visible_age_seconds"] > 0
    assert orders["dead_lettered"] == 0 and by_name["orders-dlq"]["dead_letter_sources"] == {}
    assert overview["sparkline_interval_seconds"] > 0

    keys = client.app.state.keys  # type: ignore[attr-defined]
    info, reader_secret = await keys.create("billing only", ["read:billing"])
    reader = {"Authorization": f"Bearer {info.id}.{reader_secret}"}
    shown = (await client.get("/ui/api/overview", headers=reader)).json()["queues"]
    assert [q["name"] for q in shown] == ["billing"]
    sender_info, sender_secret = await keys.create("sender", ["send:*"])
    sender = {"Authorization": f"Bearer {sender_info.id}.{sender_secret}"}
    refused = await client.get("/ui/api/overview", headers=sender)
    assert refused.status_code == 403


@pytest.mark.unit
def test_throughput_is_rates_between_samples_taken_while_watched() -> None:
    now = [0.0]
    totals = {"q": (0.0, 0.0)}
    meter = Throughput(lambda: dict(totals), interval=2.0, window=10.0, idle_after=30.0,
                       clock=lambda: now[0])
    meter.tick()
    assert meter.series("q") == ([], [])  # nobody watching: nothing sampled
    meter.watch()  # the baseline
    for sent, deleted in [(10.0, 4.0), (30.0, 14.0), (5.0, 2.0)]:  # the last: a restart
        now[0] += 2.0
        totals["q"] = (sent, deleted)
        meter.tick()
    assert meter.series("q") == ([5.0, 10.0, 0.0], [2.0, 5.0, 0.0])
    assert meter.series("other") == ([0.0, 0.0, 0.0], [0.0, 0.0, 0.0])
    for _ in range(10):  # the window keeps the last 10 s: 5 rates
        now[0] += 2.0
        meter.tick()
    assert len(meter.series("q")[0]) == 5
    now[0] += 31.0  # nobody looked for longer than idle_after
    meter.tick()
    assert meter.series("q") == ([], [])
