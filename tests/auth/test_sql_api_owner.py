"""The SQL API's SECURITY DEFINER functions run as a role of their own: NOLOGIN, no
superuser, holding only what the functions touch. Migrated by a superuser (the
embedded server's, the compose file's, this suite's), they would otherwise run as
one; migrated by an owner that may not create roles, they stay that owner's."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest
from alembic.script import ScriptDirectory
from conftest import drop_sql_api_role, with_database
from sqlalchemy.engine import make_url
from support import make_queue, receive

from alembic import command
from app.db.engine import plain_url
from app.db.migrate import alembic_config, upgrade

OWNER_REVISION = "0018"
"""The migration that gives the functions their role."""

DEFINERS = ("send", "send_batch", "delete", "change_visibility")

_OWNERS = """
    SELECT p.proname, r.rolname, r.rolsuper, r.rolcanlogin, r.rolcreaterole,
           r.rolcreatedb, r.rolbypassrls, r.rolreplication
    FROM pg_proc AS p JOIN pg_roles AS r ON r.oid = p.proowner
    WHERE p.pronamespace = 'leaseq'::regnamespace AND p.prosecdef
    ORDER BY p.proname
"""


async def test_the_definer_functions_run_as_a_role_that_is_no_superuser(
    db: asyncpg.Connection,
) -> None:
    owners = await db.fetch(_OWNERS)
    assert sorted(o["proname"] for o in owners) == sorted(DEFINERS)
    assert len({o["rolname"] for o in owners}) == 1
    (owner,) = {o["rolname"] for o in owners}
    assert owner.startswith("leaseq_sql_api_")
    assert not any(any(o[k] for k in ("rolsuper", "rolcanlogin", "rolcreaterole",
                                      "rolcreatedb", "rolbypassrls", "rolreplication"))
                   for o in owners), owners
    # What it holds: the tables the functions write and read, nothing else.
    can = await db.fetchrow(
        """
        SELECT has_table_privilege($1, 'leaseq.api_keys', 'SELECT') AS api_keys,
               has_table_privilege($1, 'leaseq.queues', 'DELETE') AS delete_queues,
               has_table_privilege($1, 'leaseq.grants', 'INSERT') AS insert_grants,
               has_table_privilege($1, 'leaseq.messages', 'INSERT') AS insert_messages,
               has_function_privilege($1, 'leaseq.add_grant(text, text)', 'EXECUTE')
                   AS add_grant,
               has_schema_privilege($1, 'leaseq', 'CREATE') AS create_in_schema
        """, owner)
    assert dict(can) == {"api_keys": False, "delete_queues": False, "insert_grants": False,
                         "insert_messages": True, "add_grant": False,
                         "create_in_schema": False}


async def test_a_granted_role_sends_and_settles_through_the_owner_role(
    client: httpx.AsyncClient, db: asyncpg.Connection, database_url: str,
) -> None:
    role = f"app_{uuid.uuid4().hex[:8]}"
    await db.execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        await make_queue(client, "plain")
        await make_queue(client, "ordered.fifo", fifo=True)
        await db.execute("SELECT leaseq.add_grant($1, 'admin:*')", role)
        url = make_url(plain_url(database_url)).set(username=role)
        conn = await asyncpg.connect(url.render_as_string(hide_password=False))
        try:
            await conn.execute("SELECT leaseq.send('plain', 'one')")
            await conn.execute("SELECT leaseq.send('plain', 'two', \"group\" => 'tenant-a')")
            await conn.execute("SELECT * FROM leaseq.send_batch('plain', ARRAY['three'])")
            await conn.execute("SELECT leaseq.send('ordered.fifo', 'f', \"group\" => 'g', "
                               "deduplication_id => 'd')")
            got = await receive(client, "plain", max=10)
            assert sorted(m["body"] for m in got) == ["one", "three", "two"]
            for message in got[:2]:
                await conn.execute("SELECT leaseq.delete('plain', $1)",
                                   message["receipt_handle"])
            await conn.execute("SELECT leaseq.change_visibility('plain', $1, 0)",
                               got[2]["receipt_handle"])
            (fifo,) = await receive(client, "ordered.fifo")
            await conn.execute("SELECT leaseq.delete('ordered.fifo', $1)",
                               fifo["receipt_handle"])
        finally:
            await conn.close()
        left = await db.fetch("SELECT body FROM leaseq.messages ORDER BY id")
        assert [r["body"] for r in left] == [got[2]["body"]]
    finally:
        await db.execute("DELETE FROM leaseq.grants")
        await db.execute(f'DROP ROLE IF EXISTS "{role}"')


@pytest.fixture(params=["NOCREATEROLE", "CREATEROLE"])
async def owned_database(
    server_url: str, request: pytest.FixtureRequest,
) -> AsyncIterator[tuple[str, str, bool]]:
    """A database owned by a login role that is no superuser, as a managed
    PostgreSQL's application owner is, one that may create roles or one that may
    not: (its URL as that role, the role, whether it may create roles)."""
    owner = f"owner_{uuid.uuid4().hex[:8]}"
    name = f"leaseq_o_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(server_url)
    await admin.execute(f'CREATE ROLE "{owner}" LOGIN NOSUPERUSER {request.param}')
    await admin.execute(f'CREATE DATABASE "{name}" OWNER "{owner}"')
    url = make_url(with_database(server_url, name)).set(username=owner)
    try:
        yield url.render_as_string(hide_password=False), owner, request.param == "CREATEROLE"
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.execute(drop_sql_api_role(name))
        await admin.execute(f'DROP ROLE IF EXISTS "{owner}"')
        await admin.close()


def _role_of(database: str) -> str:
    return "leaseq_sql_api_" + hashlib.md5(database.encode()).hexdigest()[:12]


async def test_an_owner_that_is_no_superuser_gets_the_role_only_if_it_may_make_it(
    owned_database: tuple[str, str, bool],
) -> None:
    url, owner, may_create_roles = owned_database
    await asyncio.to_thread(upgrade, url)
    conn = await asyncpg.connect(plain_url(url))
    try:
        owners = {(o["rolname"], o["rolsuper"]) for o in await conn.fetch(_OWNERS)}
        name = str(make_url(url).database)
        assert owners == {(_role_of(name) if may_create_roles else owner, False)}
        await conn.execute("INSERT INTO leaseq.queues (name) VALUES ('q')")
        await conn.execute("SELECT leaseq.send('q', 'as the owner')")  # the owner needs no grant
        assert await conn.fetchval("SELECT count(*) FROM leaseq.messages") == 1
    finally:
        await conn.close()


async def test_the_owner_role_comes_and_goes_with_its_migration(server_url: str) -> None:
    """Downgraded, the functions go back to the schema's owner and the role is
    dropped; upgraded again, it is made again (CREATE ROLE raced by replicas of
    several databases of one cluster is taken as done)."""
    name = f"leaseq_m_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(server_url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    url = with_database(server_url, name)
    try:
        await asyncio.to_thread(upgrade, url)
        conn = await asyncpg.connect(plain_url(url))
        try:
            (role,) = {o["rolname"] for o in await conn.fetch(_OWNERS)}
            head = await conn.fetchval("SELECT version_num FROM leaseq.alembic_version")
            before = ScriptDirectory.from_config(alembic_config(url)).get_revision(
                OWNER_REVISION).down_revision
            assert isinstance(before, str)
            await asyncio.to_thread(command.downgrade, alembic_config(url), before)
            assert {o["rolsuper"] for o in await conn.fetch(_OWNERS)} == {True}
            assert await conn.fetchval("SELECT to_regrole($1)", role) is None
            await asyncio.to_thread(upgrade, url)
            assert {o["rolname"] for o in await conn.fetch(_OWNERS)} == {role}
            assert await conn.fetchval("SELECT version_num FROM leaseq.alembic_version") == head
        finally:
            await conn.close()
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        # Roles belong to the server: this database's is not left behind.
        await admin.execute(drop_sql_api_role(name))
        await admin.close()


# A role of the SQL API role's name made before the migration, and how each
# setup would let another role act as the functions' owner; then what undoes it.
_PLANTED = {
    "with a member": ('GRANT "{role}" TO "{other}"', 'REVOKE "{role}" FROM "{other}"'),
    "member of a role": ('GRANT "{other}" TO "{role}"', 'REVOKE "{other}" FROM "{role}"'),
    "holding privileges": ('GRANT USAGE ON SCHEMA side TO "{role}"',
                           'REVOKE USAGE ON SCHEMA side FROM "{role}"'),
}


@pytest.mark.parametrize("planted", list(_PLANTED))
async def test_a_role_of_that_name_made_beforehand_is_refused(
    server_url: str, planted: str,
) -> None:
    """The role's name is predictable: one made ahead of the migration, granted
    to another role (or holding more), would let that role SET ROLE to the
    functions' owner and read every message and receipt key past leaseq.grants.
    The migration stops and says so; undone, it migrates."""
    name = f"leaseq_p_{uuid.uuid4().hex[:10]}"
    role, other = _role_of(name), f"mallory_{uuid.uuid4().hex[:8]}"
    grant, undo = (s.format(role=role, other=other) for s in _PLANTED[planted])
    admin = await asyncpg.connect(server_url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    url = with_database(server_url, name)
    conn = await asyncpg.connect(plain_url(url))
    try:
        await admin.execute(f'CREATE ROLE "{role}" NOLOGIN')
        await admin.execute(f'CREATE ROLE "{other}" LOGIN')
        await conn.execute("CREATE SCHEMA side")
        await conn.execute(grant)
        with pytest.raises(RuntimeError, match=role):
            await asyncio.to_thread(upgrade, url)
        assert await conn.fetchval(
            "SELECT count(*) FROM pg_proc WHERE proowner = to_regrole($1)", role) == 0
        await conn.execute(undo)
        await asyncio.to_thread(upgrade, url)
        assert {o["rolname"] for o in await conn.fetch(_OWNERS)} == {role}
    finally:
        await conn.close()
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.execute(drop_sql_api_role(name))
        await admin.execute(f'DROP ROLE IF EXISTS "{other}"')
        await admin.close()
