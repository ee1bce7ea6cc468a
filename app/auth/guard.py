"""The checks every HTTP request passes before any route runs.

In order: the Host header is one this service answers to (DNS rebinding); a
browser request from another site is refused unless its origin is allowed
(CORS); a REST body is JSON (415 otherwise, so no HTML form or `text/plain`
request can change state); the API key, when keys exist, is valid; its
scopes cover the route; its request rate is not spent. The key is the
`Authorization: Bearer` header, or, for the dashboard's script (which names
itself with a header), the dashboard's HttpOnly cookie.

Which scope a REST route needs is the table `_RULES`, in one place; a path
no rule names is refused to every key (default deny). Routes whose queue is
in the body (create) or in a stored task (redrive tasks), and the queues a
request reaches besides its own (app/auth/reach.py), are checked by the
route itself, with `principal_of(request)`.
"""

from __future__ import annotations

import contextlib
import math
import re
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request, cookie_parser
from starlette.types import ASGIApp, Receive, Scope, Send

from app.auth.scopes import EVERYONE, Principal
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

_Q = r"(?P<queue>[^/]+)"
_H = r"[^/]+"
# (method, path) -> the action the key needs; `queue` named by the path, or
# None: on some queue (the route then checks the exact one).
_RULES: list[tuple[str, re.Pattern[str], str]] = [
    (method, re.compile(path), action)
    for method, path, action in [
        ("POST", rf"^/v1/queues/{_Q}/messages$", "send"),
        ("GET", rf"^/v1/queues/{_Q}/receive$", "receive"),
        ("POST", rf"^/v1/queues/{_Q}/receive$", "receive"),
        ("PATCH", rf"^/v1/queues/{_Q}/messages/{_H}/visibility$", "receive"),
        ("DELETE", rf"^/v1/queues/{_Q}/messages/{_H}$", "receive"),
        ("POST", rf"^/v1/queues/{_Q}/messages/visibility$", "receive"),
        ("POST", rf"^/v1/queues/{_Q}/messages/delete$", "receive"),
        ("POST", rf"^/v1/queues/{_Q}/messages/{_H}/release$", "receive"),
        ("PUT", rf"^/v1/queues/{_Q}/messages/{_H}/checkpoint$", "receive"),
        ("GET", rf"^/v1/queues/{_Q}/messages$", "read"),
        ("GET", r"^/v1/queues/?$", "read"),
        ("POST", r"^/v1/queues/?$", "admin"),
        ("GET", rf"^/v1/queues/{_Q}$", "read"),
        ("PATCH", rf"^/v1/queues/{_Q}$", "admin"),
        ("DELETE", rf"^/v1/queues/{_Q}$", "admin"),
        ("POST", rf"^/v1/queues/{_Q}/purge$", "admin"),
        ("GET", rf"^/v1/queues/{_Q}/dead-letter-sources$", "read"),
        ("POST", rf"^/v1/queues/{_Q}/redrive$", "admin"),
        ("GET", rf"^/v1/queues/{_Q}/redrive$", "read"),
        ("GET", rf"^/v1/redrive-tasks/{_H}$", "read"),
        ("DELETE", rf"^/v1/redrive-tasks/{_H}$", "admin"),
        ("GET", r"^/v1/keys/?$", "keys"),
        ("POST", r"^/v1/keys/?$", "keys"),
        ("DELETE", rf"^/v1/keys/{_H}$", "keys"),
        ("GET", r"^/ui/api/overview$", "read"),
        ("GET", r"^/ui/api/session$", "any"),
        # Filtered to the queues the key may read (app/api/routes/health.py).
        ("GET", r"^/metrics$", "read"),
        ("GET", r"^/openapi\.json$", "any"),
        ("GET", r"^/docs$", "any"),
        ("GET", r"^/docs/oauth2-redirect$", "any"),
        ("GET", r"^/redoc$", "any"),
    ]
]
_SQS_PATH = re.compile(r"^/(?:[0-9]{12}/[^/]+)?$")
DASHBOARD_COOKIE = "leaseq_key"
"""The dashboard's API key: HttpOnly (no script reads it), SameSite=Strict."""
DASHBOARD_HEADER = b"x-leaseq-dashboard"
"""The dashboard's script names itself with this header; only then does the
cookie stand for an Authorization header. Another site's page cannot send a
custom header without a CORS preflight, which is refused, so the cookie never
authenticates a request some other page made the browser send."""
BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


_Rule = tuple[str, re.Pattern[str], str]  # (literal tail, pattern, action)


def _by_method() -> dict[str, list[_Rule]]:
    """The rules of each method, each with the literal end of its pattern: a path
    that does not end so is passed over without running the regex."""
    rules: dict[str, list[_Rule]] = {}
    for method, pattern, action in _RULES:
        text = pattern.pattern.removeprefix("^").removesuffix("$")
        last = max(text.rfind(c) for c in ")]+?*\\")
        tail = text[last + 1:]
        rules.setdefault(method, []).append((tail, pattern, action))
    return rules


_RULES_BY_METHOD = _by_method()


def required(method: str, path: str) -> tuple[str, str | None] | None:
    """(action, queue or None) a REST request needs; None for a path no rule names.
    `any`: any valid key. HEAD is read as the GET it mirrors."""
    for tail, pattern, action in _RULES_BY_METHOD.get("GET" if method == "HEAD" else method, ()):
        if tail and not path.endswith(tail):
            continue
        match = pattern.match(path)
        if match is not None:
            return action, match.groupdict().get("queue")
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


