"""Liveness, readiness and metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

from app.api.deps import ServiceDep
from app.api.problems import responses

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@router.get("/readyz", responses=responses(503))
async def readyz(service: ServiceDep, request: Request) -> dict[str, object]:
    """The database answers (503 `database_unavailable` otherwise)."""
    await service.ping()
    return {"status": "ok", "listening": request.app.state.hub.listening}


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(request: Request) -> str:
    """Prometheus text format: request counts by route and status."""
    counts: dict[tuple[str, str, int], int] = request.app.state.request_counts
    lines = [
        "# HELP leaseq_http_requests_total HTTP requests answered, by route and status.",
        "# TYPE leaseq_http_requests_total counter",
    ]
    for (method, route, status), count in sorted(counts.items()):
        lines.append(
            f'leaseq_http_requests_total{{method="{method}",route="{route}",'
            f'status="{status}"}} {count}'
        )
    return "\n".join(lines) + "\n"
