"""Who may call the SQL API: PostgreSQL's own roles, allowed by grants in the
scope words of API keys (`leaseq grants add ROLE send:orders-*`)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest
from processes import run_cli, service_env
from sqlalchemy.engine import make_url
from support import make_queue, receive, send

from app.db.engine import plain_url


@pytest.fixture
async def roles(db: asyncpg.Connection) -> AsyncIterator[dict[str, str]]:
    """Roles of this test's own (roles belong to the server, not the database)."""
    suffix = uuid.uuid4().hex[:8]
    made = {
        "app": f"app_{suffix}",  # logs in, granted nothing of its own
        "senders": f"senders_{suffix}",  # a group role: its members inherit its grants
        "stranger": f"stranger_{suffix}",
    }
    await db.execute(f'CREATE ROLE "{made["senders"]}" NOLOGIN')
    await db.execute(f'CREATE ROLE "{made["app"]}" LOGIN IN ROLE "{made["senders"]}"')
    await db.execute(f'CREATE ROLE "{made["stranger"]}" LOGIN')
    try:
        yield made
    finally:
        await db.execute("DELETE FROM leaseq.grants")
        for role in made.values():
            await db.execute(f'DROP ROLE IF EXISTS "{role}"')


async def connect_as(database_url: str, role: str) -> asyncpg.Connection:
    url = make_url(plain_url(database_url)).set(username=role)
    return await asyncpg.connect(url.render_as_string(hide_password=False))


def grants(database_url: str, *args: str) -> str:
    done = run_cli("grants", *args, env=service_env(database_url))
    assert done.returncode == 0, done.stderr + done.stdout
    return done.stdout


async def test_a_role_without_a_grant_is_refused_and_reads_no_table(
    client: httpx.AsyncClient, database_url: str, roles: dict[str, str]
) -> None:
    queue = await make_queue(client, "orders-eu")
    await send(client, queue)
    (message,) = await receive(client, queue)
    conn = await connect_as(database_url, roles["stranger"])
    try:
        for statement, args in (
            ("SELECT leaseq.send($1, 'x')", (queue,)),
            ("SELECT leaseq.send($1, 'x')", ("no-such-queue",)),  # refused before looked up
            ("SELECT * FROM leaseq.send_batch($1, ARRAY['x'])", (queue,)),
            ("SELECT leaseq.delete($1, $2)", (queue, message["receipt_handle"])),
            ("SELECT leaseq.change_visibility($1, $2, 0)", (queue, message["receipt_handle"])),
        ):
            with pytest.raises(asyncpg.InsufficientPrivilegeError) as refused:
                await conn.execute(statement, *args)
            assert roles["stranger"] in str(refused.value)
        # The tables (the receipt keys above all) and the functions behind the API.
        for statement in (
            "SELECT secret FROM leaseq.receipt_keys",
            "SELECT * FROM leaseq.messages",
            "SELECT * FROM leaseq.grants",
            "INSERT INTO leaseq.grants (role, action, pattern) VALUES (current_user, 'admin', '*')",
            "SELECT leaseq.add_grant(current_user, 'admin:*')",
            "SELECT * FROM leaseq.open_receipt(1, 'x')",
            "SELECT leaseq.notice(1, 1, NULL)",
        ):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute(statement)
    finally:
        await conn.close()
    assert [m["message_id"] for m in await receive(client, queue, wait=0)] == []  # still held


async def test_grants_allow_by_queue_pattern_and_action_and_are_inherited(
    client: httpx.AsyncClient, database_url: str, roles: dict[str, str]
) -> None:
    for name in ("orders-eu", "orders-us", "billing"):
        await make_queue(client, name)
    grants(database_url, "add", roles["senders"], "send:orders-*")
    grants(database_url, "add", roles["app"], "receive:orders-eu")
    listed = grants(database_url, "list")
    assert f"{roles['senders']}" in listed and "send:orders-*" in listed
    conn = await connect_as(database_url, roles["app"])
    try:
        # Through the group role it is a member of.
        await conn.execute("SELECT leaseq.send('orders-eu', 'a')")
        await conn.execute("SELECT leaseq.send('orders-us', 'b')")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("SELECT leaseq.send('billing', 'c')")
        (eu,) = await receive(client, "orders-eu")
        (us,) = await receive(client, "orders-us")
        await conn.execute("SELECT leaseq.change_visibility('orders-eu', $1, 60)",
                           eu["receipt_handle"])
        await conn.execute("SELECT leaseq.delete('orders-eu', $1)", eu["receipt_handle"])
        # A send grant is not a receive grant.
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("SELECT leaseq.delete('orders-us', $1)", us["receipt_handle"])
        grants(database_url, "remove", roles["senders"], "send:orders-*")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("SELECT leaseq.send('orders-eu', 'after')")
    finally:
        await conn.close()


async def test_set_role_acts_as_the_role_set(
    client: httpx.AsyncClient, database_url: str, roles: dict[str, str]
) -> None:
    await make_queue(client, "orders-eu")
    grants(database_url, "add", roles["senders"], "admin:orders-*")
    conn = await connect_as(database_url, roles["app"])
    try:
        await conn.execute(f'SET ROLE "{roles["senders"]}"')
        await conn.execute("SELECT leaseq.send('orders-eu', 'as the group')")
        await conn.execute("RESET ROLE")
        await conn.execute("SELECT leaseq.send('orders-eu', 'as a member')")
    finally:
        await conn.close()
    stranger = await connect_as(database_url, roles["stranger"])
    try:
        # A role may only SET ROLE to a role it is a member of: no way around a grant.
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await stranger.execute(f'SET ROLE "{roles["senders"]}"')
    finally:
        await stranger.close()
    assert len(await receive(client, "orders-eu", max=10)) == 2


def test_the_grants_command_refuses_unknown_roles_and_bad_scopes(database_url: str) -> None:
    env = service_env(database_url)
    unknown = run_cli("grants", "add", "nobody_" + uuid.uuid4().hex[:6], "send:*", env=env)
    assert unknown.returncode == 1 and "does not exist" in unknown.stdout
    bad = run_cli("grants", "add", "postgres", "write:*", env=env)
    assert bad.returncode == 2 and "the action must be one of" in bad.stderr
    missing = run_cli("grants", "remove", "postgres", "send:*", env=env)
    assert missing.returncode == 1 and "had no grant" in missing.stdout


async def test_a_grant_holds_from_the_next_call_on(
    client: httpx.AsyncClient, db: asyncpg.Connection, database_url: str,
    roles: dict[str, str],
) -> None:
    await make_queue(client, "orders-eu")
    conn = await connect_as(database_url, roles["app"])
    try:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("SELECT leaseq.send('orders-eu', 'x')")
        # The administrator's function, in SQL, as the CLI calls it.
        await db.execute("SELECT leaseq.add_grant($1, 'send:orders-eu')", roles["app"])
        await conn.execute("SELECT leaseq.send('orders-eu', 'x')")
    finally:
        await conn.close()