class RateLimiter:
    """A token bucket per key, in this process: `rate` requests a second on
    average, bursts of up to twice that; and at most `concurrency` requests of
    one key in progress at once."""

    def __init__(self, default_rate: float, *, concurrency: int | None = None) -> None:
        self.default_rate = default_rate
        self.concurrency = concurrency
        self._buckets: dict[str, _Bucket] = {}
        self._in_progress: dict[str, int] = {}

    @contextlib.contextmanager
    def running(self, principal: Principal) -> Iterator[None]:
        """One request of `principal` in progress (RateLimited past the cap), and
        the key its long polls count against (CALLER_KEY)."""
        key = principal.key_id
        if key is None:
            yield
            return
        held = self._in_progress.get(key, 0)
        if self.concurrency is not None and held >= self.concurrency:
            raise RateLimited(
                retry_after=1.0,
                detail=f"This key already has {self.concurrency} requests in progress in "
                "this service process (LEASEQ_KEY_CONCURRENCY); retry later.",
            )
        self._in_progress[key] = held + 1
        token = CALLER_KEY.set(key)
        try:
            yield
        finally:
            CALLER_KEY.reset(token)
            left = self._in_progress.pop(key, 1) - 1
            if left > 0:
                self._in_progress[key] = left

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
        limiter: RateLimiter,
        allowed_hosts: list[str] | None,
        allowed_origins: list[str],
        open_paths: frozenset[str],
        refuse: Refuse,
    ) -> None:
        self.app = app
        self._keys = keys
        self._limiter = limiter
        self._hosts = None if allowed_hosts is None else {h.lower() for h in allowed_hosts}
        self._origins = set(allowed_origins)
        self._open_paths = open_paths
        self._refuse = refuse

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # Held for the whole request: a key's count of requests in progress.
        in_progress = contextlib.ExitStack()
        try:
            headers = _headers(scope)
            self._check_host(headers)
            self._check_origin(headers)
            path: str = scope["path"]
            if not (path in self._open_paths or is_sqs_door(path) or is_dashboard_page(path)):
                self._check_json(scope, headers)
                principal = await self._authenticate(headers)
                _authorize(principal, scope["method"], path)
                self._limiter.take(principal)
                scope.setdefault("state", {})["principal"] = principal
                in_progress.enter_context(self._limiter.running(principal))
        except LeaseqError as exc:
            await self._refuse(scope, closing_unread(scope, send), exc)
            return
        with in_progress:
            await self.app(scope, receive, send)

    def _check_host(self, headers: dict[bytes, bytes]) -> None:
        if self._hosts is None:
            return
        host = headers.get(b"host", b"").decode("latin-1").lower()
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        if name not in self._hosts:
            raise HostNotAllowed(
                f"Host {host[:100]!r} is not one this service answers to (LEASEQ_ALLOWED_HOSTS)."
            )

    def _check_origin(self, headers: dict[bytes, bytes]) -> None:
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

    def _check_json(self, scope: Scope, headers: dict[bytes, bytes]) -> None:
        if scope["method"] not in BODY_METHODS:
            return
        content_type = headers.get(b"content-type")
        if content_type is None:
            length = headers.get(b"content-length", b"0")
            if length.strip() in (b"", b"0") and b"transfer-encoding" not in headers:
                return  # no body at all
            raise UnsupportedMediaType("A request body must be application/json.")
        media = content_type.split(b";", 1)[0].strip().lower()
        if media != b"application/json" and not media.endswith(b"+json"):
            raise UnsupportedMediaType(
                f"A request body must be application/json, not {media.decode('latin-1')[:80]}."
            )

    async def _authenticate(self, headers: dict[bytes, bytes]) -> Principal:
        store = self._keys()
        if store is None:
            return EVERYONE
        await store.ensure()
        if not store.enforcing:
            return EVERYONE
        authorization = headers.get(b"authorization", b"").decode("latin-1")
        if not authorization and DASHBOARD_HEADER in headers:
            key = dashboard_key(headers.get(b"cookie", b""))
            if key is None:
                raise Unauthenticated("Sign in to the dashboard with an API key.")
            return await store.bearer(key)
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated(
                "An API key is required: Authorization: Bearer <key id>.<secret>."
            )
        return await store.bearer(token.strip())


def _authorize(principal: Principal, method: str, path: str) -> None:
    if principal is EVERYONE:
        return
    need = required(method, path)
    if need is None:
        # Default deny: a route added without a rule is refused to every key, not
        # let through (tests/test_guard_rules.py fails when one is missing).
        raise Forbidden(f"No key may {method} {path[:100]}.")
    action, queue = need
    if action == "any":
        return
    if action == "keys":
        principal.require_key_admin()
    elif queue is None:
        principal.require_any(action)
    else:
        principal.require(action, queue)


def dashboard_key(cookie_header: bytes) -> str | None:
    """The dashboard cookie's key from a Cookie header."""
    cookies = cookie_parser(cookie_header.decode("latin-1"))
    return cookies.get(DASHBOARD_COOKIE) or None


def _headers(scope: Scope) -> dict[bytes, bytes]:
    return {name: value for name, value in scope["headers"]}


def closing_unread(scope: Scope, send: Send) -> Send:
    """`send` for the answer to a refused request, closing its connection when it
    came with a body: the body is never read (uvicorn has buffered at most its
    first 64 KiB), and a connection kept alive would read and drop the rest."""
    headers = _headers(scope)
    if headers.get(b"content-length", b"0").strip() in (b"", b"0") and (
        b"transfer-encoding" not in headers
    ):
        return send

    async def closing(message: Any) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []),
                                              (b"connection", b"close")]}
        await send(message)

    return closing
