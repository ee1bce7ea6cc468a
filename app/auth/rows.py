"""The rows the keys' statements (app/auth/queries.sql) return, one TypedDict per shape,
named in each statement's `-- returns:` header. A column that may be NULL is
`X | None`. tests/engine/test_typed_rows.py prepares every statement on
PostgreSQL and holds these to the columns it answers: names and types.
"""

from __future__ import annotations

from datetime import datetime
from typing import TypedDict


class KeyInfoRow(TypedDict):
    id: str
    name: str
    scopes: list[str]
    rate_per_second: float | None
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None


class KeyRow(TypedDict):
    id: str
    name: str
    secret_hash: bytes
    sealed_secret: bytes
    scopes: list[str]
    rate_per_second: float | None
    seconds_left: float | None


class KeyIdRow(TypedDict):
    id: str


class RequiredRow(TypedDict):
    required: bool


class AnyKeyRow(TypedDict):
    any: bool


class NotifiedRow(TypedDict):
    pg_notify: None


class ReceiptKeyRow(TypedDict):
    id: int
    secret: bytes
    activates_in: float


class ReceiptKeyIdRow(TypedDict):
    id: int


class ListedReceiptKeyRow(TypedDict):
    id: int
    created_at: datetime
    retired_at: datetime | None


class ExistsRow(TypedDict):
    exists: bool


class GrantAddedRow(TypedDict):
    added: None


class RemovedRow(TypedDict):
    removed: bool


class GrantRow(TypedDict):
    role: str
    scope: str
    created_at: datetime


class DashboardSessionRow(TypedDict):
    key_id: str
    seconds_left: float


class EndedSessionRow(TypedDict):
    key_id: str


class CrowdedSessionRow(TypedDict):
    id_hash: bytes
