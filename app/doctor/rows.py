"""The rows `leaseq doctor`'s statements (app/doctor/queries.sql) return, one TypedDict per shape,
named in each statement's `-- returns:` header. A column that may be NULL is
`X | None`. tests/engine/test_typed_rows.py prepares every statement on
PostgreSQL and holds these to the columns it answers: names and types.
"""

from __future__ import annotations

from datetime import datetime
from typing import TypedDict


class VersionRow(TypedDict):
    server_version: str


class MigratedRow(TypedDict):
    migrated: bool


class RevisionRow(TypedDict):
    version_num: str


class ExistsRow(TypedDict):
    exists: bool


class ConnectionLimitsRow(TypedDict):
    max_connections: int
    reserved: int
    others: int


class AutovacuumRow(TypedDict):
    server_on: bool
    track_counts: bool
    live_table: str
    table_on: bool


class DurabilityRow(TypedDict):
    synchronous_commit: str
    fsync: str
    full_page_writes: str


class ClockRow(TypedDict):
    now: float


class PortRow(TypedDict):
    port: int


class ReceiptKeysAgeRow(TypedDict):
    keys: int
    newest_days: float


class DefinersRow(TypedDict):
    functions: list[str]


class OwnerMembersRow(TypedDict):
    members: list[str]


class HorizonRow(TypedDict):
    """The engine's HorizonRow (app/queue/rows.py), the same statement's."""

    now: datetime
    next_xid: int
    kind: str | None
    xid_age: int | None
    since: datetime | None
    pid: int | None
    application_name: str | None
    username: str | None
    client_addr: str | None
    state: str | None
    backend_type: str | None
    database: str | None
    query: str | None
    slot_name: str | None
    slot_type: str | None
    gid: str | None
