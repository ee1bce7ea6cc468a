"""The API keys of both front doors, kept in PostgreSQL.

Every process caches the keys it has seen. A change (create, revoke) is
announced with NOTIFY, and every process drops its cache when it hears one,
so a revoked key stops working everywhere as soon as the notification
arrives. While the LISTEN connection is down, cached keys live one second.

An id no usable key has is refused without a query (app/auth/key_ids.py).

Keys given in LEASEQ_SQS_CREDENTIALS (the older shorthand) live only in the
configuration: each is a key with every scope, never written to the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.auth import tokens
from app.auth.key_ids import KeyIds
from app.auth.rows import KeyInfoRow
from app.auth.scopes import Principal, Scope, parse_scopes
from app.auth.sql import Q
from app.db.connector import Connector
from app.errors import Unauthenticated

_log = logging.getLogger(__name__)

NOTICE = "keys:changed"
CACHE_LISTENING = 60.0
"""Seconds a cached key lives while changes are announced (a safety net only)."""
CACHE_DEAF = 1.0
"""Seconds a cached key lives while this process may miss an announcement."""
ALL_SCOPES = ("admin:*",)


@dataclass(frozen=True)
class KeyInfo:
    id: str
    name: str
    scopes: list[str]
    rate_per_second: float | None
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None

    @classmethod
    def of(cls, row: KeyInfoRow) -> KeyInfo:
        return cls(
            id=row["id"], name=row["name"], scopes=list(row["scopes"]),
            rate_per_second=row["rate_per_second"], created_at=row["created_at"],
            expires_at=row["expires_at"], revoked_at=row["revoked_at"],
            last_used_at=row["last_used_at"],
        )


@dataclass(frozen=True)
class _Cached:
    principal: Principal
    secret_hash: bytes
    secret: str | None  # unsealed, for SigV4; None if this master cannot open it
    until: float


class KeyStore:
    def __init__(
        self,
        db: Connector,
        *,
        master: bytes,
        listening: Callable[[], bool],
        static: Mapping[str, str] | None = None,
    ) -> None:
        self._db = db
        self._master = master
        self._listening = listening
        # id -> (principal, secret, its hash): hashed once, not per request.
        self._static = {
            key_id: (Principal(key_id, "LEASEQ_SQS_CREDENTIALS", parse_scopes(ALL_SCOPES)),
                     secret, tokens.secret_hash(secret))
            for key_id, secret in (static or {}).items()
        }
        self._cache: dict[str, _Cached] = {}
        # Bumped by each notice: a lookup that began before one read what may
        # have changed since, so it answers once but is not cached.
        self._generation = 0
        self._ids = KeyIds(self._read_ids, spawn=self._spawn)
        # Stored keys that are revoked or expired: no more than the table holds.
        self._unusable: dict[str, float] = {}
        self._required: bool | None = None  # None: not read yet
        self._touched: dict[str, float] = {}
        self._background: set[asyncio.Task[None]] = set()

    # -- state ------------------------------------------------------------------

    @property
    def enforcing(self) -> bool:
        """A key exists or once did, so every request must present a valid one
        (none may be left: then every request is refused). Call `ensure` first."""
        return bool(self._static) or bool(self._required)

    async def ensure(self) -> None:
        """Reads whether keys are required if that is not known yet (the database
        was down at start): DatabaseUnavailable until it can be read."""
        if self._required is None and not self._static:
            await self.refresh()

    async def refresh(self) -> None:
        """Re-read whether keys are required. Only ever turns it on: no change a
        request can make to the keys opens the doors again."""
        if not self._required:
            (row,) = await self._db.fetch(Q.keys_required)
            self._required = row["required"]

    def on_notice(self, text: str) -> None:
        """A notification: keys changed (or the channel was down: anything may have)."""
        if text in (NOTICE, "*:changed"):
            self._generation += 1
            self._cache.clear()
            self._unusable.clear()
            self._ids.changed()
            self._spawn(self._refresh_quietly())

    async def _refresh_quietly(self) -> None:
        try:
            await self.refresh()
            await self._ids.read()
        except Exception as exc:  # the next notification or request tries again
            _log.warning("could not re-read the API keys: %s", exc)

    # -- checks -------------------------------------------------------------------

    async def bearer(self, token: str) -> Principal:
        """The principal of `<id>.<secret>`; Unauthenticated otherwise."""
        parts = tokens.split_bearer(token)
        if parts is None:
            raise Unauthenticated("The API key is malformed: expected <key id>.<secret>.")
        key_id, secret = parts
        static = self._static.get(key_id)
        if static is not None:
            principal, _, expected = static
            if not tokens.hash_matches(secret, expected):
                raise Unauthenticated("The API key is not valid.")
            return principal
        cached = await self._lookup(key_id)
        if cached is None or not tokens.hash_matches(secret, cached.secret_hash):
            raise Unauthenticated("The API key is not valid, revoked or expired.")
        self._touch(key_id)
        return cached.principal

    async def holder(self, key_id: str) -> Principal | None:
        """The principal of a usable key by its id alone: for a dashboard session
        (app/auth/sessions.py), whose key's secret was checked at sign-in."""
        static = self._static.get(key_id)
        if static is not None:
            return static[0]
        if not tokens.KEY_ID.fullmatch(key_id):
            return None
        cached = await self._lookup(key_id)
        if cached is None:
            return None
        self._touch(key_id)
        return cached.principal

    async def signing_secret(self, key_id: str) -> tuple[Principal, str] | None:
        """The principal and secret of an access key id, for checking a SigV4 signature."""
        static = self._static.get(key_id)
        if static is not None:
            return static[0], static[1]
        if not tokens.KEY_ID.fullmatch(key_id):
            return None
        cached = await self._lookup(key_id)
        if cached is None or cached.secret is None:
            return None
        self._touch(key_id)
        return cached.principal, cached.secret

    async def _lookup(self, key_id: str) -> _Cached | None:
        entry = self._cache.get(key_id)
        now = time.monotonic()
        if entry is not None and entry.until > now:
            return entry
        if self._unusable.get(key_id, 0.0) > now or not await self._ids.knows(key_id):
            return None
        generation = self._generation
        rows = await self._db.fetch(Q.get_api_key, {"id": key_id})
        row = rows[0] if rows else None
        lifetime = CACHE_LISTENING if self._listening() else CACHE_DEAF
        if row is None:  # revoked or expired: its id stays known
            # Kept whatever was heard meanwhile: no change makes a key usable again.
            self._cache.pop(key_id, None)
            self._unusable[key_id] = now + lifetime
            return None
        secret = tokens.unseal(
            self._master, row["id"], row["sealed_secret"], row["secret_hash"]
        )
        if secret is None:
            _log.warning(
                "API key %s was sealed with another LEASEQ_SECRET: it works on REST but "
                "cannot sign SQS requests here", row["id"],
            )
        if row["seconds_left"] is not None:
            lifetime = min(lifetime, max(row["seconds_left"], 0.0))
        entry = _Cached(
            principal=Principal(
                key_id=row["id"], name=row["name"],
                scopes=tuple(Scope.parse(s) for s in row["scopes"]),
                rate_per_second=row["rate_per_second"],
            ),
            secret_hash=bytes(row["secret_hash"]),
            secret=secret,
            until=now + lifetime,
        )
        if generation == self._generation:
            self._cache[key_id] = entry
        return entry

    def _touch(self, key_id: str) -> None:
        # last_used_at is for operators: written at most once a minute per key
        # per process, after the answer, never on the request's own time.
        now = time.monotonic()
        if self._touched.get(key_id, 0.0) > now:
            return
        self._touched[key_id] = now + 60.0
        self._spawn(self._write_touch(key_id))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Background work, kept referenced until done and cancelled by close()."""
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _write_touch(self, key_id: str) -> None:
        with contextlib.suppress(Exception):
            await self._db.fetch(Q.touch_api_key, {"id": key_id})

    # -- management ---------------------------------------------------------------

    async def create(
        self,
        name: str,
        scopes: list[str],
        *,
        expires_in: float | None = None,
        rate_per_second: float | None = None,
        key_id: str | None = None,
        secret: str | None = None,
    ) -> tuple[KeyInfo, str] | None:
        """A new key and its secret (shown once). With `key_id` and `secret` given
        (a bootstrap key), None when that id exists already."""
        parse_scopes(scopes)
        key_id = key_id or tokens.new_key_id()
        secret = secret or tokens.new_secret()
        async with self._db.transaction() as session:
            row = await session.fetchrow(Q.create_api_key, {
                "id": key_id, "name": name,
                "secret_hash": tokens.secret_hash(secret),
                "sealed_secret": tokens.seal(self._master, key_id, secret),
                "scopes": [str(Scope.parse(s)) for s in scopes],
                "rate_per_second": rate_per_second,
                "expires_in": expires_in,
            })
            if row is None:
                return None
            await session.fetch(Q.notify_keys, {"notice": NOTICE})
        self._required = True
        self._ids.add(key_id)
        return KeyInfo.of(row), secret

    async def list(self) -> list[KeyInfo]:
        return [KeyInfo.of(r) for r in await self._db.fetch(Q.list_api_keys)]

    async def revoke(self, key_id: str) -> bool:
        if not tokens.KEY_ID.fullmatch(key_id):
            return False  # no key has such an id; and PostgreSQL refuses a NUL
        async with self._db.transaction() as session:
            revoked = await session.fetchrow(Q.revoke_api_key, {"id": key_id})
            if revoked is not None:
                await session.fetch(Q.notify_keys, {"notice": NOTICE})
        self._generation += 1
        self._cache.pop(key_id, None)
        return revoked is not None

    async def _read_ids(self) -> Iterable[str]:
        return [row["id"] for row in await self._db.fetch(Q.api_key_ids)]

    async def close(self) -> None:
        self._ids.close()
        for task in list(self._background):
            task.cancel()
        for task in list(self._background):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

