"""The dashboard's routes: one page (its script draws the queue list, a queue, a
dead-letter queue), its assets, signing in and out, and the two readings the
REST API has no route for: who is signed in, and every queue's depth with its
sparkline at once.

Signing in checks the key and starts a session (app/auth/sessions.py), named
by an HttpOnly, SameSite=Strict cookie that holds nothing of the key; the
page's script then sends `X-Leaseq-Dashboard` with every request, and the
Guard takes the session's key (app/auth/guard.py). Signing out ends the
session on every process. Every change the page makes goes through the REST
API, so the key's scopes decide it there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import FileResponse, JSONResponse
from starlette.exceptions import HTTPException

from app.asgi.lean import declares_more_than
from app.auth.access import scopes
from app.auth.guard import DASHBOARD_COOKIE, principal_of
from app.auth.scopes import Principal
from app.auth.sessions import DashboardSessions
from app.auth.store import KeyStore
from app.errors import InvalidParameter, UnsupportedMediaType

ASSETS = Path(__file__).parent / "static"
_TYPES = {
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard-kit.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}
_PAGE_HEADERS = {
    # The page runs its own script only, and no other site may frame it
    # (a purge button under someone else's page).
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "x-content-type-options": "nosniff",
    "cache-control": "no-store",
}
_NAME_CHARS = r"^[A-Za-z0-9_.-]*$"
_KEY_COOKIE = "leaseq_key"
"""The cookie that once held the key itself: a browser forgets it at sign-in and out."""
SIGN_IN_BODY_BYTES = 4096
"""The longest sign-in body: a key is a few hundred bytes at most."""

router = APIRouter(include_in_schema=False)


def _page() -> FileResponse:
    return FileResponse(ASSETS / "dashboard.html", media_type="text/html; charset=utf-8",
                        headers=_PAGE_HEADERS)


@router.get("/ui")
async def queue_list_page() -> Response:
    return _page()


@router.get("/ui/queues/{queue}")
async def queue_page(queue: str) -> Response:
    return _page()


@router.get("/ui/dead-letter/{queue}")
async def dead_letter_page(queue: str) -> Response:
    return _page()


@router.get("/ui/assets/{name}")
async def asset(name: str) -> Response:
    media_type = _TYPES.get(name)
    if media_type is None:
        raise HTTPException(404)
    return FileResponse(ASSETS / name, media_type=media_type,
                        headers={"cache-control": "no-cache", "x-content-type-options": "nosniff"})


def _keys(request: Request) -> KeyStore:
    keys: KeyStore = request.app.state.keys
    return keys


def _sessions(request: Request) -> DashboardSessions:
    sessions: DashboardSessions = request.app.state.sessions
    return sessions


def _cookie_options(request: Request) -> dict[str, Any]:
    return {"path": "/", "httponly": True, "samesite": "strict",
            "secure": request.url.scheme == "https"}


@router.post("/ui/session")
async def sign_in(request: Request) -> Response:
    """Checks the key and starts a session, which the dashboard's cookie names."""
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        raise UnsupportedMediaType("Sign in with a JSON body: {\"key\": \"<key id>.<secret>\"}.")
    try:
        body = json.loads(await _small_body(request))
    except (ValueError, RecursionError) as exc:  # RecursionError: nested past the parser
        raise InvalidParameter("The body is not JSON.") from exc
    token = body.get("key") if isinstance(body, dict) else None
    if not isinstance(token, str) or not 0 < len(token) <= 200:
        raise InvalidParameter("Sign in with {\"key\": \"<key id>.<secret>\"}.")
    keys = _keys(request)
    await keys.ensure()
    principal = await keys.bearer(token.strip())
    assert principal.key_id is not None  # a key's principal names it
    # Each sign-in stores a session: it counts against the key's rate as a request does.
    request.app.state.limiter.take(principal)
    cookie = await _sessions(request).start(principal.key_id)
    response = JSONResponse(_who(principal, keys_required=keys.enforcing))
    response.set_cookie(DASHBOARD_COOKIE, cookie, **_cookie_options(request))
    response.delete_cookie(_KEY_COOKIE, **_cookie_options(request))
    return response


