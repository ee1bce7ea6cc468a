"""The engine's named statements: app/queue/queries.sql, loaded once."""

from __future__ import annotations

from app.db.queries import load

Q = load("app.queue")
