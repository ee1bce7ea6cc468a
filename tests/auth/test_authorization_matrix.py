"""The authorization matrix, generated from the declarations (app/auth/access.py),
not written case by case: for every REST operation in the OpenAPI document and
every SQS action, on a standard and on a FIFO queue, a key whose scopes miss
exactly one of the queues the operation touches is refused (403 / AccessDenied),
and afterwards no queue, message or redrive task has changed. A key holding
every declared scope is not refused: the declarations are complete.

The one thing written by hand is a sample request per operation (which queue
plays which part); an operation without one fails the test.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
import httpx
import pytest
from botocore.exceptions import ClientError
from conftest import ServeApp
from sqs_clients import client, error_code, run
from support import eventually

from app.auth.access import Needs, needs_of_route
from app.sqs.actions import NEEDS
from app.sqs.move_tasks import _task_handle

ADMIN_ID = "LQBOOTSTRAPADMIN0001"
ADMIN_SECRET = "admin-secret-0123456789abcdefghij"
ADMIN = f"{ADMIN_ID}.{ADMIN_SECRET}"
ACCOUNT = "000000000000"


@dataclass
class World:
    """The queues of one run and what the samples need of them."""

    sfx: str
    endpoint: str
    app: Any
    http: httpx.AsyncClient
    handle: str = ""
    task_id: str = ""
    task_handle: str = ""
    round: int = 0

    def name(self, part: str) -> str:
        return f"{part}{self.sfx}"

    @property
    def fifo(self) -> bool:
        return bool(self.sfx)

    def message(self, body: str = "m") -> dict[str, Any]:
        return {"body": f"{body} {self.round}", "group": "g"} if self.fifo else {"body": body}

    def arn(self, part: str) -> str:
        return f"arn:aws:sqs:us-east-1:{ACCOUNT}:{self.name(part)}"

    def url(self, part: str) -> str:
        return f"{self.endpoint}/{ACCOUNT}/{self.name(part)}"


ADMIN_HEADERS = {"Authorization": f"Bearer {ADMIN}"}


async def _prepare(world: World) -> None:
    """The state every sample runs against, rebuilt (idempotently) before each:
    q (its dead-letter queue dlq), dlq with a message from q, dest, a message of
    q in flight (its handle) and a finished redrive task of dlq."""
    http = world.http
    attrs = {"fifo": True, "content_based_deduplication": True} if world.fifo else {}
    for part in ("dlq", "dest", "q"):
        made = await http.post("/v1/queues", json={"name": world.name(part), **attrs},
                               headers=ADMIN_HEADERS)
        assert made.status_code in (200, 201, 409), made.text  # 409: changed by a sample
    q = world.name("q")
    policy = await http.patch(f"/v1/queues/{q}", json={
        "dead_letter_queue": world.name("dlq"), "max_receive_count": 5}, headers=ADMIN_HEADERS)
    assert policy.status_code == 200, policy.text
    await http.post(f"/v1/queues/{q}/purge", headers=ADMIN_HEADERS)
    world.round += 1  # bodies of their own: a FIFO queue deduplicates by content
    for body in (f"held {world.round}", f"waiting {world.round}"):
        sent = await http.post(f"/v1/queues/{q}/messages", json=world.message(body),
                               headers=ADMIN_HEADERS)
        assert sent.status_code == 201, sent.text
    got = await http.get(f"/v1/queues/{q}/receive",
                         params={"max": 1, "wait": 0, "visibility_timeout": 600},
                         headers=ADMIN_HEADERS)
    (message,) = got.json()["messages"]
    world.handle = message["receipt_handle"]
    if not world.task_id:
        started = await http.post(f"/v1/queues/{world.name('dlq')}/redrive",
                                  json={"destination": world.name("dest")},
                                  headers=ADMIN_HEADERS)
        assert started.status_code == 202, started.text
        world.task_id = started.json()["task_id"]


async def _snapshot(db: asyncpg.Connection) -> list[Any]:
    # A redrive task started by _prepare or by a permitted sample finishes on its
    # own clock; compared while it runs, its completion would read as the change.
    await eventually(lambda: db.fetchval(
        "SELECT NOT EXISTS (SELECT FROM leaseq.redrive_tasks WHERE status = 'running')"))
    queues = await db.fetch("SELECT * FROM leaseq.queues ORDER BY id")
    messages = await db.fetch("SELECT * FROM leaseq.messages ORDER BY id")
    tasks = await db.fetch("SELECT * FROM leaseq.redrive_tasks ORDER BY id")
    return [[tuple(r.values()) for r in rows] for rows in (queues, messages, tasks)]


# -- REST samples: (method, template) -> (parts playing each target, request) ------

Sample = tuple[dict[str, str], Callable[[World], tuple[str, str, dict[str, Any]]]]


def _policy(world: World, part: str) -> dict[str, Any]:
    return {"dead_letter_queue": world.name(part), "max_receive_count": 3}


REST: dict[tuple[str, str], Sample] = {
    ("POST", "/v1/queues/{queue}/messages"): (
        {"queue": "q"}, lambda w: ("POST", f"/v1/queues/{w.name('q')}/messages",
                                   {"json": w.message()})),
    ("GET", "/v1/queues/{queue}/receive"): (
        {"queue": "q"}, lambda w: ("GET", f"/v1/queues/{w.name('q')}/receive",
                                   {"params": {"wait": 0}})),
    ("POST", "/v1/queues/{queue}/receive"): (
        {"queue": "q"}, lambda w: ("POST", f"/v1/queues/{w.name('q')}/receive",
                                   {"json": {"wait": 0}})),
    ("PATCH", "/v1/queues/{queue}/messages/{receipt_handle}/visibility"): (
        {"queue": "q"}, lambda w: (
            "PATCH", f"/v1/queues/{w.name('q')}/messages/{w.handle}/visibility",
            {"json": {"timeout": 0}})),
    ("POST", "/v1/queues/{queue}/messages/visibility"): (
        {"queue": "q"}, lambda w: (
            "POST", f"/v1/queues/{w.name('q')}/messages/visibility",
            {"json": {"entries": [{"receipt_handle": w.handle, "timeout": 0}]}})),
    ("DELETE", "/v1/queues/{queue}/messages/{receipt_handle}"): (
        {"queue": "q"}, lambda w: ("DELETE", f"/v1/queues/{w.name('q')}/messages/{w.handle}",
                                   {})),
    ("POST", "/v1/queues/{queue}/messages/delete"): (
        {"queue": "q"}, lambda w: ("POST", f"/v1/queues/{w.name('q')}/messages/delete",
                                   {"json": {"receipt_handles": [w.handle]}})),
    ("POST", "/v1/queues/{queue}/messages/{receipt_handle}/release"): (
        {"queue": "q"}, lambda w: (
            "POST", f"/v1/queues/{w.name('q')}/messages/{w.handle}/release", {"json": {}})),
    ("PUT", "/v1/queues/{queue}/messages/{receipt_handle}/checkpoint"): (
        {"queue": "q"}, lambda w: (
            "PUT", f"/v1/queues/{w.name('q')}/messages/{w.handle}/checkpoint",
            {"json": {"cursor": {"at": 1}}})),
    ("GET", "/v1/queues/{queue}/messages"): (
        {"queue": "q"}, lambda w: ("GET", f"/v1/queues/{w.name('q')}/messages", {})),
    ("POST", "/v1/queues"): (
        {"name": "q-new", "dead_letter_queue": "dlq"},
        lambda w: ("POST", "/v1/queues", {"json": {
            "name": w.name("q-new"), **({"fifo": True} if w.fifo else {}),
            **_policy(w, "dlq")}})),
    ("GET", "/v1/queues"): ({"listed": "q"}, lambda w: ("GET", "/v1/queues", {})),
    ("GET", "/v1/queues/{queue}"): (
        {"queue": "q"}, lambda w: ("GET", f"/v1/queues/{w.name('q')}", {})),
    ("PATCH", "/v1/queues/{queue}"): (
        {"queue": "q", "dead_letter_queue": "dest"},
        lambda w: ("PATCH", f"/v1/queues/{w.name('q')}", {"json": _policy(w, "dest")})),
    ("DELETE", "/v1/queues/{queue}"): (
        {"queue": "dest"}, lambda w: ("DELETE", f"/v1/queues/{w.name('dest')}", {})),
    ("POST", "/v1/queues/{queue}/purge"): (
        {"queue": "q"}, lambda w: ("POST", f"/v1/queues/{w.name('q')}/purge", {})),
    ("GET", "/v1/queues/{queue}/dead-letter-sources"): (
        {"queue": "dlq"}, lambda w: ("GET", f"/v1/queues/{w.name('dlq')}/dead-letter-sources",
                                     {})),
    ("POST", "/v1/queues/{queue}/redrive"): (
        {"queue": "dlq", "redrive_targets": "dest"},
        lambda w: ("POST", f"/v1/queues/{w.name('dlq')}/redrive",
                   {"json": {"destination": w.name("dest")}})),
    ("GET", "/v1/queues/{queue}/redrive"): (
        {"queue": "dlq"}, lambda w: ("GET", f"/v1/queues/{w.name('dlq')}/redrive", {})),
    ("GET", "/v1/redrive-tasks/{task_id}"): (
        {"task": "dlq"}, lambda w: ("GET", f"/v1/redrive-tasks/{w.task_id}", {})),
    ("DELETE", "/v1/redrive-tasks/{task_id}"): (
        {"task": "dlq"}, lambda w: ("DELETE", f"/v1/redrive-tasks/{w.task_id}", {})),
    ("POST", "/v1/keys"): ({}, lambda w: ("POST", "/v1/keys", {"json": {
        "name": "made", "scopes": ["read:*"]}})),
    ("GET", "/v1/keys"): ({}, lambda w: ("GET", "/v1/keys", {})),
    ("DELETE", "/v1/keys/{key_id}"): (
        {}, lambda w: ("DELETE", "/v1/keys/LQNOSUCHKEY0000000000", {})),
    ("GET", "/metrics"): ({"listed": "q"}, lambda w: ("GET", "/metrics", {})),
    ("GET", "/ui/api/overview"): ({"listed": "q"}, lambda w: ("GET", "/ui/api/overview", {})),
}


def _declared_routes(app: Any) -> dict[tuple[str, str], Needs]:
    """Every REST operation with a declaration, from the app's routers."""
    from app.api.routes import docs, health, keys, messages, queues, redrive
    from app.ui import routes as ui

    found: dict[tuple[str, str], Needs] = {}
    for router in (messages.router, queues.router, redrive.router, keys.router,
                   health.router, docs.router, ui.router):
        for route in router.routes:
            needs = needs_of_route(route)
            if needs is not None:
                for method in route.methods:
                    found[(method, route.path)] = needs
    return found


