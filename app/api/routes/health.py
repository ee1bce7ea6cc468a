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


@router.get("/readyz", responses=responses("database_unavailable"))
async def readyz(service: ServiceDep, request: Request) -> dict[str, object]:
    """The database answers (503 `database_unavailable` otherwise)."""
    await service.ping()
    return {"status": "ok", "listening": request.app.state.hub.listening}


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(request: Request) -> str:
    """Prometheus text format: request counts by route and status, long-poll waiters,
    and how many statements the grouped requests shared."""
    counts: dict[tuple[str, str, int], int] = request.app.state.request_counts
    hub = request.app.state.hub
    groups = request.app.state.service.group.coalescers()
    lines = [
        "# HELP leaseq_waiting_receivers Long-polling receivers waiting now.",
        "# TYPE leaseq_waiting_receivers gauge",
        f"leaseq_waiting_receivers {hub.parked()}",
        "# HELP leaseq_wakeups_total Wake-ups delivered to waiting receivers.",
        "# TYPE leaseq_wakeups_total counter",
        f"leaseq_wakeups_total {hub.wakeups}",

        "# HELP leaseq_grouped_requests_total Requests that went through group commit.",
        "# TYPE leaseq_grouped_requests_total counter",
        *(f'leaseq_grouped_requests_total{{operation="{name}"}} {c.requests}'
          for name, c in groups.items()),
        "# HELP leaseq_grouped_statements_total Statements those requests shared.",
        "# TYPE leaseq_grouped_statements_total counter",
        *(f'leaseq_grouped_statements_total{{operation="{name}"}} {c.statements}'
          for name, c in groups.items()),
        "# HELP leaseq_http_requests_total HTTP requests answered, by route and status.",
        "# TYPE leaseq_http_requests_total counter",
    ]
    for (method, route, status), count in sorted(counts.items()):
        lines.append(
            f'leaseq_http_requests_total{{method="{method}",route="{route}",'
            f'status="{status}"}} {count}'
        )
    return "\n".join(lines) + "\n"
