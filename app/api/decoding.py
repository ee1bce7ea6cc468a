"""The REST door's side of the lean path (app/asgi/lean.py): request bodies and
query strings decoded and checked by the declared models through pydantic-core,
answers written by their serializers, and errors as the problem+json FastAPI's
handlers give (app/api/problems.py), with FastAPI's error locations."""

from __future__ import annotations

import functools
from typing import Any
from urllib.parse import parse_qsl

from pydantic import TypeAdapter, ValidationError
from starlette.responses import JSONResponse

from app.api import bounded_json, problems
from app.asgi.lean import Answer, Call, Handler
from app.errors import InvalidParameter, LeaseqError


class Invalid(Exception):
    """A request its declared models refuse: answered 422 `validation_error`
    with FastAPI's error list (`loc` starting with "body" or "query")."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__(errors)
        self.errors = errors


def answering_problems(handler: Handler) -> Handler:
    """A REST handler whose domain errors and refused input answer problem+json."""

    @functools.wraps(handler)
    async def answered(call: Call) -> Answer:
        try:
            return await handler(call)
        except LeaseqError as exc:
            return _answer(problems.error_response(exc))
        except Invalid as exc:
            return _answer(problems.invalid(exc.errors))

    return answered


def _answer(response: JSONResponse) -> Answer:
    extra = tuple(
        (name, value) for name, value in response.raw_headers
        if name not in (b"content-type", b"content-length")
    )
    return Answer(response.status_code, bytes(response.body), problems.MEDIA_TYPE.encode(), extra)


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


class BodyOf:
    """A route's JSON body, decoded and checked by its declared model."""

    def __init__(self, shape: Any, *, batch: bool = False, optional: bool = False) -> None:
        self.adapter: TypeAdapter[Any] = TypeAdapter(shape)
        self.batch = batch
        self.optional = optional

    def decode(self, call: Call) -> Any:
        raw = call.body
        if not raw or raw.strip() == b"null":  # FastAPI reads a JSON null as no body
            if self.optional:
                return None
            raise Invalid([{"loc": ["body"], "msg": "Field required", "type": "missing"}])
        try:
            max_batch: int = call.state.settings.max_batch
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

    def __init__(self, model: Any, status: int = 200, *, exclude_none: bool = False) -> None:
        self.adapter: TypeAdapter[Any] = TypeAdapter(model)
        self.status = status
        self.exclude_none = exclude_none
        """Leave out null fields (the optional ones only some queues have)."""

    def __call__(self, value: Any) -> Answer:
        return Answer(self.status, self.adapter.dump_json(value, exclude_none=self.exclude_none))
