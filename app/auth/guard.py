"""The checks every HTTP request passes before any route runs.

In order: the Host header is one this service answers to (DNS rebinding); a
browser request from another site is refused unless its origin is allowed
(CORS); a REST body is JSON (415 otherwise, so no HTML form or `text/plain`
request can change state); the API key, when keys exist, is valid; its
scopes cover the route; its request rate is not spent. The key is the
`Authorization: Bearer` header, or, for the dashboard's script (which names
itself with a header), the key of the session the dashboard's HttpOnly cookie
names (app/auth/sessions.py).

Which scopes a REST route needs is its declaration (app/auth/access.py),
kept in its decorator; the Guard checks what the request line tells (the
queue of the path, key management), and the route the rest (a queue in the
body, a redrive's targets), with `principal_of(request)`. A path no declared
route serves is refused to every key (default deny).
"""

from __future__ import annotations

import contextlib
import math
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from contextvars import Token
from dataclasses import dataclass
from typing import Any

from fastapi.routing import APIRoute
from starlette.requests import Request, cookie_parser
from starlette.types import ASGIApp, Receive, Scope, Send

from app.auth.access import Needs, needs_of_route
from app.auth.scopes import EVERYONE, Principal
from app.auth.sessions import COOKIE, DashboardSessions
from app.auth.store import KeyStore
from app.errors import (
    Forbidden,
    HostNotAllowed,
    LeaseqError,
    RateLimited,
    Unauthenticated,
    UnsupportedMediaType,
)
from app.queue.waiting import CALLER_KEY

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]", "::1")

_SQS_PATH = re.compile(r"^/(?:[0-9]{12}/[^/]+)?$")
DASHBOARD_COOKIE = COOKIE
"""The dashboard's session (never the key): HttpOnly, SameSite=Strict."""
DASHBOARD_HEADER = b"x-leaseq-dashboard"
"""The dashboard's script names itself with this header; only then does the
cookie stand for an Authorization header. Another site's page cannot send a
custom header without a CORS preflight, which is refused, so the cookie never
authenticates a request some other page made the browser send."""
BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class Rules:
    """The REST routes' declarations (app/auth/access.py), found by method and
    path. A route without one is not here, so no key may call it."""

    def __init__(self, routes: Iterable[Any]) -> None:
        self._by_method: dict[str, list[tuple[str, re.Pattern[str], Needs]]] = {}
        for route in routes:
            needs = needs_of_route(route)
            if needs is None or not isinstance(route, APIRoute):
                continue
            # The literal end of the path: a request path that does not end so
            # is passed over without running the route's regex.
            tail = route.path.rsplit("}", 1)[-1] if "}" in route.path else route.path
            for method in route.methods or ():
                self._by_method.setdefault(method, []).append((tail, route.path_regex, needs))

    def add(self, method: str, path: str, needs: Needs) -> None:
        """A route FastAPI serves itself (the OpenAPI document), by its literal path."""
        self._by_method.setdefault(method, []).append(
            (path, re.compile("^" + re.escape(path) + "$"), needs))

    def find(self, method: str, path: str) -> tuple[Needs, str | None] | None:
        """The declaration of the route `method path` reaches and the queue its
        path names; None for a path no declared route serves. HEAD is the GET it
        mirrors; one trailing slash is the path without it (the router redirects)."""
        if len(path) > 1 and path.endswith("/"):
            path = path[:-1]
        for tail, pattern, needs in self._by_method.get("GET" if method == "HEAD" else method, ()):
            if tail and not path.endswith(tail):
                continue
            match = pattern.match(path)
            if match is not None:
                return needs, match.groupdict().get("queue")
        return None


def is_sqs_door(path: str) -> bool:
    return _SQS_PATH.match(path) is not None


def is_dashboard_page(path: str) -> bool:
    """The dashboard's pages, assets and sign-in: open, as they hold nothing of
    a queue; their script asks /ui/api and /v1 with the key."""
    return path == "/ui" or (path.startswith("/ui/") and not path.startswith("/ui/api/"))


def principal_of(request: Request) -> Principal:
    principal: Principal = request.scope.get("state", {}).get("principal", EVERYONE)
    return principal


@dataclass
class _Bucket:
    tokens: float
    at: float


Entered = tuple[str, Token[str | None]]
"""A key's place among its requests in progress (RateLimiter.enter)."""


