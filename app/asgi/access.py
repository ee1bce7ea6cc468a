"""Request ids and the access log: one line per request, written after its answer.

The line names the route's template (never the path a client chose, nor the query
string, which may carry a signature), the queue, an SQS action the door knows, the
status, the latency and the request id. No header and no body is ever logged."""

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


def _request_id(scope: Scope) -> str:
    """The caller's X-Request-Id when it is a sane one (it is echoed and logged,
    so it must not carry a line break or a megabyte), else a fresh one."""
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            if _GIVEN_ID.fullmatch(value):
                return bytes(value).decode("ascii")
            break
    return f"{_ID_PREFIX}{next(_ID_COUNTER):012x}"


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
        request_id = _request_id(scope)
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
            seconds = time.perf_counter() - started
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            action = scope.get(SQS_ACTION)
            self.observe(scope["method"], route, action, status, seconds)
            if self.enabled:
                self._write(scope, route, action, status, seconds, request_id)

    @staticmethod
    def _write(scope: Scope, route: str, action: str | None, status: int, seconds: float,
               request_id: str) -> None:
        queue = scope.get("path_params", {}).get("queue")
        latency_ms = round(seconds * 1000, 2)
        where = route if action is None else f"{route} {action}"
        _log.info(
            "%s %s %d %.2fms%s request_id=%s",
            scope["method"], where, status, latency_ms,
            "" if queue is None else f" queue={queue}", request_id,
            extra={
                "method": scope["method"], "route": route, "queue": queue, "action": action,
                "status": status, "latency_ms": latency_ms, "request_id": request_id,
            },
        )
