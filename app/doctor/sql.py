"""`leaseq doctor`'s named statements: app/doctor/queries.sql, loaded once, typed."""

from __future__ import annotations

from app.db.queries import Queries, Query, load
from app.doctor.rows import (
    AutovacuumRow,
    ClockRow,
    ConnectionLimitsRow,
    DefinersRow,
    DurabilityRow,
    ExistsRow,
    HorizonRow,
    MigratedRow,
    OwnerMembersRow,
    PortRow,
    ReceiptKeysAgeRow,
    RevisionRow,
    VersionRow,
)


class Statements(Queries):
    """Each statement of queries.sql with the row it returns (load checks both ways)."""

    server_version: Query[VersionRow]
    has_schema: Query[MigratedRow]
    revision: Query[RevisionRow]
    usable_api_key: Query[ExistsRow]
    api_key_revoked: Query[ExistsRow]
    connection_limits: Query[ConnectionLimitsRow]
    autovacuum: Query[AutovacuumRow]
    durability: Query[DurabilityRow]
    database_clock: Query[ClockRow]
    server_port: Query[PortRow]
    receipt_keys_age: Query[ReceiptKeysAgeRow]
    superuser_definers: Query[DefinersRow]
    definer_owner_members: Query[OwnerMembersRow]
    horizon_holder: Query[HorizonRow]


Q = load("app.doctor", Statements)