class RateLimiter:
    """A token bucket per key, in this process: `rate` requests a second on
    average, bursts of up to twice that; and at most `concurrency` requests of
    one key in progress at once."""

    def __init__(self, default_rate: float, *, concurrency: int | None = None) -> None:
        self.default_rate = default_rate
        self.concurrency = concurrency
        self._buckets: dict[str, _Bucket] = {}
        self._in_progress: dict[str, int] = {}

    def enter(self, principal: Principal) -> Entered | None:
        """One request of `principal` begins (RateLimited past its cap), and its key
        becomes the one its long polls count against (CALLER_KEY). Returns what
        `leave` needs; None for no key (nothing is counted)."""
        key = principal.key_id
        if key is None:
            return None
        held = self._in_progress.get(key, 0)
        if self.concurrency is not None and held >= self.concurrency:
            raise RateLimited(
                retry_after=1.0,
                detail=f"This key already has {self.concurrency} requests in progress in "
                "this service process (LEASEQ_KEY_CONCURRENCY); retry later.",
            )
        self._in_progress[key] = held + 1
        return key, CALLER_KEY.set(key)

    def leave(self, entered: Entered) -> None:
        key, token = entered
        CALLER_KEY.reset(token)
        left = self._in_progress.pop(key, 1) - 1
        if left > 0:
            self._in_progress[key] = left

    @contextlib.contextmanager
    def running(self, principal: Principal) -> Iterator[None]:
        """`enter` and `leave` around a block (the SQS door's action)."""
        entered = self.enter(principal)
        try:
            yield
        finally:
            if entered is not None:
                self.leave(entered)

    def take(self, principal: Principal) -> None:
        rate = principal.rate_per_second or self.default_rate
        if principal.key_id is None or rate <= 0:
            return
        now = time.monotonic()
        burst = max(2.0 * rate, 1.0)
        bucket = self._buckets.get(principal.key_id)
        if bucket is None:
            bucket = self._buckets[principal.key_id] = _Bucket(burst, now)
        bucket.tokens = min(burst, bucket.tokens + (now - bucket.at) * rate)
        bucket.at = now
        if bucket.tokens < 1.0:
            raise RateLimited(
                retry_after=(1.0 - bucket.tokens) / rate,
                detail=f"This key may make {rate:g} requests a second; retry later.",
            )
        bucket.tokens -= 1.0


def retry_after_header(seconds: float) -> str:
    return str(max(1, math.ceil(seconds)))


Refuse = Callable[[Scope, Send, LeaseqError], Awaitable[None]]


