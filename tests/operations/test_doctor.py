"""`leaseq doctor` (app/doctor/): run as a real command against the test's
PostgreSQL. A healthy deployment passes every check; each check is then made to
fail once on purpose, and only it fails."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest
from alembic.script import ScriptDirectory
from processes import LEASEQ, free_port, run_cli, service_env
from sqlalchemy.engine import make_url
from support import eventually

from app.db.engine import plain_url
from app.db.migrate import alembic_config

pytestmark = pytest.mark.e2e

SECRET = "doctor-test-secret-0123456789abcdefABCDEF"
CHECKS = ["database", "migration", "secret", "keys", "connections", "autovacuum",
          "horizon", "durability", "clock", "pgbouncer", "receipt keys", "sql api owner"]


def _doctor(database_url: str, *args: str, prefix: tuple[str, ...] = (),
            **env: str) -> tuple[int, dict[str, Any]]:
    environment = {**service_env(database_url), "LEASEQ_SECRET": SECRET, **env}
    environment = {k: v for k, v in environment.items() if v != ""}
    done = run_cli("doctor", "--json", *args, env=environment, command=(*prefix, LEASEQ))
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, json.loads(done.stdout)


def _statuses(report: dict[str, Any]) -> dict[str, str]:
    return {f["check"]: f["status"] for f in report["findings"]}


def _sql(database_url: str, *statements: str) -> None:
    async def run() -> None:
        conn = await asyncpg.connect(plain_url(database_url))
        try:
            for statement in statements:
                await conn.execute(statement)
        finally:
            await conn.close()

    asyncio.run(run())


def _server_autovacuum(database_url: str) -> bool:
    async def read() -> bool:
        conn = await asyncpg.connect(plain_url(database_url))
        try:
            return bool(await conn.fetchval("SELECT current_setting('autovacuum')::boolean"))
        finally:
            await conn.close()

    return asyncio.run(read())


def test_a_healthy_deployment_passes_every_check(database_url: str) -> None:
    status, report = _doctor(database_url)
    assert status == 0, report
    expected = dict.fromkeys(CHECKS, "ok")
    if not _server_autovacuum(database_url):  # some CI servers run so: a warning
        expected["autovacuum"] = "warn"
    assert _statuses(report) == expected
    assert report["ok"] is True
    text = run_cli("doctor", env={**service_env(database_url), "LEASEQ_SECRET": SECRET})
    assert text.returncode == 0
    oks = [line for line in text.stdout.splitlines() if line.startswith("  ok  ")]
    assert len(oks) == list(expected.values()).count("ok")


def _previous_revision(database_url: str) -> str:
    script = ScriptDirectory.from_config(alembic_config(database_url))
    current = script.get_current_head()
    assert current is not None
    head = script.get_revision(current)
    assert head is not None and isinstance(head.down_revision, str)
    return head.down_revision


def _over_a_socket(database_url: str) -> bool:
    host = make_url(database_url).query.get("host") or make_url(database_url).host or ""
    return str(host).startswith("/")


def _database_name(database_url: str) -> str:
    return str(make_url(database_url).database)


Broken = tuple[tuple[str, ...], dict[str, str], tuple[str, ...]]
"""The doctor's arguments, its environment and a command before it."""


def _unreachable(url: str) -> Broken:
    # Over TCP to a port nobody listens on (the query's host and port, a Unix
    # socket's, would win over the URL's own).
    moved = make_url(url).difference_update_query(["host", "port"]).set(
        host="127.0.0.1", port=free_port(), password="not-the-password")
    return (), {"DATABASE_URL": moved.render_as_string(hide_password=False)}, ()


def _behind(url: str) -> Broken:
    _sql(url, f"UPDATE leaseq.alembic_version SET version_num = '{_previous_revision(url)}'")
    return (), {}, ()


def _no_autovacuum(url: str) -> Broken:
    _sql(url, "ALTER TABLE leaseq.messages_g0 SET (autovacuum_enabled = false)")
    return (), {}, ()


def _asynchronous_commit(url: str) -> Broken:
    _sql(url, f'ALTER DATABASE "{_database_name(url)}" SET synchronous_commit = off')
    return (), {}, ()


def _an_hour_ahead(url: str) -> Broken:
    return (), {}, (shutil.which("faketime") or "faketime", "-f", "+1h")


def _old_receipt_key(url: str) -> Broken:
    _sql(url, "INSERT INTO leaseq.receipt_keys (id, secret, created_at) "
              "VALUES (1, '\\x00', now() - interval '400 days')")
    return (), {}, ()


def _superuser_definer(url: str) -> Broken:
    # The test connects as a superuser (the embedded server's, or PostgreSQL's own).
    _sql(url, "ALTER FUNCTION leaseq.send(text, text, jsonb, integer, text, text) "
              "OWNER TO CURRENT_USER")
    return (), {}, ()


