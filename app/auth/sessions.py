"""The dashboard's sign-ins: the cookie names a session, never the API key.

Signing in (`POST /ui/session`) checks the key, then stores a session: a random
id, the key it stands for and when it ends (LEASEQ_DASHBOARD_SESSION_SECONDS
on, by the database's clock). The cookie is the id and an HMAC-SHA256 of it
under a key drawn from the master secret (LEASEQ_SECRET), so a cookie the
service did not make is refused by its signature alone, with no query; the
table keeps only the id's SHA-256, so a copy of it signs no one in.

Each process caches the sessions it has seen, as the KeyStore caches keys.
Signing out deletes the row and announces it in the same transaction; every
process drops its cache when it hears that, so a copied cookie stops working
everywhere at once. While the LISTEN connection is down, a cached session
lives a second. A lookup under way when a notice comes answers once but is
not cached. A session that is gone (signed out, expired) never comes back, so
its id is refused from memory after one query.

A key holds at most SESSIONS_PER_KEY live sessions: a sign-in past that ends
the key's oldest in the same statement and announces it as a sign-out does.
The cache and the memory of ended sessions are bounded, least recently used
leaving first.

A session stands for its key, checked on every request as a bearer key is:
revoking the key, or its expiry, ends its sessions too.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from app.auth.scopes import Principal
from app.auth.sql import Q
from app.auth.store import CACHE_DEAF, CACHE_LISTENING, KeyStore
from app.db.connector import Connector

NOTICE = "sessions:changed"
COOKIE = "leaseq_session"
"""The dashboard's cookie: HttpOnly (no script reads it), SameSite=Strict."""
_CONTEXT = b"leaseq dashboard session v1\x00"
_ID_BYTES = 16
_COOKIE_SHAPE = re.compile(r"[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}")
SESSIONS_PER_KEY = 20
"""Live sessions one key may hold; a sign-in past that ends the key's oldest.
A person signs in from a few browsers, a team sharing a key from a few more:
20 is room for them all, while a key signing in as fast as its rate allows
(any valid key may, even `send:x`) stores no more than 20 rows of 12 hours."""
_CACHE_HELD = 10_000
"""Sessions a process caches at most, the least recently used leaving first
(it is read again at its next use)."""
_GONE_HELD = 10_000
"""Ended sessions remembered at most, the oldest forgotten first (one more
query if its cookie comes back: the database says it is gone)."""


@dataclass(frozen=True)
class _Cached:
    key_id: str
    until: float


def _text(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


class DashboardSessions:
    def __init__(
        self,
        db: Connector,
        *,
        master: bytes,
        keys: KeyStore,
        listening: Callable[[], bool],
        lifetime: float,
    ) -> None:
        self._db = db
        self._keys = keys
        self._listening = listening
        self.lifetime = lifetime
        # Its own key, so a MAC made here is no other use's of the master secret.
        self._mac_key = hmac.new(master, _CONTEXT, hashlib.sha256).digest()
        self._cache: OrderedDict[bytes, _Cached] = OrderedDict()
        self._gone: OrderedDict[bytes, None] = OrderedDict()
        # Bumped by each notice: a lookup that began before one may have read a
        # session ended since, so it answers once but is not cached.
        self._generation = 0

    async def start(self, key_id: str) -> str:
        """A new session of `key_id` (whose secret the caller checked): its cookie."""
        session_id = secrets.token_bytes(_ID_BYTES)
        async with self._db.transaction() as session:
            crowded = await session.fetch(Q.start_dashboard_session, {
                "id_hash": hashlib.sha256(session_id).digest(),
                "key_id": key_id,
                "lifetime": self.lifetime,
                "keep": SESSIONS_PER_KEY - 1,
            })
            if crowded:  # ended as a sign-out is, on every process
                await session.fetch(Q.notify_keys, {"notice": NOTICE})
        for row in crowded:
            self._forget(bytes(row["id_hash"]))
        return f"{_text(session_id)}.{_text(self._mac(session_id))}"

    async def principal(self, cookie: str) -> Principal | None:
        """Whom the cookie signs in: its session's key, while both last."""
        id_hash = self._open(cookie)
        if id_hash is None or id_hash in self._gone:
            return None
        key_id = await self._key_of(id_hash)
        if key_id is None:
            return None
        return await self._keys.holder(key_id)

    async def end(self, cookie: str) -> None:
        """Signs the cookie's session out on every process (nothing if it has none)."""
        id_hash = self._open(cookie)
        if id_hash is None:
            return
        async with self._db.transaction() as session:
            ended = await session.fetchrow(Q.end_dashboard_session, {"id_hash": id_hash})
            if ended is not None:
                await session.fetch(Q.notify_keys, {"notice": NOTICE})
        self._forget(id_hash)

    def on_notice(self, text: str) -> None:
        """A notification: a session ended (or the channel was down: any may have)."""
        if text in (NOTICE, "*:changed"):
            self._generation += 1
            self._cache.clear()

    def _mac(self, session_id: bytes) -> bytes:
        return hmac.new(self._mac_key, session_id, hashlib.sha256).digest()

    def _open(self, cookie: str) -> bytes | None:
        """The id hash of a cookie this service signed, exactly as it wrote it;
        None for any other."""
        if not _COOKIE_SHAPE.fullmatch(cookie):
            return None
        id_text, _, mac_text = cookie.partition(".")
        session_id = base64.urlsafe_b64decode(id_text + "==")
        if _text(session_id) != id_text or not hmac.compare_digest(
                _text(self._mac(session_id)), mac_text):
            return None
        return hashlib.sha256(session_id).digest()

    async def _key_of(self, id_hash: bytes) -> str | None:
        now = time.monotonic()
        cached = self._cache.get(id_hash)
        if cached is not None and cached.until > now:
            self._cache.move_to_end(id_hash)
            return cached.key_id
        generation = self._generation
        rows = await self._db.fetch(Q.get_dashboard_session, {"id_hash": id_hash})
        if not rows:
            self._forget(id_hash)
            return None
        (row,) = rows
        lifetime = CACHE_LISTENING if self._listening() else CACHE_DEAF
        until = now + min(lifetime, max(row["seconds_left"], 0.0))
        if generation == self._generation:
            self._cache[id_hash] = _Cached(row["key_id"], until)
            self._cache.move_to_end(id_hash)
            while len(self._cache) > _CACHE_HELD:
                self._cache.popitem(last=False)
        return row["key_id"]

    def _forget(self, id_hash: bytes) -> None:
        self._cache.pop(id_hash, None)
        self._gone[id_hash] = None
        self._gone.move_to_end(id_hash)
        while len(self._gone) > _GONE_HELD:
            self._gone.popitem(last=False)
