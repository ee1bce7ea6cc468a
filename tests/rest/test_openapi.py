"""The OpenAPI document, checked against the app by schemathesis.

Requests are generated from the document itself for every REST operation
(valid ones, and invalid ones), sent to the real app (its lifespan, the real
PostgreSQL, every middleware) and every answer is checked against the document:
no server error, a documented status, the documented media type, body schema
(for problems: the status's documented `code` values) and headers. Twice: with
the service open (no API key exists) and with an admin key on every call.

Bounded: a few derandomized examples per operation and generation mode, so a
run is fast and reproducible. A failure names the operation, the check and a
curl command that repeats it.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from conftest import AppClient
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.python import asgi
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    ignored_auth,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from app.config import Settings
from app.main import create_app

ADMIN_TOKEN = "LQBOOTSTRAPADMIN0001.admin-secret-0123456789abcdefghij"
EXAMPLES = 4  # per operation and generation mode
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
    negative_data_rejection,
]
SEEDED_QUEUE = "fuzz"
DEAD_LETTERS = "fuzz-dlq"
OPERATIONS = 27  # the 24 of /v1, /healthz, /readyz, /metrics

Schema = Any  # schemathesis.specs.openapi.schemas.OpenApiSchema


@pytest.fixture
def load_schema(settings_factory: Callable[..., Settings]) -> Iterator[Callable[..., Schema]]:
    """The app (schemathesis's ASGI client runs its lifespan) and its document."""

    def load(headers: dict[str, str], **overrides: Any) -> Schema:
        # schemathesis's ASGI client calls the app as http://testserver.
        app = create_app(settings_factory(allowed_hosts="testserver", **overrides))
        schema = schemathesis.openapi.from_asgi("/openapi.json", app, headers=headers)
        # The key is not generated: open, a request without one is no invalid
        # request; with auth, every call carries the admin's, and ignored_auth
        # sends each operation without it and with a bad one.
        schema.config.generation.update(with_security_parameters=False)
        return schema

    yield load
    asgi.shutdown_lifespans()  # before the test's database is dropped


def _short_poll(case: Any) -> None:
    """A receive never waits: `wait=0`, whatever was generated (or the queue's
    receive_wait, which a generated queue may have set to 20 s)."""
    if case.operation.path.endswith("/receive"):
        case.query = {**(case.query or {}), "wait": 0}


def _fuzz(
    schema: Schema, *, headers: dict[str, str], checks: list[Any], seed_key: bool = False
) -> dict[str, Counter[int]]:
    """Runs every operation; returns the statuses each answered. Fails with
    every operation's failures at once."""
    answered: dict[str, Counter[int]] = {}
    failures: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()
        # Random names and handles, and seeded ones that exist, so that answers
        # of success (and the conflicts of a claim used up) are checked too.
        seeded = _seed(schema, headers, seed_key=seed_key)
        names = {parameter.name for parameter in operation.path_parameters}
        real = {name: value for name, value in seeded.items() if name in names}
        strategies = [operation.as_strategy(mode) for mode in GenerationMode]
        if real:
            strategies += [operation.as_strategy(mode, path_parameters=real)
                           for mode in GenerationMode]
        statuses = answered[operation.label] = Counter()
        try:
            _examples(st.one_of(strategies), len(strategies), headers, checks, statuses)
        except Exception as exc:
            failures.append(f"{operation.label}: {exc}")
    assert not failures, "\n\n".join(failures)
    return answered


def _examples(strategy: Any, strategies: int, headers: dict[str, str], checks: list[Any],
              statuses: Counter[int]) -> None:
    @given(case=strategy)
    @settings(max_examples=EXAMPLES * strategies, deadline=None, derandomize=True,
              database=None, suppress_health_check=list(HealthCheck),
              phases=[Phase.explicit, Phase.generate, Phase.shrink])
    def run(case: Any) -> None:
        _short_poll(case)
        response = case.call_and_validate(headers=headers, checks=checks)
        statuses[response.status_code] += 1

    run()


def _seed(schema: Schema, headers: dict[str, str], *, seed_key: bool) -> dict[str, str]:
    """A fresh queue with messages and a claim on one, a redrive task, and (with
    auth) a key: path parameters that name things that exist."""
    seeded = {"queue": SEEDED_QUEUE}
    with asgi.get_client(schema.app) as client:

        def call(method: str, url: str, *expected: int, **kwargs: Any) -> Any:
            response = client.request(method, url, headers=headers, **kwargs)
            assert response.status_code in expected, (method, url, response.text)
            return response.json() if response.content else None

        # Whatever the examples did to it (its attributes, its messages), anew.
        call("DELETE", f"/v1/queues/{SEEDED_QUEUE}", 204, 404, 409)
        call("POST", "/v1/queues", 200, 201, 409, json={"name": SEEDED_QUEUE})
        call("POST", "/v1/queues", 200, 201, 409, json={"name": DEAD_LETTERS})
        call("POST", f"/v1/queues/{SEEDED_QUEUE}/messages", 200,
             json={"messages": [{"body": f"m{i}"} for i in range(3)]})
        claimed = call("GET", f"/v1/queues/{SEEDED_QUEUE}/receive", 200,
                       params={"wait": 0, "visibility_timeout": 600})["messages"]
        if claimed:
            seeded["receipt_handle"] = claimed[0]["receipt_handle"]
        task = call("POST", f"/v1/queues/{DEAD_LETTERS}/redrive", 202, 409, json={})
        if "task_id" not in task:
            task = call("GET", f"/v1/queues/{DEAD_LETTERS}/redrive", 200)["tasks"][0]
        seeded["task_id"] = task["task_id"]
        if seed_key:  # open, a key would end the openness
            seeded["key_id"] = call("POST", "/v1/keys", 201,
                                    json={"name": "fuzz", "scopes": ["read:*"]})["id"]
    return seeded


def _report(label: str, answered: dict[str, Counter[int]], started: float) -> None:
    total: Counter[int] = Counter()
    for statuses in answered.values():
        total.update(statuses)
    print(f"\nschemathesis {label}: {len(answered)} operations, {total.total()} examples "
          f"(statuses {dict(sorted(total.items()))}), {time.monotonic() - started:.1f} s")


def _never_succeeded(answered: dict[str, Counter[int]]) -> set[str]:
    return {label for label, statuses in answered.items()
            if not any(200 <= status < 300 for status in statuses)}


def test_schemathesis_open(load_schema: Callable[..., Schema]) -> None:
    """No key exists: every operation answers without one."""
    started = time.monotonic()
    schema = load_schema({})
    answered = _fuzz(schema, headers={}, checks=CHECKS)
    _report("open", answered, started)
    assert len(answered) == OPERATIONS
    # The generated scopes are never valid: no key came to exist and close the service.
    assert not any(401 in statuses for statuses in answered.values())
    # Random key ids name no key; random scopes are no scopes.
    assert _never_succeeded(answered) <= {"POST /v1/keys", "DELETE /v1/keys/{key_id}"}


def test_schemathesis_with_auth(load_schema: Callable[..., Schema]) -> None:
    """An admin key exists and is on every call; `ignored_auth` checks that each
    operation that needs one refuses a request without it or with a bad one."""
    started = time.monotonic()
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    schema = load_schema(headers, admin_key=ADMIN_TOKEN)
    answered = _fuzz(schema, headers=headers, checks=[*CHECKS, ignored_auth], seed_key=True)
    _report("with auth", answered, started)
    assert len(answered) == OPERATIONS
    assert _never_succeeded(answered) <= {"POST /v1/keys"}


OPERATION_IDS = {
    "send_message", "receive_messages", "receive_and_settle", "peek_messages", "change_visibility",
    "change_visibility_batch", "delete_message", "delete_message_batch", "release_message",
    "checkpoint_message", "create_queue", "list_queues", "get_queue", "update_queue",
    "delete_queue", "purge_queue", "list_dead_letter_sources", "start_redrive",
    "list_redrives", "get_redrive", "cancel_redrive", "create_key", "list_keys", "revoke_key",
    "healthz", "readyz", "metrics",
}
CHANGES = {"POST", "PUT", "PATCH", "DELETE"}


def documented_codes(response: dict[str, Any]) -> set[str]:
    """The `code` values a documented problem response lists."""
    schema = response["content"]["application/problem+json"]["schema"]
    narrowed = [part for part in schema["allOf"] if "$ref" not in part]
    return set(narrowed[0]["properties"]["code"]["enum"])


async def test_operation_ids_are_names(client: httpx.AsyncClient) -> None:
    doc = (await client.get("/openapi.json")).json()
    ids = [operation["operationId"] for item in doc["paths"].values()
           for operation in item.values()]
    assert len(ids) == len(set(ids)) == OPERATIONS
    assert set(ids) == OPERATION_IDS


async def test_guard_answers_are_documented(app_factory: AppClient) -> None:
    """What the Guard and the body limit answer, before any route runs, is
    documented on every operation with its code (schemathesis sends neither a
    foreign Host nor an Origin, no key, nor a key out of requests)."""
    client = await app_factory(admin_key=ADMIN_TOKEN)
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    doc = (await client.get("/openapi.json", headers=admin)).json()
    slow = (await client.post("/v1/keys", headers=admin, json={
        "name": "slow", "scopes": ["admin:*"], "rate_per_second": 0.01})).json()["token"]
    await client.get("/v1/keys", headers={"Authorization": f"Bearer {slow}"})  # its one token

    checked = 0
    for path, item in doc["paths"].items():
        guarded = path not in ("/healthz", "/readyz")
        for method, operation in item.items():
            url = path.format(queue="q", receipt_handle="h", task_id="t", key_id="k")
            attempts: list[tuple[int, str, dict[str, str], bytes | None]] = [
                (400, "host_not_allowed", {"host": "evil.example"}, None),
                (403, "forbidden", {**admin, "origin": "https://evil.example"}, None),
                (413, "request_too_large", {**admin, "content-length": str(10**9)}, None),
            ]
            if guarded:
                attempts += [
                    (401, "unauthenticated", {}, None),
                    (401, "unauthenticated", {"Authorization": "Bearer LQNOSUCHKEY.secret"},
                     None),
                    (429, "rate_limited", {"Authorization": f"Bearer {slow}"}, None),
                ]
                if method.upper() in CHANGES:
                    attempts.append((415, "unsupported_media_type",
                                     {**admin, "content-type": "text/plain"}, b"x"))
            for status, code, headers, content in attempts:
                response = await client.request(method.upper(), url, headers=headers,
                                                content=content)
                assert response.status_code == status, (method, path, headers, response.text)
                assert response.json()["code"] == code
                documented = operation["responses"][str(status)]
                assert code in documented_codes(documented), (method, path, status)
                for name, header in documented.get("headers", {}).items():
                    assert name in response.headers or not header.get("required")
                checked += 1
    assert checked > 5 * OPERATIONS
