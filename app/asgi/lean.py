"""The lean path: routes served below FastAPI's routing, dependency and
response machinery (docs/decisions.md, "A lean path for the message cycle").

A lean route is declared once, as a FastAPI route whose signature and models
make its OpenAPI operation (and let the router answer 405 with `Allow` for a
method the path has not), and whose body is `@serves(handler)`: the one
implementation, an async function from a Call to an Answer. `LeanApp` finds
the declared route by its own method and path pattern, passes the request
through the application's middleware (the Guard among them) and runs the
handler; every other request goes on to FastAPI. The handler owns its errors:
the REST door's answer problem+json (app/api/decoding.py), the SQS door's
its protocols' shapes. With FastAPI's telemetry on, its request span and
metrics wrap a lean request as they wrap any other, named by the declared
route; the request is served the same way inside them.
"""

from __future__ import annotations

import functools
import inspect
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from fastapi import FastAPI
from fastapi.routing import APIRoute

# FastAPI's own steps of a request's telemetry, which FastAPI.__call__ and its
# router take; a request served past them takes the same (pinned FastAPI:
# requirements.lock; tests/rest/test_lean_path.py reads the spans they make).
from fastapi.telemetry._api import _route_selected
from fastapi.telemetry._asgi import _legacy_otel
from starlette.middleware.errors import ServerErrorMiddleware
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.asgi.access import REQUEST_ID, AccessLog, request_id_of
from app.errors import LeaseqError


@dataclass(slots=True)
class Call:
    """One request on the lean path, its body read."""

    scope: Scope
    receive: Receive
    params: dict[str, str]
    """The path's parameters."""
    state: Any
    """The application's state."""
    body: bytes


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: bytes = b""
    media_type: bytes = b"application/json"
    headers: tuple[tuple[bytes, bytes], ...] = ()
    """More response headers."""


Handler = Callable[[Call], Awaitable[Answer]]
BeforeBody = Callable[[Scope, Any], Awaitable[Answer | None]]
"""A check of what the headers alone tell (credentials), before the body is
read: an Answer refuses the request without reading its body, None lets it on."""
F = TypeVar("F", bound=Callable[..., Awaitable[None]])


def serves(handler: Handler, *, before_body: BeforeBody | None = None) -> Callable[[F], F]:
    """Marks a route declaration as implemented by `handler`, which LeanApp
    serves (`serve_lean`). The declaration documents the route: its OpenAPI
    operation, and the methods its path allows (FastAPI's router answers 405
    for the others). Its body never runs, nor does FastAPI ever serve it."""

    def mark(declaration: F) -> F:
        @functools.wraps(declaration)
        async def endpoint(*_args: Any, **_kwargs: Any) -> None:
            raise RuntimeError(
                f"{declaration.__name__} is served by LeanApp.serve_lean, not by FastAPI"
            )

        endpoint.__signature__ = inspect.signature(  # type: ignore[attr-defined]
            declaration
        ).replace(return_annotation=None)
        endpoint.__lean__ = handler  # type: ignore[attr-defined]
        endpoint.__before_body__ = before_body  # type: ignore[attr-defined]
        return endpoint  # type: ignore[return-value]

    return mark


def response_of(answer: Answer) -> Response:
    """An Answer as a Starlette response, for a route FastAPI serves."""
    response = Response(answer.body, status_code=answer.status)
    if answer.body:
        response.headers["content-type"] = answer.media_type.decode("latin-1")
    for name, value in answer.headers:
        response.headers.append(name.decode("latin-1"), value.decode("latin-1"))
    return response


def handler_of(route: APIRoute) -> Handler | None:
    return getattr(route.endpoint, "__lean__", None)


@dataclass(frozen=True, slots=True)
class _Served:
    method: str
    pattern: re.Pattern[str]
    route: APIRoute  # for /metrics' per-route counts, as FastAPI sets it
    handler: Handler
    before_body: BeforeBody | None


