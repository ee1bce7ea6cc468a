"""The `leaseq` command as an operator runs it: real processes, real PostgreSQL."""

from __future__ import annotations

import asyncio
import sys
import uuid
from pathlib import Path

import asyncpg
import pytest
from alembic.script import ScriptDirectory
from conftest import drop_sql_api_role
from processes import (
    LEASEQ,
    Service,
    ServiceProcesses,
    postgres_processes,
    run_cli,
    service_env,
)
from sqlalchemy.engine import make_url
from support import TEST_SECRET, stored_then_revoked

from app.db.engine import plain_url
from app.db.migrate import alembic_config

pytestmark = pytest.mark.e2e

ADMIN_KEY = "LQCLIBOOTSTRAP000001.cli-admin-secret-0123456789abcdef"


def round_trip(service: Service, queue: str = "cli") -> str:
    """Readiness, then create, send and receive: the service really works."""
    with service.client() as client:
        ready = client.get("/readyz")
        assert ready.status_code == 200, ready.text
        created = client.post("/v1/queues", json={"name": queue})
        assert created.status_code == 201, created.text
        sent = client.post(f"/v1/queues/{queue}/messages", json={"body": "hi"})
        assert sent.status_code == 201, sent.text
        received = client.get(f"/v1/queues/{queue}/receive", params={"wait": 0})
        assert received.status_code == 200, received.text
        (message,) = received.json()["messages"]
        assert message["body"] == "hi"
        # uvicorn's `server` header is off; the date a response needs is kept
        assert "server" not in received.headers and "date" in received.headers
        message_id: str = sent.json()["message_id"]
        assert message["message_id"] == message_id
        return message_id


