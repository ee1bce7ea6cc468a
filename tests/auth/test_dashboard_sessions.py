"""The dashboard's cookie is a session, never the API key: it names a row of the
database, signed under the service's master secret, so a copied cookie is worth
only what the session is; signing out on one process ends it on every process
at once, as do the key's revocation and the session's own expiry. A cookie
the service did not sign is refused, and the raw key in a cookie (the old
`leaseq_key`) authenticates nothing."""

from __future__ import annotations

import socket
from collections.abc import Callable

import asyncpg
import pytest
from conftest import AppClient
from dashboard_support import ADMIN, make_key, session_status, sign_in
from support import eventually

from app.auth import sessions as sessions_module
from app.auth import tokens
from app.auth.sessions import SESSIONS_PER_KEY, DashboardSessions
from app.auth.store import KeyStore
from app.config import Settings
from app.db.connector import Connector
from app.db.engine import create_engine, dialer
from app.errors import DatabaseUnavailable

OTHER_SECRET = "5f0c2b7e9a41d3c8b6e07f1a2d94c5b38e1f6a0d7c2b95e4f3a8d1c6b0e7f294"


async def test_the_cookie_holds_neither_the_key_id_nor_its_secret(
    app_factory: AppClient,
) -> None:
    client = await app_factory(admin_key=ADMIN)
    token = await make_key(client, "read:*")
    key_id, secret = tokens.split_bearer(token) or ("", "")
    cookie = await sign_in(client, token)
    assert key_id not in cookie and secret not in cookie
    assert await session_status(client, cookie) == 200
    # The key itself in a cookie, as signing in once kept it, is no sign-in.
    assert await session_status(client, f"leaseq_key={token}") == 401


async def test_signing_out_on_one_process_ends_the_session_on_every_process(
    app_factory: AppClient,
) -> None:
    first = await app_factory(admin_key=ADMIN)
    second = await app_factory(admin_key=ADMIN)
    cookie = await sign_in(first, await make_key(first, "read:*"))
    assert await session_status(first, cookie) == 200
    assert await session_status(second, cookie, "/ui/api/overview") == 200

    out = await first.delete("/ui/session", headers={"cookie": cookie})
    assert out.status_code == 204
    # A copy of the cookie is worth nothing anywhere, and the browser forgets it.
    assert await session_status(first, cookie) == 401
    assert 'leaseq_session=""' in out.headers["set-cookie"]

    async def refused_on_the_second() -> bool:
        return await session_status(second, cookie, "/ui/api/overview") == 401

    await eventually(refused_on_the_second)
    # Signing out again, or with no cookie, is no error.
    assert (await second.delete("/ui/session", headers={"cookie": cookie})).status_code == 204
    second.cookies.clear()
    assert (await second.delete("/ui/session")).status_code == 204


async def test_revoking_the_key_ends_its_sessions_on_every_process(
    app_factory: AppClient,
) -> None:
    first = await app_factory(admin_key=ADMIN)
    second = await app_factory(admin_key=ADMIN)
    token = await make_key(first, "read:*")
    cookie = await sign_in(first, token)
    assert await session_status(second, cookie) == 200
    revoked = await first.delete(f"/v1/keys/{token.split('.', 1)[0]}",
                                 headers={"Authorization": f"Bearer {ADMIN}"})
    assert revoked.status_code in (200, 204), revoked.text
    assert await session_status(first, cookie) == 401

    async def refused_on_the_second() -> bool:
        return await session_status(second, cookie) == 401

    await eventually(refused_on_the_second)


async def test_a_session_ends_when_its_time_is_up(app_factory: AppClient) -> None:
    client = await app_factory(admin_key=ADMIN, dashboard_session_seconds=1)
    cookie = await sign_in(client, await make_key(client, "read:*"))
    assert await session_status(client, cookie) == 200

    async def expired() -> bool:
        return await session_status(client, cookie) == 401

    await eventually(expired, seconds=10)