class Gate(Protocol):
    """The checks every request passes (the Guard, app/auth/guard.py)."""

    async def admit(self, scope: Scope, headers: Mapping[bytes, bytes]) -> Any: ...
    def leave(self, entered: Any) -> None: ...
    async def refuse(self, scope: Scope, send: Send, error: LeaseqError) -> None: ...


class BodyLimit(Protocol):
    """The size a request's body may have (LimitBody, app/main.py)."""

    def limit_for(self, scope: Scope) -> int: ...
    async def too_large(self, scope: Scope, send: Send, max_bytes: int) -> None: ...


@dataclass(frozen=True, slots=True)
class Front:
    """What the application's middleware does to every request (an id, a count
    and a log line; the body limit; the Guard's checks), done for a lean request
    in one call that reads its headers once, instead of through a layer each.
    The same objects, by the same methods, serve the rest of the routes as
    middleware; tests/rest/test_lean_path_front.py holds the two ways to the same answers."""

    access: AccessLog
    limit: BodyLimit
    gate: Gate


_HANDLER = "leaseq.handler"  # the scope's key for the handler LeanApp matched
_BEFORE_BODY = "leaseq.before_body"
UNDO = "leaseq.undo"
"""The scope's key for what a `before_body` check took that the request gives back
however it ends (the SQS door's share of the unproven body budget): a callable."""


class LeanApp(FastAPI):
    """The application: FastAPI, with the message cycle's requests taken at its
    door. Those pass the same middleware every request passes (the body limit
    and counts, the Guard, CORS: `user_middleware`), then their handler, and
    nothing of FastAPI's own stack; every other request goes to FastAPI."""

    _lean: dict[str, list[_Served]] = {}  # noqa: RUF012 - replaced, never changed
    _lean_stack: ASGIApp | None = None
    _front: Front | None = None

    def front_lean(self, front: Front) -> None:
        """Serves lean requests through `front` instead of `user_middleware`: only
        where `front` does all that middleware does (no CORS, say)."""
        self._front = front
        self._lean_stack = None

    def serve_lean(self, routes: Iterable[Any]) -> None:
        """Serves the routes among `routes` declared with `@serves`. They must be
        routes FastAPI would pick for their paths too (matched before any other)."""
        lean: dict[str, list[_Served]] = {}
        for route in routes:
            if isinstance(route, APIRoute) and (handler := handler_of(route)) is not None:
                for method in sorted(route.methods or ()):
                    before = getattr(route.endpoint, "__before_body__", None)
                    served = _Served(method, route.path_regex, route, handler, before)
                    lean.setdefault(method, []).append(served)
        self._lean = {**self._lean, **{
            method: [*self._lean.get(method, []), *served] for method, served in lean.items()
        }}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path: str = scope["path"]
            for served in self._lean.get(scope["method"], ()):
                match = served.pattern.match(path)
                if match is not None:
                    scope["app"] = self
                    scope["route"] = served.route
                    scope["path_params"] = match.groupdict()
                    scope[_HANDLER] = served.handler
                    scope[_BEFORE_BODY] = served.before_body
                    if self._lean_stack is None:
                        self._lean_stack = self._build_lean_stack()
                    if "fastapi.telemetry" not in scope and self._native_telemetry.enabled():
                        await self._observed(served, scope, receive, send)
                    else:
                        await self._lean_stack(scope, receive, send)
                    return
        await super().__call__(scope, receive, send)

    async def _observed(self, served: _Served, scope: Scope, receive: Receive,
                        send: Send) -> None:
        """A lean request inside FastAPI's telemetry (`LEASEQ_TELEMETRY`): its
        server span and request metrics, as FastAPI.__call__ gives every request,
        with the route FastAPI's router would have named."""
        stack = self._lean_stack
        assert stack is not None

        async def serve(scope: Scope, receive: Receive, send: Send) -> None:
            _route_selected(scope=scope, path=served.route.path_format)
            await stack(scope, receive, send)

        if self.middleware_stack is None:
            self.middleware_stack = self.build_middleware_stack()
        await self._native_telemetry(
            app=serve, scope=scope, receive=receive, send=send,
            legacy_otel=_legacy_otel(self.middleware_stack),
        )

    def _build_lean_stack(self) -> ASGIApp:
        app: ASGIApp
        if self._front is not None:
            app = functools.partial(_front, self._front)
        else:
            app = _serve
            for cls, args, kwargs in reversed(self.user_middleware):
                app = cls(app, *args, **kwargs)
        # What would answer an unexpected error anywhere in that stack.
        return ServerErrorMiddleware(app, handler=self.exception_handlers.get(Exception))


