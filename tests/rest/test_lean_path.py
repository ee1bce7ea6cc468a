"""The message cycle's lean path (app/asgi/lean.py): it serves exactly the cycle
routes, each by its one handler; the declarations that document them have no
implementation of their own; its answers keep the shapes FastAPI gave."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
from conftest import AppClient
from fastapi.routing import APIRoute
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from support import make_queue, receive, send

from app.api import openapi
from app.api.routes import messages
from app.asgi.lean import handler_of
from app.sqs import routes as sqs_routes

CYCLE = {
    "send_message", "receive_messages", "receive_and_settle", "change_visibility",
    "change_visibility_batch", "delete_message", "delete_message_batch", "release_message",
    "checkpoint_message",
}
JSON = {"content-type": "application/json"}


def _served() -> dict[str, APIRoute]:
    return {
        openapi.operation_id(route): route
        for route in messages.router.routes
        if isinstance(route, APIRoute) and handler_of(route) is not None
    }


def test_the_lean_path_serves_exactly_the_message_cycle() -> None:
    assert set(_served()) == CYCLE


def test_the_sqs_door_s_root_is_served_on_the_lean_path() -> None:
    # Both SQS protocols post to / (Query may GET it); a queue URL stays with FastAPI.
    served = [
        (sorted(route.methods), route.path) for route in sqs_routes.router.routes
        if isinstance(route, APIRoute) and handler_of(route) is not None
    ]
    assert served == [(["GET", "POST"], "/")]


async def test_a_method_the_lean_route_has_not_is_fastapi_s_405(
    client: httpx.AsyncClient,
) -> None:
    for method, path, allowed in [("PUT", "/", {"GET", "POST"}),
                                  ("PUT", "/v1/queues/q/receive", {"GET", "POST"})]:
        refused = await client.request(method, path)
        assert refused.status_code == 405, (method, path)
        assert refused.json()["code"] == "method_not_allowed"
        # Starlette's: the methods of the first route on the path (test_validation_malformed_input)
        listed = {m.strip() for m in refused.headers["allow"].split(",")}
        assert listed and listed <= allowed


async def test_with_telemetry_the_lean_path_serves_the_cycle_inside_fastapi_s_spans(
    app_factory: AppClient,
) -> None:
    client = await app_factory(telemetry=True)
    assert client.app._lean  # type: ignore[attr-defined]
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    client.app._telemetry["tracer_provider"] = provider  # type: ignore[attr-defined]
    await _cycle(client)
    spans = {(s.name, s.attributes["http.response.status_code"])  # type: ignore[index]
             for s in exporter.get_finished_spans() if s.kind == SpanKind.SERVER}
    # Named by the declared route, as FastAPI's router names the rest.
    assert ("POST /v1/queues/{queue}/messages", 201) in spans
    assert ("POST /v1/queues/{queue}/receive", 200) in spans
    assert ("DELETE /v1/queues/{queue}/messages/{receipt_handle}", 204) in spans
    assert ("POST /v1/queues", 201) in spans  # a route FastAPI serves itself


async def test_the_whole_cycle_is_answered_through_the_lean_path(client: httpx.AsyncClient) -> None:
    assert client.app._lean  # type: ignore[attr-defined]
    await _cycle(client)


async def _cycle(client: httpx.AsyncClient) -> None:
    queue = await make_queue(client, "lean", visibility_timeout=30)
    sent = await client.post(f"/v1/queues/{queue}/messages", json={"body": "one"})
    assert sent.status_code == 201 and sent.headers["content-type"] == "application/json"
    assert set(sent.json()) == {"message_id", "sent_at"}
    batch = await client.post(f"/v1/queues/{queue}/messages",
                              json={"messages": [{"body": "two"}, {"body": "three"}]})
    assert batch.status_code == 200 and batch.json()["succeeded"] == 2

    (first,) = await receive(client, queue, max=1)
    handle = first["receipt_handle"]
    assert first["body"] == "one" and first["lease_seconds"] == 30
    beat = await client.patch(f"/v1/queues/{queue}/messages/{handle}/visibility",
                              json={"timeout": 60})
    assert beat.status_code == 200 and beat.json()["lease_seconds"] == 60
    saved = await client.put(f"/v1/queues/{queue}/messages/{handle}/checkpoint",
                             json={"cursor": {"page": 2}})
    assert saved.status_code == 200
    released = await client.post(f"/v1/queues/{queue}/messages/{handle}/release")
    assert released.status_code == 200 and released.json()["delay_seconds"] == 0

    settled = await client.post(f"/v1/queues/{queue}/receive", json={"max": 3})
    assert settled.status_code == 200
    held = settled.json()["messages"]
    assert sorted(m["body"] for m in held) == ["one", "three", "two"]
    resumed = next(m for m in held if m["body"] == "one")
    assert resumed["checkpoint"] == {"page": 2} and resumed["receive_count"] == 2
    handles = [m["receipt_handle"] for m in held]
    extended = await client.post(f"/v1/queues/{queue}/messages/visibility",
                                 json={"entries": [{"receipt_handle": handles[0],
                                                    "timeout": 90}]})
    assert extended.json()["results"][0]["lease_seconds"] == 90
    one = await client.delete(f"/v1/queues/{queue}/messages/{handles[0]}")
    assert one.status_code == 204 and one.content == b""
    assert "content-type" not in one.headers
    rest = await client.post(f"/v1/queues/{queue}/receive",
                             json={"delete": handles[1:], "max": 1, "wait": 0})
    assert rest.json() == {"messages": [], "deleted": [{"ok": True}] * 2, "extended": []}
    again = await client.post(f"/v1/queues/{queue}/messages/delete",
                              json={"receipt_handles": handles[1:]})
    assert [r["code"] for r in again.json()["results"]] == ["lease_lost"] * 2

    metrics = (await client.get("/metrics")).text
    for template in ("/v1/queues/{queue}/messages", "/v1/queues/{queue}/receive",
                     "/v1/queues/{queue}/messages/{receipt_handle}"):
        assert f'route="{template}"' in metrics


async def test_query_and_body_refusals_keep_fastapi_s_shape(client: httpx.AsyncClient) -> None:
    queue = await make_queue(client, "shapes")
    low = await client.get(f"/v1/queues/{queue}/receive", params={"max": 0})
    assert low.status_code == 422
    (error,) = low.json()["errors"]
    assert error["loc"] == ["query", "max"] and error["type"] == "greater_than_equal"
    assert low.json()["detail"].startswith("query.max: ")
    words = await client.get(f"/v1/queues/{queue}/receive", params={"wait": "soon"})
    assert words.json()["errors"][0]["loc"] == ["query", "wait"]
    # a repeated parameter: the last one counts, as Starlette reads it
    last = await client.get(f"/v1/queues/{queue}/receive?max=0&max=2&wait=0")
    assert last.status_code == 200

    await send(client, queue)
    (held,) = await receive(client, queue)
    url = f"/v1/queues/{queue}/messages/{held['receipt_handle']}/visibility"
    empty = await client.patch(url, headers=JSON)
    assert empty.status_code == 422
    assert empty.json()["errors"] == [{"loc": ["body"], "msg": "Field required",
                                       "type": "missing"}]
    wrong = await client.patch(url, json={"timeout": "5"})  # strict: no strings
    assert wrong.json()["errors"][0]["loc"] == ["body", "timeout"]
    broken = await client.patch(url, content=b'{"timeout": ', headers=JSON)
    assert broken.status_code == 422
    assert broken.json()["errors"][0]["type"] == "json_invalid"
    extra = await client.patch(url, json={"timeout": 5, "lease": 5})
    assert extra.json()["errors"][0]["loc"] == ["body", "lease"]


async def test_a_body_in_many_chunks_is_read_whole(client: httpx.AsyncClient) -> None:
    queue = await make_queue(client, "chunks")

    async def chunks() -> AsyncIterator[bytes]:
        for part in (b'{"bo', b'dy": "in ', b'pieces"}'):
            yield part

    sent = await client.post(f"/v1/queues/{queue}/messages", content=chunks(), headers=JSON)
    assert sent.status_code == 201, sent.text
    (message,) = await receive(client, queue)
    assert message["body"] == "in pieces"


async def test_a_large_batch_body_is_bounded_while_parsed(app_factory: AppClient) -> None:
    client = await app_factory(max_batch=10)
    queue = await make_queue(client, "bounded")
    # More objects than a full batch holds: the bounded parser stops at the 45th value.
    flood = b'{"receipt_handles": [' + b",".join([b'{"h": 1}'] * 20_000) + b"]}"
    refused = await client.post(f"/v1/queues/{queue}/messages/delete", content=flood,
                                headers=JSON)
    assert refused.status_code == 422
    assert "stopped reading after 44 objects and numbers" in refused.json()["detail"]
    # A large body that is a full, valid batch still goes through.
    big = [{"body": "m" * 10_000} for _ in range(10)]
    sent = await client.post(f"/v1/queues/{queue}/messages", json={"messages": big})
    assert sent.status_code == 200 and sent.json()["succeeded"] == 10


async def test_braces_and_commas_inside_strings_still_decode(client: httpx.AsyncClient) -> None:
    # Counted as if they were structure, they send the body down the bounded
    # parser, which decodes it whole: a legal batch is accepted either way.
    queue = await make_queue(client, "punctuated")
    bodies = ["{" * 100 + "," * 500 + str(i) for i in range(10)]
    sent = await client.post(f"/v1/queues/{queue}/messages",
                             json={"messages": [{"body": b} for b in bodies]})
    assert sent.status_code == 200 and sent.json()["succeeded"] == 10
    got = await client.post(f"/v1/queues/{queue}/receive", json={"max": 10})
    assert sorted(m["body"] for m in got.json()["messages"]) == sorted(bodies)


async def test_with_telemetry_a_flood_is_still_stopped_by_the_bounded_parser(
    app_factory: AppClient,
) -> None:
    client = await app_factory(telemetry=True, max_batch=10)
    queue = await make_queue(client, "flood")
    flood = b'{"messages": [' + b",".join([b'{"body":"m"}'] * 20_000) + b"]}"
    refused = await client.post(f"/v1/queues/{queue}/messages", content=flood, headers=JSON)
    assert refused.status_code == 422
    assert "stopped reading after 44 objects and numbers" in refused.json()["detail"]


async def test_a_null_body_is_a_missing_one_and_sqs_xml_says_its_charset(
    client: httpx.AsyncClient,
) -> None:
    queue = await make_queue(client, "nulls")
    await send(client, queue)
    (held,) = await receive(client, queue)
    url = f"/v1/queues/{queue}/messages/{held['receipt_handle']}/visibility"
    refused = await client.patch(url, content=b"null", headers=JSON)
    assert refused.json()["errors"] == [{"loc": ["body"], "msg": "Field required",
                                         "type": "missing"}]
    listed = await client.post("/", content=b"Action=ListQueues&Version=2012-11-05",
                               headers={"content-type": "application/x-www-form-urlencoded"})
    assert listed.status_code == 200, listed.text
    assert listed.headers["content-type"] == "text/xml; charset=utf-8"
    assert listed.headers["x-amzn-requestid"]
