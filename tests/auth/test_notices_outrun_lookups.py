"""A notice that a key was revoked, or a dashboard session ended, clears every
process's cache; a lookup already asking the database then may answer with
what it read once, but never keeps it: the next request is refused, not served
from a stale cache for up to a minute."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from conftest import AppClient
from dashboard_support import ADMIN, make_key, session_status, sign_in
from support import eventually, wait_until

from app.auth.sql import Q
from app.db.queries import Query


class _Parked:
    """A connector whose one statement, for the parameters `match` picks, waits
    for `release` once it has read and before it answers: a lookup in flight."""

    def __init__(self, inner: Any, query: Query[Any],
                 match: Callable[[Mapping[str, Any]], bool]) -> None:
        self._inner = inner
        self._query = query
        self._match = match
        self.asked = asyncio.Event()
        self.release = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def fetch(self, query: Query[Any], params: Mapping[str, Any] = {}) -> list[Any]:
        rows: list[Any] = await self._inner.fetch(query, params)
        if query is self._query and self._match(params) and not self.release.is_set():
            self.asked.set()
            await self.release.wait()
        return rows


async def test_a_key_revoked_while_its_lookup_is_in_flight_is_not_cached(
    app_factory: AppClient,
) -> None:
    first = await app_factory(admin_key=ADMIN)
    second = await app_factory(admin_key=ADMIN)
    keys = first.app.state.keys  # type: ignore[attr-defined]
    heard = keys._generation
    token, witness = await make_key(first, "read:*"), await make_key(first, "read:*")
    key_id = token.split(".", 1)[0]
    # Each creation's own notice empties the cache when it comes back: both first.
    await wait_until(lambda: keys._generation >= heard + 2)
    # A key cached on the first process: its leaving shows the notice was heard.
    witness_id = witness.split(".", 1)[0]

    async def witness_cached() -> bool:
        answer = await first.get("/v1/queues", headers={"Authorization": f"Bearer {witness}"})
        return answer.status_code == 200 and witness_id in keys._cache

    await eventually(witness_cached)
    parked = _Parked(keys._db, Q.get_api_key, lambda p: p.get("id") == key_id)
    keys._db = parked
    asking = asyncio.create_task(
        first.get("/v1/queues", headers={"Authorization": f"Bearer {token}"}))
    await asyncio.wait_for(parked.asked.wait(), 10)

    revoked = await second.delete(f"/v1/keys/{key_id}",
                                  headers={"Authorization": f"Bearer {ADMIN}"})
    assert revoked.status_code in (200, 204), revoked.text
    await wait_until(lambda: witness_id not in keys._cache)
    parked.release.set()
    await asking  # read before the revocation: it may answer once

    again = await first.get("/v1/queues", headers={"Authorization": f"Bearer {token}"})
    assert again.status_code == 401, again.text


async def test_a_session_ended_while_its_lookup_is_in_flight_is_not_cached(
    app_factory: AppClient,
) -> None:
    first = await app_factory(admin_key=ADMIN)
    second = await app_factory(admin_key=ADMIN)
    token = await make_key(first, "read:*")
    cookie, witness = await sign_in(first, token), await sign_in(first, token)
    sessions = first.app.state.sessions  # type: ignore[attr-defined]
    assert await session_status(first, witness) == 200
    assert len(sessions._cache) == 1  # the witness's, until the notice clears it
    parked = _Parked(sessions._db, Q.get_dashboard_session, lambda p: True)
    sessions._db = parked
    asking = asyncio.create_task(session_status(first, cookie))
    await asyncio.wait_for(parked.asked.wait(), 10)

    second.cookies.clear()
    out = await second.delete("/ui/session", headers={"cookie": cookie})
    assert out.status_code == 204
    await wait_until(lambda: len(sessions._cache) == 0)
    parked.release.set()
    await asking  # read before the sign-out: it may answer once

    assert await session_status(first, cookie) == 401
