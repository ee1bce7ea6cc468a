"""The OpenAPI document's problem responses: what each operation can answer, by
`code`, from the one table of statuses and codes (app/api/problems.py), and the
document rewritten to list them (`install_openapi`)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute

from app.api.problems import MEDIA_TYPE, STATUS, TITLES, Problem
from app.auth.guard import BODY_METHODS, is_sqs_door

# Codes that no LeaseqError carries: the framework's and the middleware's own.
# not_found and method_not_allowed answer a request that names no operation (an
# unknown path, a method the path has not), so no operation lists them.
FRAMEWORK_CODES: dict[str, int] = {
    "validation_error": 422,  # FastAPI's request validation; unparseable JSON
    "request_too_large": 413,  # LimitBody (app/main.py), on every route
    "internal_error": 500,  # any unexpected exception
    "not_found": 404,
    "method_not_allowed": 405,
}

CODES: dict[str, int] = {
    **{code: status for status, code in STATUS.values()},
    **FRAMEWORK_CODES,
}
"""Every `code` the REST API answers with, and its status."""

# What every operation can answer, whatever its route: the Guard's Host and
# Origin checks (app/auth/guard.py), the body limit, an unexpected error.
_EVERYWHERE = ("host_not_allowed", "forbidden", "request_too_large", "internal_error")
# What the Guard answers on the paths it does not leave open (all of /v1, and
# /metrics unless LEASEQ_OPEN_METRICS): no or a bad key, the key's scopes, its
# rate, and the key's lookup when the database is down.
_GUARDED = ("unauthenticated", "forbidden", "rate_limited", "database_unavailable")
# Paths the Guard serves without a key whatever the settings (app/main.py's
# _open_paths); the others need one once any key exists.
ALWAYS_OPEN = frozenset({"/healthz", "/readyz"})

SECURITY_SCHEME = "bearer"

_SUMMARIES: dict[str, str] = {
    **{code: (cls.__doc__ or "").strip() for cls, (_, code) in STATUS.items()},
    "forbidden": "The API key's scopes, or the web page's origin, do not allow this request.",
    "validation_error": "The request does not match this operation's parameters or body, "
    "or a value is outside its allowed range.",
    "request_too_large": "The request body is larger than LEASEQ_MAX_REQUEST_BYTES.",
    "internal_error": "An unexpected error occurred.",
    "not_found": "No operation has this path.",
    "method_not_allowed": "The path has no operation for this method (see `Allow`).",
}

_CODES_KEY = "x-leaseq-codes"  # carries responses()'s codes to install_openapi


def responses(*answers: int | str) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the problem responses a route can return, named by
    `code` (`"queue_not_found"`; a typo raises KeyError at import) or by bare
    status. install_openapi adds what every route can answer (the Guard's, the
    body limit's, FastAPI's validation where there is input to validate) and
    lists each status's codes; a bare status nothing else explains lists every
    code of that status."""
    by_status: dict[int, list[str]] = {}
    for answer in answers:
        if isinstance(answer, int):
            by_status.setdefault(answer, [])
        else:
            by_status.setdefault(CODES[answer], []).append(answer)
    return {
        status: {"model": Problem, "description": TITLES[status], _CODES_KEY: codes}
        for status, codes in by_status.items()
    }


def operation_id(route: APIRoute) -> str:
    """FastAPI's generate_unique_id_function: an operation is named after its
    route's function (`create_queue`), or the route's `operation_id`."""
    return route.operation_id or route.name


def _takes_input(operation: dict[str, Any]) -> bool:
    """FastAPI can refuse this operation's request: it has a body, or a parameter
    other than a plain string path segment (which any segment satisfies)."""
    if "requestBody" in operation:
        return True
    for parameter in operation.get("parameters", []):
        schema = parameter.get("schema", {})
        plain = parameter.get("in") == "path" and schema.get("type") == "string" and not (
            set(schema) - {"type", "title", "description"}
        )
        if not plain:
            return True
    return False


