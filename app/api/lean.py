"""The message cycle's lean path: its routes served below FastAPI's routing,
dependency and response machinery (docs/decisions.md, "A lean path for the
message cycle").

A cycle route is declared once, in app/api/routes/messages.py, as a FastAPI
route whose signature and models make its OpenAPI operation and whose body is
`@serves(handler)`: the one implementation, a handler in app/api/cycle.py.
`LeanApp` finds the declared route by its own method and path pattern, passes
the request through the application's middleware (the Guard among them) and
runs the handler; anything else (another route, a method the path has not:
405 with `Allow`) goes on to FastAPI.

Bodies are decoded and checked by the declared models through pydantic-core
(`validate_json`), and the answers written as bytes by the same models'
serializers or, for received messages, by app/api/cycle.py directly; errors
answer in the problem+json shape FastAPI's handlers give (app/api/problems.py).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qsl

from fastapi import FastAPI
from fastapi.routing import APIRoute
from pydantic import TypeAdapter, ValidationError
from starlette.middleware.errors import ServerErrorMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from app.api import bounded_json, problems
from app.config import Settings
from app.errors import InvalidParameter, LeaseqError
from app.queue.service import QueueService


class Invalid(Exception):
    """A request its declared models refuse: answered 422 `validation_error`
    with FastAPI's error list (`loc` starting with "body" or "query")."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__(errors)
        self.errors = errors


@dataclass(slots=True)
class Call:
    """One request on the lean path."""

    scope: Scope
    receive: Receive
    params: dict[str, str]
    service: QueueService
    settings: Settings
    body: bytes

    @property
    def queue(self) -> str:
        return self.params["queue"]


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: bytes = b""


Handler = Callable[[Call], Awaitable[Answer]]
F = TypeVar("F", bound=Callable[..., Awaitable[None]])

_JSON = [(b"content-type", b"application/json")]


def serves(handler: Handler) -> Callable[[F], F]:
    """Marks a route declaration as served by `handler` on the lean path. The
    declaration's body never runs: reached, it means the application is not a LeanApp."""

    def mark(declaration: F) -> F:
        @functools.wraps(declaration)
        async def unreachable(*_args: Any, **_kwargs: Any) -> None:
            raise RuntimeError(
                f"{declaration.__name__} is served by app.api.lean.LeanApp, "
                "which this application is not"
            )

        unreachable.__lean__ = handler  # type: ignore[attr-defined]
        return unreachable  # type: ignore[return-value]

    return mark


def handler_of(route: APIRoute) -> Handler | None:
    return getattr(route.endpoint, "__lean__", None)


@dataclass(frozen=True, slots=True)
class _Served:
    method: str
    pattern: re.Pattern[str]
    route: APIRoute  # for /metrics' per-route counts, as FastAPI sets it
    handler: Handler


_HANDLER = "leaseq.handler"  # the scope's key for the handler LeanApp matched


class LeanApp(FastAPI):
    """The application: FastAPI, with the message cycle's requests taken at its
    door. Those pass the same middleware every request passes (the body limit
    and counts, the Guard, CORS: `user_middleware`), then their handler, and
    nothing of FastAPI's own stack; every other request goes to FastAPI."""

    def serve_lean(self, routes: Iterable[Any], prefix: str) -> None:
        """Serves the routes among `routes` declared with `@serves`; `prefix`
        starts each of their paths."""
        self._lean_prefix = prefix
        self._lean = [
            _Served(method, route.path_regex, route, handler)
            for route in routes
            if isinstance(route, APIRoute) and (handler := handler_of(route)) is not None
            for method in sorted(route.methods or ())
        ]
        self._lean_stack: ASGIApp | None = None

    def lean_operations(self) -> list[APIRoute]:
        return [served.route for served in getattr(self, "_lean", ())]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and hasattr(self, "_lean"):
            path: str = scope["path"]
            if path.startswith(self._lean_prefix):
                method = scope["method"]
                for served in self._lean:
                    if served.method == method:
                        match = served.pattern.match(path)
                        if match is not None:
                            scope["app"] = self
                            scope["route"] = served.route
                            scope["path_params"] = match.groupdict()
                            scope[_HANDLER] = served.handler
                            if self._lean_stack is None:
                                self._lean_stack = self._build_lean_stack()
                            await self._lean_stack(scope, receive, send)
                            return
        await super().__call__(scope, receive, send)

    def _build_lean_stack(self) -> ASGIApp:
        app: ASGIApp = _serve
        for cls, args, kwargs in reversed(self.user_middleware):
            app = cls(app, *args, **kwargs)
        # What would answer an unexpected error anywhere in that stack.
        return ServerErrorMiddleware(app, handler=self.exception_handlers.get(Exception))