async def test_a_cookie_the_service_did_not_sign_is_refused(app_factory: AppClient) -> None:
    client = await app_factory(admin_key=ADMIN)
    token = await make_key(client, "read:*")
    cookie = await sign_in(client, token)
    name, value = cookie.split("=", 1)
    for at in (0, len(value) // 3, len(value) - 1):  # the id, and its signature
        flipped = value[:at] + ("A" if value[at] != "A" else "B") + value[at + 1:]
        assert await session_status(client, f"{name}={flipped}") == 401
    for forged in ("", "x", "a.b", "." * 100, "\u00e9" * 20, value + value):
        assert await session_status(client, f"{name}={forged}") == 401
    assert await session_status(client, cookie) == 200
    # A process under another master secret (LEASEQ_SECRET) on the same database
    # did not sign it: the session is not its to honour.
    stranger = await app_factory(admin_key=ADMIN, secret=OTHER_SECRET)
    assert await session_status(stranger, cookie) == 401


async def test_a_cookie_the_service_did_not_sign_costs_no_query(
    app_factory: AppClient, settings_factory: Callable[..., Settings],
) -> None:
    """The signature is checked before the database is asked: sessions whose
    database cannot be reached refuse every forged cookie all the same, and only
    a genuine one makes them ask (and fail)."""
    client = await app_factory(admin_key=ADMIN)
    _, value = (await sign_in(client, await make_key(client, "read:*"))).split("=", 1)
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings = settings_factory(database_url=f"postgresql://postgres@127.0.0.1:{port}/nothing",
                                pool_wait_seconds=0.5)
    engine = create_engine(settings.database_url or "", pool_size=1, dial=dialer(settings),
                           pgbouncer="off", pool_timeout=0.5)
    try:
        db = Connector(engine)
        master = settings.master_secret()
        keys = KeyStore(db, master=master, listening=lambda: True)
        sessions = DashboardSessions(db, master=master, keys=keys, listening=lambda: True,
                                     lifetime=60)
        for at in (0, len(value) // 3, len(value) - 1):
            forged = value[:at] + ("A" if value[at] != "A" else "B") + value[at + 1:]
            assert await sessions.principal(forged) is None
        assert await sessions.principal(tokens.new_secret()) is None
        with pytest.raises(DatabaseUnavailable):
            await sessions.principal(value)
        await keys.close()
    finally:
        await engine.dispose()


async def test_a_key_holds_at_most_its_cap_of_sessions_the_oldest_ending_everywhere(
    app_factory: AppClient, db: asyncpg.Connection,
) -> None:
    """Any valid key may sign in as often as its rate allows, and each sign-in
    stores a session for hours: past the cap, the key's oldest sessions end, on
    every process at once, as a sign-out does."""
    first = await app_factory(admin_key=ADMIN)
    second = await app_factory(admin_key=ADMIN)
    token = await make_key(first, "send:x")
    key_id = token.split(".", 1)[0]
    oldest = await sign_in(first, token)
    assert await session_status(first, oldest) == 200
    assert await session_status(second, oldest) == 200  # cached there now
    cookies = [oldest] + [await sign_in(first, token)
                          for _ in range(SESSIONS_PER_KEY + 4)]
    assert await db.fetchval("SELECT count(*) FROM leaseq.dashboard_sessions "
                             "WHERE key_id = $1", key_id) == SESSIONS_PER_KEY
    assert await session_status(first, oldest) == 401
    for newer in (cookies[5], cookies[-1]):
        assert await session_status(first, newer) == 200

    async def refused_on_the_second() -> bool:
        return await session_status(second, oldest) == 401

    await eventually(refused_on_the_second)
    assert await session_status(second, cookies[-1]) == 200


async def test_a_process_holds_a_bounded_number_of_sessions(
    app_factory: AppClient, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sessions_module, "_CACHE_HELD", 3)
    monkeypatch.setattr(sessions_module, "_GONE_HELD", 3)
    client = await app_factory(admin_key=ADMIN)
    sessions = client.app.state.sessions  # type: ignore[attr-defined]
    token = await make_key(client, "read:*")
    cookies = [await sign_in(client, token) for _ in range(6)]
    for cookie in cookies + cookies:  # the evicted ones are read again
        assert await session_status(client, cookie) == 200
        assert len(sessions._cache) <= 3
    for cookie in cookies:
        client.cookies.clear()
        assert (await client.delete("/ui/session", headers={"cookie": cookie})
                ).status_code == 204
        assert len(sessions._gone) <= 3
        assert await session_status(client, cookie) == 401
