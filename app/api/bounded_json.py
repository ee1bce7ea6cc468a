"""JSON bodies whose size in values is bounded while they are parsed.

A batch route accepts at most LEASEQ_MAX_BATCH entries, but the entries are
counted only once the whole body is parsed: ten megabytes of `{"body":"x"},`
are 800,000 dicts, built in 300 ms on the event loop (every other request,
heartbeats included, waits), to be refused afterwards. Here the parser itself
counts the objects and numbers it makes and stops at the first one past what
a full batch can hold, in microseconds. (Arrays, strings and literals have no
hook in the json module; their floods stay bounded by the body limit.)
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

# Routes whose bodies hold batches: (method, path).
_BATCH_ROUTES = re.compile(
    r"^POST /v1/queues/[^/]+/(?:messages(?:/visibility|/delete)?|receive)$"
)
VALUES_PER_ENTRY = 4
"""Objects and numbers one batch entry may hold: the entry, its attributes,
its delay (sends), its timeout (visibility changes)."""


class TooManyValues(ValueError):
    """A body with more objects and numbers than a full batch can hold."""


def loads(body: bytes, *, max_values: int) -> Any:
    """json.loads that stops at the (max_values + 1)th object or number."""
    made = 0

    def counted() -> None:
        nonlocal made
        made += 1
        if made > max_values:
            raise TooManyValues(
                f"The body holds more than a full batch can: stopped reading after "
                f"{max_values} objects and numbers."
            )

    def make_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        counted()
        return dict(pairs)

    def make_int(text: str) -> int:
        counted()
        return int(text)

    def make_float(text: str) -> float:
        counted()
        return float(text)

    return json.loads(body, object_pairs_hook=make_object, parse_int=make_int,
                      parse_float=make_float)


class _BoundedRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            if _BATCH_ROUTES.match(f"{self.method} {self.url.path}"):
                max_batch: int = self.app.state.settings.max_batch
                self._json = loads(body, max_values=VALUES_PER_ENTRY * max_batch + 4)
            else:
                self._json = json.loads(body)
        return self._json


class BoundedJsonRoute(APIRoute):
    """A route whose batch bodies are bounded while parsed (see above), when
    FastAPI parses them: the cycle's routes with the lean path off (telemetry
    on). On the lean path, app/api/decoding.py bounds them itself."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def bounded(request: Request) -> Response:
            return await handler(_BoundedRequest(request.scope, request.receive))

        return bounded