def _codes_of(
    path: str, method: str, operation: dict[str, Any]
) -> tuple[dict[int, set[str]], set[int]]:
    """status -> the codes this operation can answer it with; and the problem
    statuses responses() declared (some of which may have no code here)."""
    codes: dict[int, set[str]] = {}
    declared_statuses: set[int] = set()

    def add(*names: str) -> None:
        for name in names:
            codes.setdefault(CODES[name], set()).add(name)

    add(*_EVERYWHERE)
    if _takes_input(operation):
        add("validation_error")
    if path not in ALWAYS_OPEN and not is_sqs_door(path):
        add(*_GUARDED)
        if method in BODY_METHODS:
            add("unsupported_media_type")
    for key, response in operation.get("responses", {}).items():
        declared = response.pop(_CODES_KEY, None)
        if declared is None:
            continue  # not a problem response
        status = int(key)
        declared_statuses.add(status)
        if declared:
            add(*declared)
        elif status not in codes and status != 422:
            # A bare status: every code of it. A bare 422 without input to
            # validate (the app-wide default) is dropped: nothing can answer it.
            add(*(code for code, code_status in CODES.items()
                  if code_status == status and code not in FRAMEWORK_CODES))
    return codes, declared_statuses


def _problem_response(status: int, names: set[str]) -> dict[str, Any]:
    ordered = sorted(names)
    response: dict[str, Any] = {
        "description": f"{TITLES[status]}: " + ", ".join(f"`{c}`" for c in ordered),
        "content": {MEDIA_TYPE: {
            # The Problem shape, narrowed to this status and its codes here.
            "schema": {"allOf": [
                {"$ref": "#/components/schemas/Problem"},
                {"type": "object", "properties": {
                    "status": {"const": status}, "code": {"enum": ordered},
                }},
            ]},
            "examples": {
                code: {"summary": _SUMMARIES[code], "value": {
                    "type": f"urn:leaseq:problem:{code}", "title": TITLES[status],
                    "status": status, "code": code, "detail": _SUMMARIES[code],
                }}
                for code in ordered
            },
        }},
    }
    headers: dict[str, Any] = {}
    if "unauthenticated" in names:
        headers["WWW-Authenticate"] = {
            "description": 'The scheme to authenticate with: `Bearer realm="leaseq"`.',
            "schema": {"type": "string"},
        }
    retried = {"rate_limited", "overloaded", "database_unavailable"}
    if names & retried:
        headers["Retry-After"] = {
            "description": "Seconds after which a retry may succeed.",
            # Always sent with these codes.
            "required": names <= retried,
            "schema": {"type": "integer", "minimum": 1},
        }
    if headers:
        response["headers"] = headers
    return response


def _code_table() -> str:
    rows = "\n".join(
        f"| `{code}` | {status} | {_SUMMARIES[code]} |"
        for code, status in sorted(CODES.items(), key=lambda item: (item[1], item[0]))
    )
    return (
        "Errors are `application/problem+json` (RFC 9457) with a stable `code`; each "
        "operation lists the codes each of its statuses can carry.\n\n"
        "| code | status | meaning |\n|---|---|---|\n" + rows
    )


def install_openapi(app: FastAPI) -> None:
    """Completes the document: every problem response an operation can answer,
    under application/problem+json, with its possible codes; the bearer scheme.

    FastAPI puts an additional response's `model` schema under the route's
    media type (application/json), where the API never sends problems; each
    problem response is rebuilt here from the codes responses() declared plus
    what the Guard, the body limit and FastAPI answer on every route.
    """
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generate()
            guarded = False
            for path, item in schema.get("paths", {}).items():
                for method, operation in item.items():
                    if not isinstance(operation, dict) or "responses" not in operation:
                        continue
                    codes, declared = _codes_of(path, method.upper(), operation)
                    documented = operation["responses"]
                    for status in declared - set(codes):
                        del documented[str(status)]
                    for status, names in codes.items():
                        documented[str(status)] = _problem_response(status, names)
                    operation["responses"] = dict(sorted(documented.items()))
                    if "unauthenticated" in codes.get(401, ()):
                        operation["security"] = [{SECURITY_SCHEME: []}]
                        guarded = True
            if guarded:
                schemes = schema.setdefault("components", {}).setdefault("securitySchemes", {})
                schemes[SECURITY_SCHEME] = {
                    "type": "http",
                    "scheme": "bearer",
                    "bearerFormat": "<key id>.<secret>",
                    "description": "An API key: `Authorization: Bearer <key id>.<secret>`. "
                    "Required once any key exists; /healthz and /readyz never need one.",
                }
            info = schema.setdefault("info", {})
            info["description"] = "\n\n".join(
                part for part in (info.get("description"), _code_table()) if part
            )
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