def _keys_for(needs: Needs, parts: dict[str, str], world: World) -> list[tuple[str, list[str]]]:
    """(what is missing, scopes) for each key that misses exactly one of what the
    operation needs; and ("", every scope) last."""
    # A key needs a scope: this one grants nothing the operations here touch
    # (and no `read`, which a list needs on some queue).
    nothing = ["send:unrelated"]
    if needs.any_key:
        return [("", nothing)]
    if needs.keys:
        return [("admin:*", [f"admin:{world.name('q')}"]), ("", ["admin:*"])]
    full = [f"{action}:{world.name(parts[target])}" for action, target in needs.pairs]
    keys = []
    for i, scope in enumerate(full):
        rest = full[:i] + full[i + 1:]
        keys.append((scope, rest or nothing))
    keys.append(("", full))
    return keys


async def _new_key(app: Any, scopes: list[str]) -> str:
    info, secret = await app.state.keys.create("matrix", scopes)
    return f"{info.id}.{secret}"


@pytest.mark.parametrize("fifo", [False, True], ids=["standard", "fifo"])
async def test_rest_every_operation_refuses_a_key_missing_one_queue(
    serve_factory: ServeApp, db: asyncpg.Connection, fifo: bool
) -> None:
    endpoint, app = await serve_factory(admin_key=ADMIN)
    declared = _declared_routes(app)
    operations = {op: needs for op, needs in declared.items() if not needs.any_key}
    assert operations.keys() - REST.keys() == set(), "operations without a sample"
    async with httpx.AsyncClient(base_url=endpoint, timeout=30) as http:
        world = World(".fifo" if fifo else "", endpoint, app, http)
        for (method, template), needs in sorted(operations.items()):
            parts, build = REST[(method, template)]
            for missing, scopes in _keys_for(needs, parts, world):
                await _prepare(world)
                token = await _new_key(app, scopes)
                verb, path, options = build(world)
                before = await _snapshot(db)
                answer = await http.request(verb, path, headers={
                    "Authorization": f"Bearer {token}"}, **options)
                what = f"{method} {template} with {scopes}"
                if missing:
                    assert answer.status_code == 403, (what, answer.status_code, answer.text)
                    assert answer.json()["code"] == "forbidden", what
                    assert await _snapshot(db) == before, f"{what} changed something"
                else:
                    assert answer.status_code not in (401, 403, 500), (what, answer.text)


