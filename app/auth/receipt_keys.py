"""The keys that sign receipt handles, kept in the database and shared by
every process of the service.

Rotation: `leaseq keys rotate-receipts` adds a key. Every process hears of it
(NOTIFY) and verifies with it at once, but signs with it only once it is
ACTIVATION_SECONDS old, so no handle signed with a new key reaches a process
that does not know the key yet. The older keys keep verifying the handles
they signed until an operator retires them (`leaseq keys retire-receipts ID`),
once no lease they signed can still be held.
"""

from __future__ import annotations

import asyncio
import logging
import secrets

from app.auth.sql import Q
from app.db.connector import Connector, Session
from app.queue.receipts import ReceiptSigner

_log = logging.getLogger(__name__)

NOTICE = "receipts:changed"
ACTIVATION_SECONDS = 10.0


class ReceiptKeyring:
    """Loads the receipt keys into a signer, and reloads them when they change."""

    def __init__(self, db: Connector, *, legacy: bytes | None = None) -> None:
        self._db = db
        self.signer = ReceiptSigner({}, legacy=legacy)
        """Empty until `start` has reached the database."""
        self.loaded = False
        self._timer: asyncio.TimerHandle | None = None
        self._reloading: asyncio.Task[None] | None = None

    async def start(self) -> None:
        async with self._db.transaction() as session:
            await ensure_first(session)
        await self.reload()
        self.loaded = True

    async def reload(self) -> None:
        rows = await self._db.fetch(Q.receipt_keys, {"activation": ACTIVATION_SECONDS})
        if not rows:
            _log.error("no receipt key is left unretired; keeping the keys loaded before")
            return
        keys = {row["id"]: bytes(row["secret"]) for row in rows}
        active = [row["id"] for row in rows if row["activates_in"] <= 0]
        current = max(active) if active else min(keys)
        self.signer.set_keys(keys, current=current)
        pending = [row["activates_in"] for row in rows if row["activates_in"] > 0]
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if pending:
            self._timer = asyncio.get_running_loop().call_later(
                min(pending) + 0.05, self.on_notice, NOTICE
            )

    def on_notice(self, text: str) -> None:
        if text not in (NOTICE, "*:changed") or not self.loaded:
            return
        if self._reloading is not None and not self._reloading.done():
            return
        self._reloading = asyncio.get_running_loop().create_task(self._reload_quietly())

    async def _reload_quietly(self) -> None:
        try:
            await self.reload()
        except Exception as exc:
            _log.warning("could not re-read the receipt keys: %s", exc)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._reloading is not None:
            self._reloading.cancel()


async def ensure_first(session: Session) -> None:
    """Key 1, on a database that has none yet. Replicas starting together, or a
    rotation before any service started: the first insert wins."""
    await session.execute(Q.first_receipt_key, {"secret": secrets.token_bytes(32)})


async def rotate(session: Session) -> int:
    """Adds a receipt key (it signs after ACTIVATION_SECONDS); its id."""
    await ensure_first(session)
    await session.execute(Q.lock_receipt_keys)
    key_id: int = await session.fetchval(
        Q.rotate_receipt_key, {"secret": secrets.token_bytes(32)}
    )
    await session.fetch(Q.notify_keys, {"notice": NOTICE})
    return key_id


async def retire(session: Session, key_id: int) -> bool:
    """Retires a key (never the newest); handles it signed stop verifying."""
    retired = await session.fetchrow(Q.retire_receipt_key, {"id": key_id})
    if retired is not None:
        await session.fetch(Q.notify_keys, {"notice": NOTICE})
    return retired is not None
