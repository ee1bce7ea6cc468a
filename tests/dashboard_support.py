"""The dashboard's session, as its tests drive it: a key made by the bootstrap
admin, a sign-in's cookie (which the client is made to forget), and what a
request carrying that cookie is answered."""

from __future__ import annotations

import httpx

ADMIN = "LQBOOTSTRAPADMIN0001.admin-secret-0123456789abcdefghij"
DASHBOARD = {"x-leaseq-dashboard": "1"}
"""The header the dashboard's script names itself with (the cookie counts only then)."""


async def make_key(client: httpx.AsyncClient, *scopes: str) -> str:
    created = await client.post("/v1/keys", json={"name": "dash", "scopes": list(scopes)},
                                headers={"Authorization": f"Bearer {ADMIN}"})
    assert created.status_code == 201, created.text
    return str(created.json()["token"])


async def sign_in(client: httpx.AsyncClient, token: str) -> str:
    """The cookie signing in sets, as `name=value`; the client keeps none of it."""
    signed = await client.post("/ui/session", json={"key": token})
    assert signed.status_code == 200, signed.text
    client.cookies.clear()
    (cookie,) = [pair for pair in (line.split(";", 1)[0]
                                   for line in signed.headers.get_list("set-cookie"))
                 if not pair.endswith(("=", '=""'))]
    return cookie


async def session_status(client: httpx.AsyncClient, cookie: str,
                         path: str = "/ui/api/session") -> int:
    client.cookies.clear()
    headers = {**DASHBOARD, "cookie": cookie.encode()}
    return (await client.get(path, headers=headers)).status_code