class Guard:
    """ASGI middleware running the checks above; `refuse` answers a refused
    request in the REST door's error shape."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        keys: Callable[[], KeyStore | None],
        sessions: Callable[[], DashboardSessions | None] = lambda: None,
        limiter: RateLimiter,
        allowed_hosts: list[str] | None,
        allowed_origins: list[str],
        open_paths: frozenset[str],
        refuse: Refuse,
        rules: Rules,
    ) -> None:
        self.app = app
        self._rules = rules
        self._keys = keys
        self._sessions = sessions
        self._limiter = limiter
        self._hosts = None if allowed_hosts is None else {h.lower() for h in allowed_hosts}
        # "*.example.com" allows every name under example.com.
        self._host_suffixes = tuple(h[1:] for h in self._hosts or () if h.startswith("*."))
        self._origins = set(allowed_origins)
        self._open_paths = open_paths
        self._refuse = refuse

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            entered = await self.admit(scope, _headers(scope))
        except LeaseqError as exc:
            await self.refuse(scope, send, exc)
            return
        if entered is None:
            await self.app(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.leave(entered)

    async def admit(self, scope: Scope, headers: Mapping[bytes, bytes]) -> Entered | None:
        """Runs the checks on a request (`headers`: its headers, read once): raises
        the LeaseqError that refuses it, or lets it in. What it returns, when not
        None, is the key's place among its requests in progress, given back with
        `leave` once the request is answered."""
        self._check_host(headers)
        self._check_origin(headers)
        path: str = scope["path"]
        if path in self._open_paths or is_sqs_door(path) or is_dashboard_page(path):
            return None
        self._check_json(scope, headers)
        principal = await self._authenticate(headers)
        _authorize(self._rules, principal, scope["method"], path)
        self._limiter.take(principal)
        scope.setdefault("state", {})["principal"] = principal
        return self._limiter.enter(principal)

    def leave(self, entered: Entered) -> None:
        self._limiter.leave(entered)

    async def refuse(self, scope: Scope, send: Send, error: LeaseqError) -> None:
        """Answers a request `admit` refused."""
        await self._refuse(scope, closing_unread(scope, send), error)

    def _check_host(self, headers: Mapping[bytes, bytes]) -> None:
        if self._hosts is None:
            return
        host = headers.get(b"host", b"").decode("latin-1").lower()
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        if name not in self._hosts and not (
                self._host_suffixes and name.endswith(self._host_suffixes)):
            raise HostNotAllowed(
                f"Host {host[:100]!r} is not one this service answers to (LEASEQ_ALLOWED_HOSTS)."
            )

    def _check_origin(self, headers: Mapping[bytes, bytes]) -> None:
        # Browsers name the page's origin on every cross-origin request and on
        # every POST; `Sec-Fetch-Site` marks even a plain <img> or link. Anything
        # a page of another site makes this browser send is refused, unless
        # that origin is configured for CORS.
        origin = headers.get(b"origin")
        site = headers.get(b"sec-fetch-site", b"")
        if origin is not None:
            text = origin.decode("latin-1")
            if text in self._origins:
                return
            host = headers.get(b"host", b"").decode("latin-1")
            same = text.split("://", 1)[-1] == host
            if not same:
                raise Forbidden(f"Requests from the web origin {text[:100]!r} are not allowed.")
        elif site in (b"cross-site", b"same-site"):
            raise Forbidden("Requests made by another site's page are not allowed.")

    def _check_json(self, scope: Scope, headers: Mapping[bytes, bytes]) -> None:
        if scope["method"] not in BODY_METHODS:
            return
        content_type = headers.get(b"content-type")
        if content_type is None:
            if not announces_body(headers):
                return  # no body at all
            raise UnsupportedMediaType("A request body must be application/json.")
        media = content_type.split(b";", 1)[0].strip().lower()
        if media != b"application/json" and not media.endswith(b"+json"):
            raise UnsupportedMediaType(
                f"A request body must be application/json, not {media.decode('latin-1')[:80]}."
            )

    async def _authenticate(self, headers: Mapping[bytes, bytes]) -> Principal:
        store = self._keys()
        if store is None:
            return EVERYONE
        await store.ensure()
        if not store.enforcing:
            return EVERYONE
        authorization = headers.get(b"authorization", b"").decode("latin-1")
        if not authorization and DASHBOARD_HEADER in headers:
            cookie = dashboard_cookie(headers.get(b"cookie", b""))
            sessions = self._sessions()
            if cookie is None or sessions is None:
                raise Unauthenticated("Sign in to the dashboard with an API key.")
            principal = await sessions.principal(cookie)
            if principal is None:
                raise Unauthenticated(
                    "This dashboard session has ended (signed out, expired, or its key "
                    "revoked): sign in again.")
            return principal
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated(
                "An API key is required: Authorization: Bearer <key id>.<secret>."
            )
        return await store.bearer(token.strip())


def _authorize(rules: Rules, principal: Principal, method: str, path: str) -> None:
    if principal is EVERYONE:
        return
    found = rules.find(method, path)
    if found is None:
        # Default deny: a route added without a declaration is refused to every
        # key, not let through (tests/auth/test_guard_rules.py fails on one).
        raise Forbidden(f"No key may {method} {path[:100]}.")
    needs, queue = found
    needs.check_request_line(principal, queue)


def dashboard_cookie(cookie_header: bytes) -> str | None:
    """The dashboard's cookie (its session) from a Cookie header."""
    cookies = cookie_parser(cookie_header.decode("latin-1"))
    return cookies.get(DASHBOARD_COOKIE) or None


def _headers(scope: Scope) -> dict[bytes, bytes]:
    return {name: value for name, value in scope["headers"]}


def closing_unread(scope: Scope, send: Send) -> Send:
    """`send` for the answer to a refused request, closing its connection when it
    came with a body: the body is never read (uvicorn has buffered at most its
    first 64 KiB), and a connection kept alive would read and drop the rest."""
    if not announces_body(_headers(scope)):
        return send

    async def closing(message: Any) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []),
                                              (b"connection", b"close")]}
        await send(message)

    return closing


def announces_body(headers: Mapping[bytes, bytes]) -> bool:
    """Whether a request's headers say a body follows (a length, or chunks)."""
    return headers.get(b"content-length", b"0").strip() not in (b"", b"0") or (
        b"transfer-encoding" in headers
    )