# -- SQS samples -----------------------------------------------------------------

SQS: dict[str, tuple[dict[str, str], Callable[[World], dict[str, Any]]]] = {
    "CreateQueue": ({"queue": "q-new", "dead_letter_queue": "dlq"}, lambda w: {
        "QueueName": w.name("q-new"), "Attributes": {
            **({"FifoQueue": "true"} if w.fifo else {}),
            "RedrivePolicy": json.dumps({"deadLetterTargetArn": w.arn("dlq"),
                                         "maxReceiveCount": "3"})}}),
    "GetQueueUrl": ({"queue": "q"}, lambda w: {"QueueName": w.name("q")}),
    "ListQueues": ({"listed": "q"}, lambda w: {}),
    "DeleteQueue": ({"queue": "dest"}, lambda w: {"QueueUrl": w.url("dest")}),
    "GetQueueAttributes": ({"queue": "q"}, lambda w: {"QueueUrl": w.url("q"),
                                                     "AttributeNames": ["All"]}),
    "SetQueueAttributes": ({"queue": "q", "dead_letter_queue": "dest"}, lambda w: {
        "QueueUrl": w.url("q"), "Attributes": {"RedrivePolicy": json.dumps(
            {"deadLetterTargetArn": w.arn("dest"), "maxReceiveCount": "3"})}}),
    "PurgeQueue": ({"queue": "q"}, lambda w: {"QueueUrl": w.url("q")}),
    "TagQueue": ({"queue": "q"}, lambda w: {"QueueUrl": w.url("q"), "Tags": {"a": "b"}}),
    "UntagQueue": ({"queue": "q"}, lambda w: {"QueueUrl": w.url("q"), "TagKeys": ["a"]}),
    "ListQueueTags": ({"queue": "q"}, lambda w: {"QueueUrl": w.url("q")}),
    "ListDeadLetterSourceQueues": ({"queue": "dlq"}, lambda w: {"QueueUrl": w.url("dlq")}),
    "SendMessage": ({"queue": "q"}, lambda w: {
        "QueueUrl": w.url("q"), "MessageBody": "x",
        **({"MessageGroupId": "g", "MessageDeduplicationId": "d1"} if w.fifo else {})}),
    "SendMessageBatch": ({"queue": "q"}, lambda w: {"QueueUrl": w.url("q"), "Entries": [{
        "Id": "1", "MessageBody": "x",
        **({"MessageGroupId": "g", "MessageDeduplicationId": "d2"} if w.fifo else {})}]}),
    "ReceiveMessage": ({"queue": "q"}, lambda w: {"QueueUrl": w.url("q"),
                                                 "WaitTimeSeconds": 0}),
    "DeleteMessage": ({"queue": "q"}, lambda w: {"QueueUrl": w.url("q"),
                                                "ReceiptHandle": w.handle}),
    "DeleteMessageBatch": ({"queue": "q"}, lambda w: {"QueueUrl": w.url("q"), "Entries": [
        {"Id": "1", "ReceiptHandle": w.handle}]}),
    "ChangeMessageVisibility": ({"queue": "q"}, lambda w: {
        "QueueUrl": w.url("q"), "ReceiptHandle": w.handle, "VisibilityTimeout": 0}),
    "ChangeMessageVisibilityBatch": ({"queue": "q"}, lambda w: {
        "QueueUrl": w.url("q"), "Entries": [
            {"Id": "1", "ReceiptHandle": w.handle, "VisibilityTimeout": 0}]}),
    "StartMessageMoveTask": ({"queue": "dlq", "redrive_targets": "dest"}, lambda w: {
        "SourceArn": w.arn("dlq"), "DestinationArn": w.arn("dest")}),
    "ListMessageMoveTasks": ({"queue": "dlq"}, lambda w: {"SourceArn": w.arn("dlq")}),
    "CancelMessageMoveTask": ({"task": "dlq"}, lambda w: {"TaskHandle": w.task_handle}),
    "AddPermission": ({"queue": "q"}, lambda w: {
        "QueueUrl": w.url("q"), "Label": "l1", "AWSAccountIds": [ACCOUNT],
        "Actions": ["SendMessage"]}),
    "RemovePermission": ({"queue": "q"}, lambda w: {"QueueUrl": w.url("q"), "Label": "l1"}),
}