CASES: dict[str, tuple[str, Callable[[str], Broken]]] = {
    "database": ("fail", _unreachable),
    "migration": ("fail", _behind),
    "settings": ("fail", lambda url: ((), {"LEASEQ_SECRET": "short"}, ())),
    "secret": ("fail", lambda url: (("--replicas", "2"), {"LEASEQ_SECRET": ""}, ())),
    "keys": ("fail", lambda url: ((), {"LEASEQ_HOST": "0.0.0.0"}, ())),
    "connections": ("fail", lambda url: (("--replicas", "1000"), {}, ())),
    "autovacuum": ("warn", _no_autovacuum),  # leaseq vacuums the table itself then
    "durability": ("fail", _asynchronous_commit),
    "clock": ("fail", _an_hour_ahead),
    "pgbouncer": ("fail", lambda url: ((), {"LEASEQ_PGBOUNCER": "transaction",
                                            "LEASEQ_LISTEN_URL": url}, ())),
    "receipt keys": ("warn", _old_receipt_key),
    "sql api owner": ("fail", _superuser_definer),
}


@pytest.mark.parametrize("check", list(CASES))
def test_each_check_fails_once_on_purpose(database_url: str, check: str) -> None:
    if check == "clock" and shutil.which("faketime") is None:
        pytest.skip("faketime is not installed (apt-get install faketime)")
    if check == "pgbouncer" and _over_a_socket(database_url):
        pytest.skip("the test's database is reached over a Unix socket, whose server port "
                    "cannot be compared (the PostgreSQL 15 pass over TCP runs this case)")
    expected, breaks = CASES[check]
    args, env, prefix = breaks(database_url)
    status, report = _doctor(database_url, *args, prefix=prefix, **env)
    found = _statuses(report)
    assert found[check] == expected, report
    others = {name: s for name, s in found.items() if name not in (check, "autovacuum")}
    assert all(s == "ok" for s in others.values()), report
    assert status == (1 if expected == "fail" else 0)
    (finding,) = [f for f in report["findings"] if f["check"] == check]
    assert finding["fix"], "a finding says how to fix it"
    if check == "autovacuum":  # the table's own setting, whatever the server's
        assert ("for the messages table" in finding["found"]) == _server_autovacuum(
            database_url)


def test_sql_api_owner_fails_when_another_role_may_act_as_the_owner(
    database_url: str,
) -> None:
    """A member of the functions' owner may SET ROLE to it and read every message
    and receipt key past leaseq.grants: as bad as a superuser owner."""
    member = "doctor_member_" + str(make_url(plain_url(database_url)).database)[-8:]
    _sql(database_url, f'CREATE ROLE "{member}" LOGIN',
         "DO $$ BEGIN EXECUTE format('GRANT %I TO " + member + "', (SELECT p.proowner::regrole"
         "::text FROM pg_proc AS p WHERE p.oid = 'leaseq.delete(text, text)'::regprocedure)); "
         "END $$")
    try:
        status, report = _doctor(database_url)
        (finding,) = [f for f in report["findings"] if f["check"] == "sql api owner"]
        assert finding["status"] == "fail", report
        assert member in finding["found"] and finding["fix"]
        assert status == 1
    finally:
        _sql(database_url, f'DROP ROLE "{member}"')


async def test_horizon_warns_naming_the_session_that_holds_it(database_url: str) -> None:
    """A snapshot left open (psql's forgotten BEGIN) while others write: the doctor
    names its session and how to end it; once it ends, the check passes."""
    url = plain_url(database_url)
    holder = await asyncpg.connect(url, server_settings={"application_name": "doctor-holder"})
    writer = await asyncpg.connect(url)
    try:
        await holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await holder.fetchval("SELECT 1")
        pid = holder.get_server_pid()
        # Transactions that begin and end past its snapshot: what it keeps from VACUUM.
        for _ in range(3):
            await writer.execute("SELECT pg_current_xact_id()")

        async def older_than_the_threshold() -> bool:
            return bool(await writer.fetchval(
                "SELECT clock_timestamp() - xact_start > interval '0.5 s' "
                "FROM pg_stat_activity WHERE pid = $1", pid))

        await eventually(older_than_the_threshold, seconds=10)
        status, report = await asyncio.to_thread(
            _doctor, database_url, LEASEQ_HORIZON_WARN_SECONDS="0.5")
        (finding,) = [f for f in report["findings"] if f["check"] == "horizon"]
        assert finding["status"] == "warn", report
        assert f"by pid {pid} (application doctor-holder, user " in finding["found"]
        assert "idle in transaction" in finding["found"]
        assert f"SELECT pg_terminate_backend({pid})" in finding["fix"]
        assert status == 0  # a warning
    finally:
        await holder.close()
        await writer.close()
    _, report = await asyncio.to_thread(_doctor, database_url,
                                        LEASEQ_HORIZON_WARN_SECONDS="0.5")
    assert _statuses(report)["horizon"] == "ok", report
