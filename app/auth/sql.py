"""The keys' named statements: app/auth/queries.sql, loaded once, typed."""

from __future__ import annotations

from app.auth.rows import (
    AnyKeyRow,
    CrowdedSessionRow,
    DashboardSessionRow,
    EndedSessionRow,
    ExistsRow,
    GrantAddedRow,
    GrantRow,
    KeyIdRow,
    KeyInfoRow,
    KeyRow,
    ListedReceiptKeyRow,
    NotifiedRow,
    ReceiptKeyIdRow,
    ReceiptKeyRow,
    RemovedRow,
    RequiredRow,
)
from app.db.queries import Queries, Query, load


class Statements(Queries):
    """Each statement of queries.sql with the row it returns (load checks both ways)."""

    create_api_key: Query[KeyInfoRow]
    get_api_key: Query[KeyRow]
    api_key_ids: Query[KeyIdRow]
    list_api_keys: Query[KeyInfoRow]
    revoke_api_key: Query[KeyIdRow]
    keys_required: Query[RequiredRow]
    any_api_key: Query[AnyKeyRow]
    touch_api_key: Query[None]
    notify_keys: Query[NotifiedRow]
    receipt_keys: Query[ReceiptKeyRow]
    first_receipt_key: Query[None]
    rotate_receipt_key: Query[ReceiptKeyIdRow]
    lock_receipt_keys: Query[None]
    retire_receipt_key: Query[ReceiptKeyIdRow]
    list_receipt_keys: Query[ListedReceiptKeyRow]
    role_exists: Query[ExistsRow]
    add_grant: Query[GrantAddedRow]
    remove_grant: Query[RemovedRow]
    list_grants: Query[GrantRow]
    start_dashboard_session: Query[CrowdedSessionRow]
    get_dashboard_session: Query[DashboardSessionRow]
    end_dashboard_session: Query[EndedSessionRow]


Q = load("app.auth", Statements)
