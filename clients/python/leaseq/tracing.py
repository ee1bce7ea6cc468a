"""A message's trace, W3C trace context in its `traceparent` attribute: set on send
from the sender's current span, continued around the handler by the worker, with
OpenTelemetry when it is installed and configured. Without it (or with only its
API and no SDK), none of this costs more than one look."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

TRACEPARENT = "traceparent"

try:
    from opentelemetry import propagate, trace
    from opentelemetry.trace import ProxyTracerProvider, SpanKind, Status, StatusCode
except ImportError:  # the client needs only httpx
    trace = None  # type: ignore[assignment]


def _enabled() -> bool:
    # No SDK configured: the API's provider is a proxy whose spans record nothing.
    return trace is not None and not isinstance(trace.get_tracer_provider(), ProxyTracerProvider)


def current_traceparent() -> str | None:
    """The traceparent of the current span, to send with a message (None: no span)."""
    if not _enabled():
        return None
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get(TRACEPARENT)


class Processing:
    """A handler's span: told how the handler ended."""

    def __init__(self, span: Any) -> None:
        self._span = span

    def failed(self, error: BaseException) -> None:
        if self._span is not None:
            self._span.record_exception(error)
            self._span.set_status(Status(StatusCode.ERROR, type(error).__name__))


@contextlib.contextmanager
def processing(queue: str, message: Any) -> Iterator[Processing]:
    """The span of one handler run, a child of the trace the message carries (its
    sender's span), current for the handler: its own spans nest below it."""
    if not _enabled():
        yield Processing(None)
        return
    traceparent = message.attributes.get(TRACEPARENT)
    parent = propagate.extract({TRACEPARENT: traceparent} if traceparent else {})
    tracer = trace.get_tracer("leaseq.worker")
    with tracer.start_as_current_span(
        f"{queue} process", context=parent, kind=SpanKind.CONSUMER,
        attributes={
            "messaging.system": "leaseq",
            "messaging.operation.type": "process",
            "messaging.destination.name": queue,
            "messaging.message.id": message.message_id,
            "messaging.message.delivery_attempt": message.receive_count,
        },
        record_exception=False, set_status_on_exception=False,
    ) as span:
        yield Processing(span)