def test_serve_with_host_port_and_data_dir(services: ServiceProcesses, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    service = services.start(data_dir)  # leaseq serve --host 127.0.0.1 --port P --data-dir D
    service.wait_healthy()
    round_trip(service)
    assert (data_dir / "pgdata" / "PG_VERSION").exists()
    assert service.stop() == 0, service.log()
    assert not postgres_processes(data_dir)


def test_python_dash_m_app_serves(services: ServiceProcesses, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    service = services.start(data_dir, command=[sys.executable, "-m", "app"], cwd=tmp_path)
    service.wait_healthy()
    round_trip(service)
    assert service.stop() == 0, service.log()
    assert not postgres_processes(data_dir)


async def _fetch_message_ids(url: str, queue: str) -> list[str]:
    conn = await asyncpg.connect(plain_url(url))
    try:
        rows = await conn.fetch(
            "SELECT m.message_id::text AS id FROM leaseq.messages m JOIN leaseq.queues q ON "
            "q.id = m.queue_id"
            " WHERE q.name = $1",
            queue,
        )
    finally:
        await conn.close()
    return [row["id"] for row in rows]


def test_serve_with_database_url_uses_it_and_starts_no_embedded_server(
    services: ServiceProcesses, tmp_path: Path, database_url: str
) -> None:
    data_dir = tmp_path / "data"
    service = services.start(data_dir, database_url=database_url)
    service.wait_healthy()
    message_id = round_trip(service, queue="external")
    # The message is in the database DATABASE_URL names...
    assert asyncio.run(_fetch_message_ids(database_url, "external")) == [message_id]
    # ...and no embedded server was set up or started.
    assert not (data_dir / "pgdata").exists()
    assert service.stop() == 0, service.log()


async def _admin(url: str, statement: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


async def _schema(url: str) -> tuple[set[str], list[str]]:
    conn = await asyncpg.connect(url)
    try:
        tables = await conn.fetch(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'leaseq'"
        )
        versions = await conn.fetch("SELECT version_num FROM leaseq.alembic_version")
    finally:
        await conn.close()
    return {row["table_name"] for row in tables}, [row["version_num"] for row in versions]


def test_migrate_applies_migrations_to_an_empty_database(server_url: str) -> None:
    name = f"leaseq_migrate_{uuid.uuid4().hex[:10]}"
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    asyncio.run(_admin(server_url, f'CREATE DATABASE "{name}"'))
    try:
        head = ScriptDirectory.from_config(alembic_config(url)).get_current_head()
        for attempt in ("first", "again"):  # a second run is a no-op, not an error
            result = run_cli("migrate", env=service_env(database_url=url))
            assert result.returncode == 0, f"{attempt}: {result.stdout}{result.stderr}"
            tables, versions = asyncio.run(_schema(url))
            assert {"queues", "messages", "alembic_version"} <= tables
            assert versions == [head]
    finally:
        asyncio.run(_admin(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        asyncio.run(_admin(server_url, drop_sql_api_role(name)))


def test_migrate_without_database_url_exits_2() -> None:
    result = run_cli("migrate", env=service_env())
    assert result.returncode == 2
    assert "DATABASE_URL" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "command", [(LEASEQ,), (sys.executable, "-m", "app")], ids=["leaseq", "python-m-app"]
)
def test_help(command: tuple[str, ...]) -> None:
    top = run_cli("--help", command=command)
    assert top.returncode == 0, top.stderr
    assert "serve" in top.stdout and "migrate" in top.stdout
    serve = run_cli("serve", "--help", command=command)
    assert serve.returncode == 0, serve.stderr
    for option in ("--host", "--port", "--data-dir"):
        assert option in serve.stdout


def test_keys_commands_on_the_database(database_url: str) -> None:
    env = service_env(database_url=plain_url(database_url))
    env["LEASEQ_SECRET"] = TEST_SECRET
    created = run_cli("keys", "create", "--name", "ci", "--scope", "send:orders-*",
                      "--scope", "read:*", "--expires", "90d", env=env)
    several = run_cli("keys", "create", "--name", "two", "--scope", "send:a", "receive:a",
                      env=env)
    assert several.returncode == 0 and "scopes:  send:a receive:a" in several.stdout
    assert created.returncode == 0, created.stderr
    lines = dict(line.split(":", 1) for line in created.stdout.splitlines() if ": " in line)
    key_id, secret = lines["key id"].strip(), lines["secret"].strip()
    assert len(secret) == 40 and f"Bearer {key_id}.{secret}" in created.stdout
    listed = run_cli("keys", "list", env=env)
    assert key_id in listed.stdout and "send:orders-* read:*" in listed.stdout
    assert secret not in listed.stdout
    assert run_cli("keys", "revoke", key_id, env=env).returncode == 0
    assert "revoked" in run_cli("keys", "list", env=env).stdout
    again = run_cli("keys", "revoke", key_id, env=env)
    assert again.returncode == 1
    bad = run_cli("keys", "create", "--name", "x", "--scope", "write:*", env=env)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    rotated = run_cli("keys", "rotate-receipts", env=env)
    assert rotated.returncode == 0 and "receipt key 2" in rotated.stdout, rotated.stderr


def test_serve_refuses_a_public_address_without_a_key(database_url: str) -> None:
    env = service_env(database_url=plain_url(database_url))
    no_secret = run_cli("serve", "--host", "0.0.0.0", "--port", "0", env=env)
    assert no_secret.returncode == 2
    assert "LEASEQ_SECRET" in no_secret.stderr and "Traceback" not in no_secret.stderr
    env["LEASEQ_SECRET"] = TEST_SECRET
    no_key = run_cli("serve", "--host", "0.0.0.0", "--port", "0", env=env)
    assert no_key.returncode == 2
    assert "leaseq keys create" in no_key.stderr and "--insecure" in no_key.stderr


def test_a_secret_file_does_not_stand_for_leaseq_secret_with_database_url(
    database_url: str, tmp_path: Path
) -> None:
    """A secret left in the data directory (by an earlier `leaseq serve` on the
    embedded database) is one host's: with DATABASE_URL, replicas could not share
    it, so a public address still needs LEASEQ_SECRET, and is told how to keep it."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "receipt-secret").write_text(TEST_SECRET)
    env = service_env(database_url=plain_url(database_url))
    refused = run_cli("serve", "--host", "0.0.0.0", "--port", "0", "--data-dir", str(data_dir),
                      env=env)
    assert refused.returncode == 2, refused.stderr
    assert "no LEASEQ_SECRET" in refused.stderr
    assert f"$(cat {data_dir / 'receipt-secret'})" in refused.stderr


def test_the_embedded_database_serves_a_public_address_with_its_own_secret(
    services: ServiceProcesses, tmp_path: Path
) -> None:
    """With the embedded database the data directory's secret is the right one:
    it sits beside the only database it seals keys for."""
    data_dir = tmp_path / "data"
    service = services.start(data_dir, extra_args=("--host", "0.0.0.0"),
                             env={"LEASEQ_ADMIN_KEY": ADMIN_KEY})
    service.wait_healthy()
    assert (data_dir / "receipt-secret").exists()
    with service.client() as client:
        assert client.get("/v1/queues").status_code == 401
        listed = client.get("/v1/queues", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
        assert listed.status_code == 200, listed.text
    assert service.stop() == 0, service.log()


def test_a_revoked_bootstrap_key_does_not_pass_protected_mode(database_url: str) -> None:
    asyncio.run(stored_then_revoked(database_url, ADMIN_KEY))
    env = service_env(database_url=plain_url(database_url))
    env.update(LEASEQ_SECRET=TEST_SECRET, LEASEQ_ADMIN_KEY=ADMIN_KEY)
    refused = run_cli("serve", "--host", "0.0.0.0", "--port", "0", env=env)
    assert refused.returncode == 2
    assert "no usable API key" in refused.stderr and "stays revoked" in refused.stderr


@pytest.mark.parametrize(("variable", "value", "says"), [
    ("LEASEQ_ADMIN_KEY", "not-a-key", "LEASEQ_ADMIN_KEY: LEASEQ_ADMIN_KEY must be <key id>"),
    ("LEASEQ_SECRET", "too-short", "LEASEQ_SECRET: LEASEQ_SECRET is too weak"),
])
def test_serve_refuses_bad_settings_clearly(variable: str, value: str, says: str) -> None:
    env = service_env()
    env[variable] = value
    refused = run_cli("serve", "--port", "0", env=env)
    assert refused.returncode == 2
    assert says in refused.stderr and "Traceback" not in refused.stderr
    assert value not in refused.stderr  # a secret is never echoed


def test_serve_insecure_listens_open_on_a_public_address(
    services: ServiceProcesses, tmp_path: Path
) -> None:
    service = services.start(tmp_path / "data", extra_args=("--host", "0.0.0.0", "--insecure"))
    service.wait_healthy()
    round_trip(service, "insecure")
    assert service.stop() == 0, service.log()