async def _serve(scope: Scope, receive: Receive, send: Send) -> None:
    state = scope["app"].state
    handler: Handler = scope[_HANDLER]
    try:
        body = await _read_body(receive)
        if body is None:
            return  # the client went away before its request was whole
        answer = await handler(
            Call(scope, receive, scope["path_params"], state.service, state.settings, body)
        )
    except LeaseqError as exc:
        await problems.error_response(exc)(scope, receive, send)
        return
    except Invalid as exc:
        await problems.invalid(exc.errors)(scope, receive, send)
        return
    if answer.body:
        headers = [*_JSON, (b"content-length", str(len(answer.body)).encode())]
    else:
        headers = []
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    await send({"type": "http.response.body", "body": answer.body})


async def _read_body(receive: Receive) -> bytes | None:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


# -- decoding -----------------------------------------------------------------

COMMAS_PER_ENTRY = 16
"""Commas one batch entry may take outside its strings: its fields, attributes."""


def _fits_one_pass(raw: bytes, max_batch: int) -> bool:
    """Whether a batch body is decoded by pydantic-core in one pass: it cannot
    hold more objects, nor more array elements, than a full batch may. Every
    object needs a `{` and every element after an array's first a `,`, so
    counting the bytes (strings included: it only errs towards the other
    path) bounds them. pydantic-core checks a list's length only after it
    has validated every entry; a flood goes to bounded_json instead, which
    stops at the first value past a full batch."""
    objects = bounded_json.VALUES_PER_ENTRY * max_batch + 4
    return raw.count(b"{") <= objects and raw.count(b",") <= COMMAS_PER_ENTRY * max_batch + 16


T = TypeVar("T")


class BodyOf:
    """A route's JSON body, decoded and checked by its declared model."""

    def __init__(self, shape: Any, *, batch: bool = False, optional: bool = False) -> None:
        self.adapter: TypeAdapter[Any] = TypeAdapter(shape)
        self.batch = batch
        self.optional = optional

    def decode(self, call: Call) -> Any:
        raw = call.body
        if not raw:
            if self.optional:
                return None
            raise Invalid([{"loc": ["body"], "msg": "Field required", "type": "missing"}])
        try:
            max_batch = call.settings.max_batch
            if self.batch and not _fits_one_pass(raw, max_batch):
                return self.adapter.validate_python(_bounded(raw, max_batch))
            return self.adapter.validate_json(raw)
        except ValidationError as exc:
            raise Invalid(_errors(exc, "body")) from None


def _bounded(raw: bytes, max_batch: int) -> Any:
    try:
        return bounded_json.loads(
            raw, max_values=bounded_json.VALUES_PER_ENTRY * max_batch + 4
        )
    except bounded_json.TooManyValues as exc:
        raise InvalidParameter(str(exc)) from None
    except (ValueError, RecursionError) as exc:
        raise InvalidParameter(f"The request body is not valid JSON: {exc}"[:300]) from None


class QueryOf:
    """A route's query parameters, checked by their declared model."""

    def __init__(self, model: Any) -> None:
        self.adapter: TypeAdapter[Any] = TypeAdapter(model)

    def decode(self, call: Call) -> Any:
        query: bytes = call.scope.get("query_string", b"")
        try:
            return self.adapter.validate_python(_query_dict(query) if query else {})
        except ValidationError as exc:
            raise Invalid(_errors(exc, "query")) from None


def _query_dict(query: bytes) -> dict[str, str]:
    # The last of a repeated parameter counts, as Starlette's QueryParams gives it.
    return dict(parse_qsl(query.decode("latin-1"), keep_blank_values=True))


def _errors(exc: ValidationError, where: str) -> list[dict[str, Any]]:
    errors = []
    for err in exc.errors(include_url=False, include_input=False, include_context=False):
        if err["type"] == "json_invalid":
            # pydantic-core's parser: a body that is not JSON at all.
            return [{"loc": [where], "msg": f"The request body is not valid JSON: "
                     f"{err['msg']}"[:300], "type": "json_invalid"}]
        errors.append({"loc": [where, *(str(part) for part in err["loc"])],
                       "msg": err["msg"], "type": err["type"]})
    return errors


# -- encoding -----------------------------------------------------------------


class AnswerOf:
    """A route's answer, written by its declared model's serializer."""

    def __init__(self, model: Any, status: int = 200) -> None:
        self.adapter: TypeAdapter[Any] = TypeAdapter(model)
        self.status = status

    def __call__(self, value: Any) -> Answer:
        return Answer(self.status, self.adapter.dump_json(value))