async def _small_body(request: Request) -> bytes:
    """The sign-in body, read only up to SIGN_IN_BODY_BYTES: whoever sends it is
    not proven yet. Longer is refused unread, its connection closed."""
    too_large = HTTPException(
        413, f"The request body is larger than {SIGN_IN_BODY_BYTES} bytes.",
        headers={"connection": "close"},
    )
    if declares_more_than(request.headers.get("content-length", "").encode(),
                          SIGN_IN_BODY_BYTES):
        raise too_large
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > SIGN_IN_BODY_BYTES:
            raise too_large
    return bytes(body)


@router.delete("/ui/session")
async def sign_out(request: Request) -> Response:
    """Ends the cookie's session on every process, not only in this browser: a
    copy of the cookie is refused everywhere once this answers."""
    cookie = request.cookies.get(DASHBOARD_COOKIE)
    if cookie:
        await _sessions(request).end(cookie)
    response = Response(status_code=204)
    response.delete_cookie(DASHBOARD_COOKIE, **_cookie_options(request))
    response.delete_cookie(_KEY_COOKIE, **_cookie_options(request))
    return response


@router.get("/ui/api/session", **scopes("any"))
async def who_am_i(request: Request) -> dict[str, Any]:
    """The signed-in key (anonymous when the service needs none)."""
    keys = _keys(request)
    return _who(principal_of(request), keys_required=keys.enforcing)


def _who(principal: Principal, *, keys_required: bool) -> dict[str, Any]:
    return {
        "key_id": principal.key_id,
        "name": principal.name,
        "scopes": [str(scope) for scope in principal.scopes],
        "keys_required": keys_required,
    }


@router.get("/ui/api/overview", **scopes("read:listed"))
async def overview(
    request: Request, prefix: str = Query("", max_length=80, pattern=_NAME_CHARS)
) -> dict[str, Any]:
    """Every queue the key may read (the first 1000 by name), with its depth
    (the /metrics gauges' reading, at most two seconds old) and sparkline. Other
    queues are never named: a dead-letter queue or a source the key may not read
    is only counted."""
    state = request.app.state
    principal = principal_of(request)
    throughput = state.throughput
    throughput.watch()
    queues = await state.service.queues.list_queues(
        prefix=prefix, after="", limit=1000, patterns=principal.patterns("read")
    )
    depth: dict[str, dict[str, float]] = {}
    sources: dict[str, dict[str, int]] = {}
    # A source queue's messages in any dead-letter queue, whether the key may
    # read that queue or the prefix shows it.
    dead_lettered: dict[str, int] = {}
    for row in await state.metrics.gauges.read():
        counts = depth.setdefault(
            row["name"], {"visible": 0, "in_flight": 0, "delayed": 0, "oldest": 0.0}
        )
        counts["visible"] += row["visible"]
        counts["in_flight"] += row["in_flight"]
        counts["delayed"] += row["delayed"]
        counts["oldest"] = max(counts["oldest"], float(row["oldest_visible_age"] or 0))
        if row["source"] is not None:
            sources.setdefault(row["name"], {})[row["source"]] = row["messages"]
            dead_lettered[row["source"]] = dead_lettered.get(row["source"], 0) + row["messages"]
    shown = []
    for queue in queues:
        if not principal.allows("read", queue.name):
            continue
        counts = depth.get(queue.name, {"visible": 0, "in_flight": 0, "delayed": 0, "oldest": 0.0})
        sent, deleted = throughput.series(queue.name)
        dead_letter_queue = queue.attributes.dead_letter_queue
        hidden = dead_letter_queue is not None and not principal.allows("read", dead_letter_queue)
        its_sources = sources.get(queue.name, {})
        readable = {s: n for s, n in its_sources.items() if principal.allows("read", s)}
        shown.append({
            "name": queue.name,
            "fifo": queue.attributes.fifo,
            "dead_letter_queue": None if hidden else dead_letter_queue,
            "dead_letter_queue_unreadable": hidden,
            "visible": int(counts["visible"]),
            "in_flight": int(counts["in_flight"]),
            "delayed": int(counts["delayed"]),
            "oldest_visible_age_seconds": round(counts["oldest"], 3),
            "dead_letter_sources": readable,
            "unreadable_sources_messages": sum(its_sources.values()) - sum(readable.values()),
            "dead_lettered": dead_lettered.get(queue.name, 0),
            "sent_per_second": [round(v, 3) for v in sent],
            "deleted_per_second": [round(v, 3) for v in deleted],
        })
    return {
        "queues": shown,
        "more": len(queues) == 1000,
        "sparkline_interval_seconds": throughput.interval,
        "sparkline_window_seconds": throughput.window,
    }
