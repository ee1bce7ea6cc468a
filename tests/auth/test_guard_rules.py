"""Default deny: every route the app serves is either open by design or named
by a rule of the Guard (app/auth/guard.py); a path no rule names is refused to
every key. And /metrics shows a scoped key only its own queues."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import AppClient

from app.auth.access import needs_of_route
from app.auth.guard import is_dashboard_page, is_sqs_door
from app.config import Settings
from app.main import _open_paths, create_app

ADMIN = "LQBOOTSTRAPADMIN0001.admin-secret-0123456789abcdefghij"


def _routes(routes: list[Any], prefix: str = "") -> Iterator[tuple[str, str, Any]]:
    """(method, path template, route) of every route, through included routers."""
    for route in routes:
        if hasattr(route, "original_router"):
            yield from _routes(route.original_router.routes,
                               prefix + route.include_context.prefix)
        elif hasattr(route, "methods"):
            for method in route.methods:
                yield method, prefix + route.path, route


def _example(template: str) -> str:
    return re.sub(r"\{[^}]+\}", "x1", template)


def test_every_route_is_open_by_design_or_declares_what_it_touches() -> None:
    settings = Settings(database_url="postgresql://nobody@127.0.0.1/none")
    app = create_app(settings)
    open_paths = _open_paths(settings)
    routes = sorted(_routes(app.routes), key=lambda r: (r[1], r[0]))
    assert len(routes) > 30  # the walk found the routers' routes
    undeclared = [
        (method, template) for method, template, route in routes
        if not (
            _example(template) in open_paths or template in open_paths
            or template == app.openapi_url  # FastAPI's own: declared in create_app
            or template.startswith("/docs/assets/")
            or is_sqs_door(_example(template).replace("x1", "000000000000", 1))
            or is_dashboard_page(_example(template))
            or needs_of_route(route) is not None
        )
    ]
    assert undeclared == [], "routes without a declaration (app/auth/access.py scopes())"


async def test_a_path_no_rule_names_is_refused_to_every_key(app_factory: AppClient) -> None:
    client = await app_factory(admin_key=ADMIN)
    refused = await client.get("/v1/no-such-thing", headers={"Authorization": f"Bearer {ADMIN}"})
    assert refused.status_code == 403 and refused.json()["code"] == "forbidden"
    assert (await client.get("/v1/no-such-thing")).status_code == 401


@pytest.mark.parametrize("path", ["/openapi.json", "/docs", "/redoc"])
async def test_any_key_reads_the_api_description(app_factory: AppClient, path: str) -> None:
    client = await app_factory(admin_key=ADMIN)
    info, secret = await client.app.state.keys.create("s", ["send:one"])  # type: ignore[attr-defined]
    assert (await client.get(path, headers={"Authorization": f"Bearer {info.id}.{secret}"})
            ).status_code == 200


async def test_metrics_show_a_scoped_key_only_its_queues(app_factory: AppClient) -> None:
    client = await app_factory(admin_key=ADMIN)
    admin = {"Authorization": f"Bearer {ADMIN}"}
    for name in ("team-a-jobs", "secret-billing"):
        assert (await client.post("/v1/queues", json={"name": name},
                                  headers=admin)).status_code == 201
    keys = client.app.state.keys  # type: ignore[attr-defined]

    async def scrape(*scopes: str) -> Any:
        info, secret = await keys.create("m", list(scopes))
        return await client.get("/metrics", headers={"Authorization": f"Bearer {info.id}.{secret}"})

    full = await scrape("read:*")
    assert full.status_code == 200
    assert 'queue="team-a-jobs"' in full.text and 'queue="secret-billing"' in full.text
    team = await scrape("read:team-a-*")
    assert team.status_code == 200
    assert 'queue="team-a-jobs"' in team.text and "secret-billing" not in team.text
    assert "process_cpu_seconds_total" in team.text or "leaseq_" in team.text
    assert (await scrape("send:*")).status_code == 403  # no read on any queue
