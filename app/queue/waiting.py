"""Waking long-polling receivers without holding database connections.

Receivers park on an in-process event per queue. Events are set by:
- a notification on the `leaseq` channel, which every send and release issues
  in its own transaction (so it arrives only after commit, from any process);
- the receiver's own timer, set to the moment the queue's next delayed message
  or lease becomes visible, as computed by PostgreSQL.
One dedicated LISTEN connection per process feeds the events. While it is down
the receivers fall back to re-checking once a second, and when it comes back
every receiver re-checks once, so a notification lost in between costs at most
one round.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter

import asyncpg

from app.db.engine import plain_url

_log = logging.getLogger(__name__)

CHANNEL = "leaseq"
DEGRADED_RECHECK_SECONDS = 1.0


class WaitHub:
    """Per-queue wake-up events for the receivers of this process."""

    def __init__(self) -> None:
        self._events: dict[int, asyncio.Event] = {}
        self.parked: Counter[int] = Counter()
        """Receivers waiting right now, per queue id."""
        self.listening = False
        self.closed = False

    def event(self, queue_id: int) -> asyncio.Event:
        """The event the next notification for `queue_id` will set.

        Take it *before* looking for messages: a send that commits between the
        look and the wait then still wakes the receiver.
        """
        event = self._events.get(queue_id)
        if event is None:
            event = self._events[queue_id] = asyncio.Event()
        return event

    def notify(self, queue_id: int) -> None:
        event = self._events.pop(queue_id, None)
        if event is not None:
            event.set()

    def notify_all(self) -> None:
        events, self._events = self._events, {}
        for event in events.values():
            event.set()

    def close(self) -> None:
        """Shutting down: wake everyone, and let nobody wait again."""
        self.closed = True
        self.notify_all()

    def recheck_cap(self) -> float | None:
        return None if self.listening else DEGRADED_RECHECK_SECONDS


class Listener:
    """The LISTEN connection of one process; reconnects with backoff."""

    def __init__(self, url: str, hub: WaitHub) -> None:
        self._url = plain_url(url)
        self._hub = hub
        self._task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="leaseq-listener")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        backoff = 0.1
        while True:
            lost = asyncio.Event()
            conn: asyncpg.Connection | None = None
            try:
                conn = await asyncpg.connect(
                    self._url, server_settings={"application_name": "leaseq-listener"}
                )
                conn.add_termination_listener(lambda _c, lost=lost: lost.set())
                await conn.add_listener(CHANNEL, self._on_notify)
                self._hub.listening = True
                self.connected.set()
                # Anything sent while we were not listening: look again.
                self._hub.notify_all()
                backoff = 0.1
                await lost.wait()
                _log.warning("listener connection lost; reconnecting")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                _log.warning("listener cannot connect (%s); retrying in %.1fs", exc, backoff)
            finally:
                self._hub.listening = False
                self.connected.clear()
                if conn is not None and not conn.is_closed():
                    conn.terminate()
            self._hub.notify_all()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        try:
            self._hub.notify(int(payload))
        except ValueError:
            _log.warning("ignoring malformed notification %r", payload)
