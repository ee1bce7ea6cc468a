"""Traces through messages: the Python client sends its current span's W3C
`traceparent` with a message, the worker continues that trace around the handler
(OpenTelemetry, recorded here in memory), and the two doors translate it to and
from SQS's AWSTraceHeader."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from sqs_clients import client as sqs_client
from sqs_clients import run
from support import wait_until
from worker_support import running

from app.queue.tracecontext import to_traceparent, to_xray
from leaseq import AsyncClient, Message, Worker

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
XRAY = "Root=1-4bf92f35-77b34da6a3ce929d0e0e4736;Parent=00f067aa0ba902b7;Sampled=1"


def test_a_traceparent_and_an_xray_header_are_one_trace() -> None:
    assert to_xray(TRACEPARENT) == XRAY
    assert to_traceparent(XRAY) == TRACEPARENT
    unsampled = TRACEPARENT[:-2] + "00"
    assert to_traceparent(to_xray(unsampled) or "") == unsampled
    assert to_traceparent("Root=1-4bf92f35-77b34da6a3ce929d0e0e4736;Lineage=a:1") is None
    for bad in ("", "00-xyz", "01-" + TRACEPARENT[3:], "00-" + "0" * 32 + TRACEPARENT[35:]):
        assert to_xray(bad) is None, bad
    assert to_traceparent(XRAY.replace("Root=1-", "Root=2-")) is None


_EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module")
def spans() -> Iterator[InMemorySpanExporter]:
    """OpenTelemetry configured for this process (once: its provider is global),
    recording every span in memory; it records nothing after this module."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    yield _EXPORTER
    _EXPORTER.clear()
    _EXPORTER.shutdown()


@pytest.fixture
def recorded(spans: InMemorySpanExporter) -> InMemorySpanExporter:
    spans.clear()
    return spans


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_the_worker_continues_the_senders_trace(
    api: AsyncClient, served: tuple[str, Any], recorded: InMemorySpanExporter, kind: str,
) -> None:
    await api.create_queue("traced")
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("checkout") as sender:
        await api.send("traced", "order 1")
        await api.send_batch("traced", ["order 2"])
    await api.send("traced", "untraced")  # no span: no trace to carry
    sent_from = sender.get_span_context()
    seen: dict[str, tuple[str | None, int]] = {}

    def note(message: Message) -> None:
        with tracer.start_as_current_span(f"handle {message.body}"):
            seen[message.body] = (message.attributes.get("traceparent"),
                                  trace.get_current_span().get_span_context().trace_id)

    async def handle_async(message: Message, ctx: Any) -> None:
        note(message)

    def handle_sync(message: Message, ctx: Any) -> None:
        note(message)

    handler = handle_async if kind == "async" else handle_sync
    worker = Worker(handler, queue="traced", url=served[0], wait=1)
    async with running(worker):
        await wait_until(lambda: len(seen) == 3 and worker.stats.acknowledged == 3)
    # Version 00, the sender's trace and span; its flags say sampled (bit 0).
    traceparent = seen["order 1"][0]
    assert traceparent is not None and seen["order 2"][0] == traceparent
    assert traceparent[:-2] == f"00-{sent_from.trace_id:032x}-{sent_from.span_id:016x}-"
    assert int(traceparent[-2:], 16) & 1
    assert seen["untraced"][0] is None
    processed = named(recorded, "traced process")
    assert len(processed) == 3 and all(s.kind == SpanKind.CONSUMER for s in processed)
    by_id = {s.context.span_id: s for s in processed}
    for body in ("order 1", "order 2"):
        (inner,) = named(recorded, f"handle {body}")  # the handler's own span...
        assert inner.parent is not None
        span = by_id[inner.parent.span_id]  # ...is the process span's child
        assert span.context.trace_id == sent_from.trace_id == seen[body][1]
        assert span.parent is not None and span.parent.span_id == sent_from.span_id
    (alone,) = named(recorded, "handle untraced")
    assert alone.context.trace_id != sent_from.trace_id


async def test_a_failing_handler_marks_its_span(
    api: AsyncClient, served: tuple[str, Any], recorded: InMemorySpanExporter,
) -> None:
    await api.create_queue("failing", visibility_timeout=30)
    await api.send("failing", "boom")

    async def handler(message: Message, ctx: Any) -> None:
        raise RuntimeError("it broke")

    worker = Worker(handler, queue="failing", url=served[0], wait=1)
    async with running(worker):
        await wait_until(lambda: worker.stats.failed >= 1)
    span = named(recorded, "failing process")[0]
    assert span.status.status_code == StatusCode.ERROR
    assert [e.name for e in span.events] == ["exception"]


async def test_the_trace_crosses_the_doors(api: AsyncClient, served: tuple[str, Any]) -> None:
    sqs = sqs_client(served[0], "json")
    url = (await run(sqs.create_queue, QueueName="doors"))["QueueUrl"]
    await run(sqs.send_message, QueueUrl=url, MessageBody="from sqs", MessageSystemAttributes={
        "AWSTraceHeader": {"DataType": "String", "StringValue": XRAY}})
    (message,) = await api.receive("doors")
    assert message.attributes == {"traceparent": TRACEPARENT}
    await api.delete("doors", message.receipt_handle)
    await api.send("doors", "from rest", attributes={"traceparent": TRACEPARENT})
    got = await run(sqs.receive_message, QueueUrl=url, MessageSystemAttributeNames=["All"],
                    MessageAttributeNames=["All"])
    (received,) = got["Messages"]
    assert received["Attributes"]["AWSTraceHeader"] == XRAY
    assert received["MessageAttributes"]["traceparent"]["StringValue"] == TRACEPARENT
