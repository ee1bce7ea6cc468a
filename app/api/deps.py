"""Dependencies shared by the routes."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.config import Settings
from app.errors import InvalidParameter
from app.queue.service import QueueService


async def _service(request: Request) -> QueueService:
    # async: FastAPI runs a plain `def` dependency in a thread pool, per request.
    service: QueueService = request.app.state.service
    return service


ServiceDep = Annotated[QueueService, Depends(_service)]


def check_batch(size: int, settings: Settings) -> None:
    if size > settings.max_batch:
        raise InvalidParameter(f"A batch holds at most {settings.max_batch} entries, got {size}.")
