"""The only table of HTTP statuses and error codes: problem+json (RFC 9457)."""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.api.bounded_json import TooManyValues
from app.errors import (
    DatabaseUnavailable,
    Forbidden,
    HostNotAllowed,
    InvalidParameter,
    InvalidReceiptHandle,
    InvalidRedrivePolicy,
    KeyNotFound,
    LeaseLost,
    LeaseqError,
    MessageTooLarge,
    Overloaded,
    QueueAlreadyExists,
    QueueInUse,
    QueueNotFound,
    RateLimited,
    RedriveInProgress,
    TaskNotFound,
    Unauthenticated,
    UnsupportedMediaType,
)

_log = logging.getLogger(__name__)

MEDIA_TYPE = "application/problem+json"

# error class -> (status, code). Order matters only for subclasses.
STATUS: dict[type[LeaseqError], tuple[int, str]] = {
    QueueNotFound: (404, "queue_not_found"),
    QueueAlreadyExists: (409, "queue_already_exists"),
    LeaseLost: (409, "lease_lost"),
    InvalidReceiptHandle: (400, "invalid_receipt_handle"),
    MessageTooLarge: (413, "message_too_large"),
    InvalidParameter: (422, "validation_error"),
    InvalidRedrivePolicy: (400, "invalid_redrive_policy"),
    QueueInUse: (409, "queue_in_use"),
    TaskNotFound: (404, "task_not_found"),
    RedriveInProgress: (409, "redrive_in_progress"),
    DatabaseUnavailable: (503, "database_unavailable"),
    Overloaded: (503, "overloaded"),  # Retry-After: see error_response
    Unauthenticated: (401, "unauthenticated"),
    Forbidden: (403, "forbidden"),
    RateLimited: (429, "rate_limited"),
    HostNotAllowed: (400, "host_not_allowed"),
    UnsupportedMediaType: (415, "unsupported_media_type"),
    KeyNotFound: (404, "key_not_found"),
}

TITLES = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Content Too Large",
    415: "Unsupported Media Type",
    422: "Unprocessable Content",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


class Problem(BaseModel):
    """An error, as RFC 9457 problem details with a stable machine-readable `code`."""

    type: str
    title: str
    status: int
    code: str
    detail: str
    errors: list[dict[str, Any]] | None = None


def status_and_code(exc: Exception) -> tuple[int, str]:
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 500, "internal_error"


def problem(status: int, code: str, detail: str, **extra: Any) -> JSONResponse:
    body: dict[str, Any] = {
        "type": f"urn:leaseq:problem:{code}",
        "title": TITLES.get(status, "Error"),
        "status": status,
        "code": code,
        "detail": detail,
        **extra,
    }
    return JSONResponse(body, status_code=status, media_type=MEDIA_TYPE)


def error_response(exc: LeaseqError) -> JSONResponse:
    """A domain error as the REST door answers it, with the headers its status needs."""
    status, code = status_and_code(exc)
    response = problem(status, code, exc.detail)
    if isinstance(exc, Unauthenticated):
        response.headers["WWW-Authenticate"] = 'Bearer realm="leaseq"'
    retry_after = getattr(exc, "retry_after", None)
    if retry_after is not None:
        response.headers["Retry-After"] = str(max(1, math.ceil(retry_after)))
    return response


def entry_error(exc: Exception) -> dict[str, Any]:
    """One failed entry of a batch, in the same vocabulary as a whole response."""
    status, code = status_and_code(exc)
    return {"ok": False, "status": status, "code": code, "detail": str(exc)}


def invalid(errors: list[dict[str, Any]]) -> JSONResponse:
    """422 for a request its parameters' or body's models refuse."""
    detail = "invalid request"
    if errors:
        detail = f"{'.'.join(errors[0]['loc'])}: {errors[0]['msg']}"
    return problem(422, "validation_error", detail, errors=errors)


def _validation_errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    # Only plain fields: `input` may echo a huge body and `ctx` may hold objects
    # that are not JSON.
    return [
        {"loc": [str(part) for part in err.get("loc", ())], "msg": str(err.get("msg", "")),
         "type": str(err.get("type", ""))}
        for err in exc.errors()
    ]


def install(app: FastAPI) -> None:
    @app.exception_handler(LeaseqError)
    async def _domain(_request: Request, exc: LeaseqError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return invalid(_validation_errors(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400 and isinstance(exc.__cause__, TooManyValues):
            return problem(422, "validation_error", str(exc.__cause__))
        if exc.status_code == 400 and isinstance(exc.__cause__, (ValueError, RecursionError)):
            # FastAPI answers only json.JSONDecodeError with 422; JSON it cannot
            # decode for other reasons (nested deeper than the recursion limit,
            # an integer over Python's 4300 digits, bytes that are not UTF-8)
            # came out as an undocumented "400 http_error". Unparseable JSON is
            # one case: 422 validation_error, whatever the parser tripped on.
            return problem(422, "validation_error",
                           f"The request body is not valid JSON: {exc.__cause__}"[:300])
        code = {404: "not_found", 405: "method_not_allowed",
                413: "request_too_large"}.get(exc.status_code, "http_error")
        response = problem(exc.status_code, code, str(exc.detail))
        # Keep the exception's headers: a 405 must say `Allow` (RFC 9110 15.5.6).
        response.headers.update(exc.headers or {})
        return response

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, exc: Exception) -> JSONResponse:
        _log.exception("unhandled error", exc_info=exc)
        return problem(500, "internal_error", "An unexpected error occurred.")
