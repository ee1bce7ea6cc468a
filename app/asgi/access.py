"""Request ids and the access log: one line per request, written after its answer.

The line names the route's template (never the path a client chose, nor the query
string, which may carry a signature), the queue, an SQS action the door knows, the
status, the latency and the request id. No header and no body is ever logged.

What a client chose (the queue path segment, percent-decoded, and the method) is
escaped and cut to `FIELD_LIMIT` characters, in the message and in the structured
fields alike: a line break in a queue name would otherwise end the line and start
one the client wrote, and a long name would make the line as long as the request."""

from __future__ import annotations

import itertools
import logging
import re
import time
import uuid
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

REQUEST_ID = "leaseq.request_id"
"""The scope key under which a request's id is kept (the SQS door answers it too)."""

SQS_ACTION = "leaseq.sqs_action"
"""The scope key the SQS door sets to the action it served (a known action only)."""

# A made id is UUID-shaped (SQS clients expect one in x-amzn-requestid): a random
# prefix per process and a counter, unique without uuid4's cost on every request.
_ID_PREFIX = str(uuid.uuid4())[:24]
_ID_COUNTER = itertools.count()
_GIVEN_ID = re.compile(rb"[A-Za-z0-9._:@/+=-]{1,128}")
_log = logging.getLogger("leaseq.access")

FIELD_LIMIT = 200
"""The most characters of one client-chosen field an access line carries."""

# Everything but printable ASCII, and the backslash that starts an escape.
_UNSAFE = re.compile(r"[^\x20-\x5b\x5d-\x7e]")


def _escaped(char: str) -> str:
    code = ord(char)
    if code == 0x5C:
        return "\\\\"
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def loggable(value: str | None) -> str | None:
    """`value`, a client's, as part of one bounded line: control characters, non-ASCII
    and the backslash escaped (\\x0a, \\u2028, \\\\), cut to FIELD_LIMIT characters
    with `...` marking a cut."""
    if value is None or (len(value) <= FIELD_LIMIT and _UNSAFE.search(value) is None):
        return value
    out: list[str] = []
    size = 0
    for char in value:  # at most FIELD_LIMIT turns: each adds a character or more
        piece = _escaped(char) if _UNSAFE.match(char) else char
        if size + len(piece) > FIELD_LIMIT:
            return "".join(out) + "..."
        out.append(piece)
        size += len(piece)
    return "".join(out)


def request_id_of(given: bytes | None) -> str:
    """The caller's X-Request-Id (`given`) when it is a sane one (it is echoed and
    logged, so it must not carry a line break or a megabyte), else a fresh one."""
    if given is not None and _GIVEN_ID.fullmatch(given):
        return bytes(given).decode("ascii")
    return f"{_ID_PREFIX}{next(_ID_COUNTER):012x}"


def _given_id(scope: Scope) -> bytes | None:
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            return bytes(value)
    return None


Observe = Callable[[str, str, "str | None", int, float], None]
"""observe(method, route template, SQS action or None, status, seconds): the metrics."""


class AccessLog:
    """Gives every HTTP request an id (`X-Request-Id`, accepted and returned),
    counts it (`observe`) and, when `enabled`, logs it once answered."""

    def __init__(self, app: ASGIApp, enabled: bool, observe: Observe) -> None:
        self.app = app
        self.enabled = enabled
        self.observe = observe

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = request_id_of(_given_id(scope))
        scope[REQUEST_ID] = request_id
        header = (b"x-request-id", request_id.encode("ascii"))
        status = 0  # no answer: the client went away first
        started = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), header]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            self.answered(scope, status, started, request_id)

    def answered(self, scope: Scope, status: int, started: float, request_id: str) -> None:
        """Counts a request answered with `status` (0: none, the client went
        away) and logs it; `started`: its time.perf_counter() on arrival."""
        seconds = time.perf_counter() - started
        route = getattr(scope.get("route"), "path", None) or "unmatched"
        action = scope.get(SQS_ACTION)
        self.observe(scope["method"], route, action, status, seconds)
        if self.enabled:
            self._write(scope, route, action, status, seconds, request_id)

    @staticmethod
    def _write(scope: Scope, route: str, action: str | None, status: int, seconds: float,
               request_id: str) -> None:
        queue = loggable(scope.get("path_params", {}).get("queue"))
        method = loggable(scope["method"])
        latency_ms = round(seconds * 1000, 2)
        where = route if action is None else f"{route} {action}"
        _log.info(
            "%s %s %d %.2fms%s request_id=%s",
            method, where, status, latency_ms,
            "" if queue is None else f" queue={queue}", request_id,
            extra={
                "method": method, "route": route, "queue": queue, "action": action,
                "status": status, "latency_ms": latency_ms, "request_id": request_id,
            },
        )