async def _serve(scope: Scope, receive: Receive, send: Send) -> None:
    answer = await _answer(scope, receive, None)
    if answer is not None:
        await _send(send, answer, ())


async def _front(front: Front, scope: Scope, receive: Receive, send: Send) -> None:
    headers = dict(scope["headers"])
    request_id = request_id_of(headers.get(b"x-request-id"))
    scope[REQUEST_ID] = request_id
    id_header = (b"x-request-id", request_id.encode("ascii"))
    started = time.perf_counter()
    status = 0  # no answer: the client went away first

    async def send_with_id(message: Message) -> None:
        # Refusals only: a handler's answer is sent below, its header added there.
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
            message["headers"] = [*message.get("headers", ()), id_header]
        await send(message)

    entered = None
    try:
        max_bytes = front.limit.limit_for(scope)
        if declares_more_than(headers.get(b"content-length"), max_bytes):
            await front.limit.too_large(scope, send_with_id, max_bytes)
            return
        try:
            entered = await front.gate.admit(scope, headers)
        except LeaseqError as exc:
            await front.gate.refuse(scope, send_with_id, exc)
            return
        try:
            answer = await _answer(scope, receive, max_bytes)
        except _TooLarge:
            await front.limit.too_large(scope, send_with_id, max_bytes)
            return
        if answer is not None:
            status = answer.status
            await _send(send, answer, (id_header,))
    finally:
        if entered is not None:
            front.gate.leave(entered)
        front.access.answered(scope, status, started, request_id)


async def _answer(scope: Scope, receive: Receive, max_bytes: int | None) -> Answer | None:
    """The handler's answer; None when the client went away before its request was
    whole."""
    handler: Handler = scope[_HANDLER]
    before_body: BeforeBody | None = scope[_BEFORE_BODY]
    refused = None if before_body is None else await before_body(scope, scope["app"].state)
    if refused is not None:
        return refused
    try:
        body = await _read_body(receive, max_bytes)
        if body is None:
            return None
        return await handler(Call(scope, receive, scope["path_params"], scope["app"].state, body))
    finally:
        if before_body is not None and (undo := scope.pop(UNDO, None)) is not None:
            undo()


async def _send(send: Send, answer: Answer, more: tuple[tuple[bytes, bytes], ...]) -> None:
    if answer.body:
        headers = [(b"content-type", answer.media_type),
                   (b"content-length", str(len(answer.body)).encode()), *answer.headers, *more]
    else:
        headers = [*answer.headers, *more]
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    await send({"type": "http.response.body", "body": answer.body})


def declares_more_than(content_length: bytes | None, max_bytes: int) -> bool:
    """Whether a request's Content-Length announces a body over `max_bytes` (one
    that is not a number is left to the body's reading, which counts)."""
    return (content_length is not None and content_length.isdigit()
            and int(content_length) > max_bytes)


class _TooLarge(Exception):
    pass


async def _read_body(receive: Receive, max_bytes: int | None) -> bytes | None:
    """The request's body; None if the client went away first. Past `max_bytes`
    (a body in chunks, whose length was not declared) raises _TooLarge."""
    chunks: list[bytes] = []
    seen = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        seen += len(chunk)
        if max_bytes is not None and seen > max_bytes:
            raise _TooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