def _snake(action: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", action).lower()


@pytest.mark.parametrize("fifo", [False, True], ids=["standard", "fifo"])
async def test_sqs_every_action_refuses_a_key_missing_one_queue(
    serve_factory: ServeApp, db: asyncpg.Connection, fifo: bool
) -> None:
    endpoint, app = await serve_factory(admin_key=ADMIN)
    assert NEEDS.keys() - SQS.keys() == set(), "actions without a sample"
    async with httpx.AsyncClient(base_url=endpoint, timeout=30) as http:
        world = World(".fifo" if fifo else "", endpoint, app, http)
        await _prepare(world)
        # The task _prepare started has finished (SQS hands out no handle for it
        # then): its handle made the way StartMessageMoveTask makes one.
        world.task_handle = _task_handle(world.task_id, world.arn("dlq"))
        for action, needs in sorted(NEEDS.items()):
            parts, build = SQS[action]
            for missing, scopes in _keys_for(needs, parts, world):
                await _prepare(world)
                token = await _new_key(app, scopes)
                key_id, _, secret = token.partition(".")
                sqs = client(endpoint, "json", key=key_id, secret=secret)
                before = await _snapshot(db)
                what = f"{action} with {scopes}"
                call: Callable[..., Awaitable[Any]] = getattr(sqs, _snake(action))
                try:
                    await run(call, **build(world))
                    refused = None
                except ClientError as exc:
                    refused = error_code(exc)
                if missing:
                    assert refused == "AccessDenied", (what, refused)
                    assert await _snapshot(db) == before, f"{what} changed something"
                else:
                    assert refused not in ("AccessDenied", "InternalError"), (what, refused)
