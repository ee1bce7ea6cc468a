"""The application factory. The lifespan owns the engine, the listener and the
background tasks; nothing is created at import time."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator

from fastapi import FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app import __version__
from app.api import problems
from app.api.routes import health, messages, queues, redrive
from app.config import Settings, get_settings
from app.db.engine import create_engine
from app.queue.receipts import ReceiptSigner
from app.queue.redrive import Redrives
from app.queue.retention import sweep_forever
from app.queue.service import QueueService
from app.queue.vacuum import vacuum_forever
from app.queue.waiting import Listener, WaitHub
from app.sqs import routes as sqs


class _BodyTooLarge(StarletteHTTPException):
    # An HTTPException, not a plain Exception: FastAPI turns any other exception
    # raised while it reads the body into "400 There was an error parsing the
    # body", so a chunked body over the limit (no Content-Length to refuse up
    # front) answered 400 `http_error` instead of 413 `request_too_large`.
    # FastAPI re-raises HTTPExceptions untouched; problems.install maps 413.
    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"The request body is larger than {max_bytes} bytes.")


class LimitBodyAndCount:
    """Refuses request bodies over a size (413, even when chunked) and counts
    responses by route and status for /metrics."""

    def __init__(self, app: ASGIApp, max_bytes: int, counts: Counter[tuple[str, str, int]]):
        self.app = app
        self.max_bytes = max_bytes
        self.counts = counts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._too_large(scope, send)
            return
        seen = 0
        status = 500
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _BodyTooLarge(self.max_bytes)
            return message

        async def counting_send(message: Message) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                status = message["status"]
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, counting_send)
        except _BodyTooLarge:
            if started:
                raise
            await self._too_large(scope, send)
            return
        finally:
            route = scope.get("route")
            path = getattr(route, "path", "unmatched")
            self.counts[(scope["method"], path, status)] += 1

    async def _too_large(self, scope: Scope, send: Send) -> None:
        response = problems.problem(
            413, "request_too_large", f"The request body is larger than {self.max_bytes} bytes."
        )
        await response(scope, _empty_receive, send)


async def _empty_receive() -> Message:
    return {"type": "http.disconnect"}


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    database_url = settings.database_url
    if database_url is None:
        raise RuntimeError("create_app needs DATABASE_URL; `leaseq serve` provides one")

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = create_engine(database_url, pool_size=settings.pool_size)
        hub = WaitHub()
        listener = Listener(database_url, hub)
        service = QueueService(engine, hub, ReceiptSigner(settings.receipt_secret()))
        app.state.settings = settings
        app.state.hub = hub
        app.state.loop = asyncio.get_running_loop()
        app.state.listener = listener
        app.state.service = service
        app.state.swept = asyncio.Event()
        app.state.redrives = redrives = Redrives(
            service, hold_seconds=settings.redrive_hold_seconds
        )
        app.state.redrive_idle = asyncio.Event()
        app.state.vacuum_rounds = asyncio.Event()
        listener.start()
        background = [
            asyncio.create_task(
                sweep_forever(service, settings.retention_sweep_seconds, app.state.swept),
                name="leaseq-retention",
            ),
            asyncio.create_task(
                redrives.run_forever(settings.redrive_scan_seconds, app.state.redrive_idle),
                name="leaseq-redrive",
            ),
            asyncio.create_task(
                vacuum_forever(service, settings.vacuum_check_seconds, app.state.vacuum_rounds),
                name="leaseq-vacuum",
            ),
        ]
        try:
            yield
        finally:
            hub.close()
            for task in background:
                task.cancel()
            for task in background:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await listener.stop()
            await engine.dispose()

    app = FastAPI(
        title="leaseq",
        version=__version__,
        summary="A durable lease-based message queue on PostgreSQL with SQS semantics.",
        lifespan=lifespan,
        # 413: the body limit below applies to every route.
        responses=problems.responses(413, 422, 500),
        telemetry=None if settings.telemetry else {
            "tracing": False, "metrics": False, "logs": False, "operation_spans": False,
        },
    )
    counts: Counter[tuple[str, str, int]] = Counter()
    app.state.request_counts = counts
    problems.install(app)
    problems.install_openapi(app)
    # Routes are matched in order: the message routes, most of the traffic, first.
    app.include_router(messages.router)
    app.include_router(queues.router)
    app.include_router(redrive.router)
    app.include_router(health.router)
    # Last: the queue URL route (/{account}/{queue}) must not shadow any REST path.
    app.include_router(sqs.router)
    app.add_middleware(LimitBodyAndCount, max_bytes=settings.max_request_bytes, counts=counts)
    return app
