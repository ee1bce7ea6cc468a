"""Liveness, readiness and metrics."""

from __future__ import annotations

from functools import partial

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from app.api.deps import ServiceDep
from app.api.metrics import Metrics
from app.api.openapi import responses
from app.auth.access import scopes
from app.auth.guard import principal_of

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@router.get("/readyz", responses=responses("database_unavailable"))
async def readyz(service: ServiceDep, request: Request) -> dict[str, object]:
    """The database answers (503 `database_unavailable` otherwise); `singletons`:
    the rounds this process runs for the whole fleet (app/queue/maintenance.py)."""
    await service.ping()
    return {"status": "ok", "listening": request.app.state.hub.listening,
            "singletons": request.app.state.maintenance.running()}


@router.get(
    "/metrics", response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text."},
               **responses("database_unavailable")},
    # Filtered to the queues the key may read.
    **scopes("read:listed"),
)
async def metrics(request: Request) -> Response:
    """Prometheus text format (app/api/metrics.py): every queue's depth by state,
    request counts and latencies (SQS actions by name), long-poll waiters, group
    commit and the process. Queue figures are read at most every two seconds."""
    exposition: Metrics = request.app.state.metrics
    principal = principal_of(request)
    # A key that may read every queue sees them all; a scoped one only its own.
    everything = principal.anonymous or principal.reads_every_queue
    readable = None if everything else partial(principal.allows, "read")
    return Response(await exposition.exposition(readable), media_type=CONTENT_TYPE_LATEST)
