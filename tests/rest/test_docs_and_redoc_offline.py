"""/docs and /redoc work on a network without the internet: every script, style and
image they load is served by leaseq itself, open even where API keys guard the rest."""

from __future__ import annotations

import re

import httpx
from conftest import AppClient

ADMIN = "LQDOCSADMIN000000001.docs-admin-secret-0123456789"


def loaded(html: str) -> list[str]:
    """Every URL a page loads: scripts, styles, images."""
    return re.findall(r'(?:src|href)=["\']([^"\']+)["\']', html)


async def test_the_pages_load_nothing_from_elsewhere(client: httpx.AsyncClient) -> None:
    for page in ("/docs", "/redoc"):
        response = await client.get(page)
        assert response.status_code == 200
        urls = loaded(response.text)
        assert urls, page
        assert all(url.startswith("/docs/assets/") for url in urls), urls
        assert "cdn." not in response.text and "fonts.googleapis" not in response.text
        assert "/openapi.json" in response.text
        for url in urls:
            asset = await client.get(url)
            assert asset.status_code == 200, url
            assert len(asset.content) > 1000
            assert asset.headers["cache-control"] == "public, max-age=86400"
    script = await client.get("/docs/assets/swagger-ui-bundle.js")
    assert script.headers["content-type"].startswith("text/javascript")
    assert (await client.get("/docs/assets/redoc.standalone.js")).status_code == 200
    assert (await client.get("/docs/oauth2-redirect")).status_code == 200
    missing = await client.get("/docs/assets/secrets.txt")
    assert missing.status_code == 404 and missing.json()["code"] == "not_found"


async def test_the_assets_are_open_where_keys_guard_the_pages(app_factory: AppClient) -> None:
    client = await app_factory(admin_key=ADMIN)
    assert (await client.get("/docs")).status_code == 401
    assert (await client.get("/docs/assets/swagger-ui.css")).status_code == 200
    # Only the files of the pages: any other path below them needs a key.
    assert (await client.get("/docs/assets/../../v1/queues")).status_code == 401
    assert (await client.get("/docs/assets/other.js")).status_code == 401
    opened = await app_factory(admin_key=ADMIN, open_docs=True)
    assert (await opened.get("/docs")).status_code == 200
    assert (await opened.get("/redoc")).status_code == 200
