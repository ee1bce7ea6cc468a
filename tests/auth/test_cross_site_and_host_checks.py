"""A web page in the user's browser cannot drive a local leaseq: cross-site
requests are refused (forms, text/plain fetches, <img> GETs), the Host header
must name this service (DNS rebinding), and CORS is off unless configured."""

from __future__ import annotations

import pytest
from conftest import AppClient
from support import make_queue, send


async def test_a_cross_site_purge_is_refused(app_factory: AppClient) -> None:
    client = await app_factory()
    queue = await make_queue(client, "lp")
    await send(client, queue)
    for headers in [
        {"content-type": "text/plain", "origin": "http://evil.example"},
        {"origin": "http://evil.example"},
        {"sec-fetch-site": "cross-site"},
        {"content-type": "application/json", "origin": "null"},
    ]:
        response = await client.post(f"/v1/queues/{queue}/purge", headers=headers)
        assert response.status_code == 403, (headers, response.text)
        assert response.json()["code"] == "forbidden"
    # A text/plain body from no browser at all is still not JSON.
    plain = await client.post(f"/v1/queues/{queue}/messages", content=b'{"body": "x"}',
                              headers={"content-type": "text/plain"})
    assert plain.status_code == 415 and plain.json()["code"] == "unsupported_media_type"
    stats = (await client.get(f"/v1/queues/{queue}")).json()["stats"]
    assert stats["visible"] == 1  # nothing purged, nothing sent


async def test_a_cross_site_image_cannot_claim_messages(app_factory: AppClient) -> None:
    """Open mode (no key exists, so nothing else stands in the way): the REST
    receive is a GET that takes a lease, refused from another site's page whether
    the browser says so (Sec-Fetch-Site) or only names its Origin."""
    client = await app_factory()
    keys = client.app.state.keys  # type: ignore[attr-defined]
    await keys.ensure()
    assert not keys.enforcing
    queue = await make_queue(client, "img")
    await send(client, queue)
    for headers in ({"sec-fetch-site": "cross-site", "sec-fetch-dest": "image"},
                    {"sec-fetch-site": "cross-site"},
                    {"origin": "https://evil.example"},
                    {"origin": "null"}):
        got = await client.get(f"/v1/queues/{queue}/receive", headers=headers)
        assert got.status_code == 403, (headers, got.text)
        assert got.json()["code"] == "forbidden"
    stats = (await client.get(f"/v1/queues/{queue}")).json()["stats"]
    assert stats["visible"] == 1 and stats["in_flight"] == 0


async def test_same_origin_pages_and_plain_clients_pass(app_factory: AppClient) -> None:
    client = await app_factory()
    ok = await client.get("/v1/queues", headers={"origin": "http://leaseq.test",
                                                  "sec-fetch-site": "same-origin"})
    assert ok.status_code == 200
    assert (await client.post("/v1/queues", json={"name": "plain"})).status_code == 201


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "127.0.0.2.nip.io",
                                  "localhost.evil.example", "evillocalhost"])
async def test_dns_rebinding_hosts_are_refused(app_factory: AppClient, host: str) -> None:
    client = await app_factory(allowed_hosts=None)  # the loopback default
    response = await client.get("/v1/queues", headers={"host": host})
    assert response.status_code == 400
    assert response.json()["code"] == "host_not_allowed"
    # The SQS door too.
    sqs = await client.post("/", data={"Action": "ListQueues"}, headers={"host": host})
    assert sqs.status_code == 400


@pytest.mark.parametrize("host", ["localhost", "localhost:8000", "127.0.0.1:9", "[::1]:8000",
                                  "sqs.us-east-1.localhost:4566", "a.b.localhost"])
async def test_loopback_names_are_allowed(app_factory: AppClient, host: str) -> None:
    client = await app_factory(allowed_hosts=None)
    assert (await client.get("/healthz", headers={"host": host})).status_code == 200


async def test_any_host_when_bound_elsewhere_or_configured(app_factory: AppClient) -> None:
    public = await app_factory(allowed_hosts=None, host="0.0.0.0")
    assert (await public.get("/healthz", headers={"host": "queue.example"})).status_code == 200
    named = await app_factory(allowed_hosts="queue.internal")
    assert (await named.get("/healthz", headers={"host": "queue.internal:443"})).status_code \
        == 200
    assert (await named.get("/healthz", headers={"host": "other"})).status_code == 400
    suffix = await app_factory(allowed_hosts="*.queue.internal")
    assert (await suffix.get("/healthz", headers={"host": "a.queue.internal"})).status_code \
        == 200
    assert (await suffix.get("/healthz", headers={"host": "queue.internal.evil"})).status_code \
        == 400


async def test_cors_is_off_unless_origins_are_configured(app_factory: AppClient) -> None:
    preflight = {"origin": "http://app.example", "access-control-request-method": "POST",
                 "access-control-request-headers": "content-type,authorization"}
    closed = await app_factory()
    response = await closed.options("/v1/queues", headers=preflight)
    assert "access-control-allow-origin" not in response.headers
    opened = await app_factory(cors_origins="http://app.example")
    response = await opened.options("/v1/queues", headers=preflight)
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == "http://app.example"
    listed = await opened.get("/v1/queues", headers={"origin": "http://app.example",
                                                      "sec-fetch-site": "cross-site"})
    assert listed.status_code == 200
    assert listed.headers["access-control-allow-origin"] == "http://app.example"
    other = await opened.get("/v1/queues", headers={"origin": "http://evil.example"})
    assert other.status_code == 403


def test_settings_default_hosts() -> None:
    from app.config import Settings

    assert Settings(host="127.0.0.1").host_allow_list() == [
        "localhost", "*.localhost", "127.0.0.1", "[::1]"]
    assert Settings(host="::1").host_allow_list() is not None
    assert Settings(host="0.0.0.0").host_allow_list() is None
    assert Settings(host="0.0.0.0", allowed_hosts="a,b").host_allow_list() == ["a", "b"]
    assert Settings(allowed_hosts="*").host_allow_list() is None
