"""A database that cannot be reached is 503 database_unavailable, never a 500."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx

from app.config import Settings
from app.main import create_app


async def test_unreachable_database_is_503(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings = Settings(
        database_url=f"postgresql://postgres@127.0.0.1:{port}/nothing",
        data_dir=tmp_path,
        secret="test-secret-0123456789abcdef",
        retention_sweep_seconds=3600,
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            for method, path, body in (
                ("GET", "/readyz", None),
                ("POST", "/v1/queues", {"name": "q"}),
                ("GET", "/v1/queues/q/receive", None),
                ("POST", "/v1/queues/q/messages", {"body": "x"}),
            ):
                response = await client.request(method, path, json=body)
                assert response.status_code == 503, (path, response.text)
                assert response.headers["content-type"] == "application/problem+json"
                assert response.json()["code"] == "database_unavailable"
            assert (await client.get("/healthz")).status_code == 200
