"""Handlers for the fault tests. The message body (JSON) says what to do:

    {"steps": 20, "step": 0.1, "checkpoint": true, "block": 3.5}

`steps`: units of work of `step` seconds each, checking the cancellation token
between units (and checkpointing `{"next": i}` after each with `checkpoint`);
the result is written to the fenced effect store at the end. `blocking` instead
blocks its event loop with `time.sleep(block)`, the mistake the heartbeat thread
exists for.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from leaseq import AsyncContext, Context, HandlerCancelled, Message
from worker_handlers.effects import EffectStore


def _plan(message: Message) -> dict[str, Any]:
    plan: dict[str, Any] = json.loads(message.body)
    return plan


def _start(message: Message) -> int:
    cursor = message.checkpoint
    return int(cursor["next"]) if isinstance(cursor, dict) else 0


def steps(message: Message, ctx: Context) -> None:
    """A sync handler that honours its cancellation token between units."""
    store = EffectStore()
    plan = _plan(message)
    start = _start(message)
    store.record(message, "started", start)
    try:
        for unit in range(start, int(plan["steps"])):
            time.sleep(float(plan["step"]))
            ctx.raise_if_cancelled()
            store.record(message, "unit", unit)
            if plan.get("checkpoint"):
                ctx.checkpoint({"next": unit + 1})
                store.record(message, "checkpointed", unit + 1)
        ctx.raise_if_cancelled()
        applied = store.apply(message, f"done by fencing {message.fencing_token}")
        store.record(message, "finished", applied)
    except HandlerCancelled as exc:
        store.record(message, "cancelled", exc.reason.value)
        raise


async def steps_async(message: Message, ctx: AsyncContext) -> None:
    """The same work as an async handler: asyncio cancellation stops it."""
    store = EffectStore()
    plan = _plan(message)
    start = _start(message)
    store.record(message, "started", start)
    try:
        for unit in range(start, int(plan["steps"])):
            await asyncio.sleep(float(plan["step"]))
            store.record(message, "unit", unit)
            if plan.get("checkpoint"):
                await ctx.checkpoint({"next": unit + 1})
                store.record(message, "checkpointed", unit + 1)
        ctx.raise_if_cancelled()
        applied = store.apply(message, f"done by fencing {message.fencing_token}")
        store.record(message, "finished", applied)
    except (asyncio.CancelledError, HandlerCancelled):
        reason = ctx.cancel_reason
        store.record(message, "cancelled", reason.value if reason else "?")
        raise


async def blocking(message: Message, ctx: AsyncContext) -> None:
    """An async handler that blocks its event loop (sync code in an async handler)."""
    store = EffectStore()
    store.record(message, "started")
    time.sleep(float(_plan(message)["block"]))  # noqa: ASYNC251 - the point of the test
    applied = store.apply(message, f"done by fencing {message.fencing_token}")
    store.record(message, "finished", applied)

