"""An effect store shared by worker processes: one SQLite file.

`events` is what handlers report (started, checkpointed, cancelled, finished),
stamped with the system-wide monotonic clock (CLOCK_MONOTONIC is the same for
every process on Linux, so the test can compare it with its own).

`effects` is the downstream system a handler writes its result to, fenced: a
write lands only if its fencing token is larger than the one stored for the
message, the way a downstream system should use the token.
"""

from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV = "LEASEQ_TEST_EFFECTS"

SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY,
    at REAL NOT NULL,
    pid INTEGER NOT NULL,
    message_id TEXT NOT NULL,
    fencing INTEGER NOT NULL,
    receive_count INTEGER NOT NULL,
    kind TEXT NOT NULL,
    detail TEXT
);
CREATE TABLE IF NOT EXISTS effects (
    message_id TEXT PRIMARY KEY,
    fencing INTEGER NOT NULL,
    pid INTEGER NOT NULL,
    value TEXT
);
"""


@dataclass(frozen=True)
class Event:
    at: float
    pid: int
    message_id: str
    fencing: int
    receive_count: int
    kind: str
    detail: str | None


class EffectStore:
    def __init__(self, path: Path | str | None = None) -> None:
        self.path = Path(path if path is not None else os.environ[ENV])

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        conn.execute("PRAGMA busy_timeout = 30000")
        return conn

    def create(self) -> EffectStore:
        with self._connect() as conn:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.executescript(SCHEMA)
        return self

    def record(self, message: Any, kind: str, detail: object = None) -> None:
        conn = self._connect()
        try:
            conn.execute(
                "INSERT INTO events (at, pid, message_id, fencing, receive_count, kind, detail)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (time.monotonic(), os.getpid(), message.message_id, message.fencing_token,
                 message.receive_count, kind, None if detail is None else str(detail)),
            )
        finally:
            conn.close()

    def apply(self, message: Any, value: str) -> bool:
        """The fenced downstream write: lands only with a newer fencing token."""
        conn = self._connect()
        try:
            cursor = conn.execute(
                "INSERT INTO effects (message_id, fencing, pid, value) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (message_id) DO UPDATE"
                " SET fencing = excluded.fencing, pid = excluded.pid, value = excluded.value"
                " WHERE excluded.fencing > effects.fencing",
                (message.message_id, message.fencing_token, os.getpid(), value),
            )
            return cursor.rowcount == 1
        finally:
            conn.close()

    def events(self, kind: str | None = None) -> list[Event]:
        conn = self._connect()
        try:
            query = "SELECT at, pid, message_id, fencing, receive_count, kind, detail FROM events"
            rows = (
                conn.execute(query + " WHERE kind = ? ORDER BY id", (kind,)).fetchall()
                if kind is not None
                else conn.execute(query + " ORDER BY id").fetchall()
            )
        finally:
            conn.close()
        return [Event(*row) for row in rows]

    def effects(self) -> list[tuple[str, int, int, str]]:
        conn = self._connect()
        try:
            return list(conn.execute(
                "SELECT message_id, fencing, pid, value FROM effects ORDER BY message_id"
            ).fetchall())
        finally:
            conn.close()
