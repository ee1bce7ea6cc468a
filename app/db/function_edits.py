"""Migrations that change a SQL function by a few words: the function read
back from PostgreSQL, each edit made where it is found exactly once, and the
result run again (CREATE OR REPLACE keeps the function's owner and grants: the SQL
API's SECURITY DEFINER functions stay their role's, migration 0018; a DROP and a
CREATE would give them to the migrating role, a superuser perhaps).

A function that was changed outside the migrations no longer has the text an
edit expects, and the migration stops rather than guess."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.engine import Connection

Edit = tuple[str, str, str]
"""(function signature, text before, text after)."""


def edit_functions(bind: Connection, edits: Sequence[Edit], *, forward: bool = True) -> None:
    """Makes `edits` (forward) or undoes them, in each function's turn."""
    for function in dict.fromkeys(name for name, _, _ in edits):
        definition = bind.exec_driver_sql(
            f"SELECT pg_get_functiondef('{function}'::regprocedure)").scalar_one()
        for name, before, after in edits:
            if name != function:
                continue
            old, new = (before, after) if forward else (after, before)
            if definition.count(old) != 1:
                raise RuntimeError(
                    f"{function}: expected {old!r} once in its definition; was it "
                    f"changed outside the migrations?")
            definition = definition.replace(old, new)
        bind.exec_driver_sql(definition)


def functions_owner(bind: Connection, function: str) -> str | None:
    """The role owning `function` (the SQL API's, migration 0018), when it is not
    the migrating one: what a migration grants it for the writes it edits in."""
    owner: str | None = bind.exec_driver_sql(
        f"SELECT p.proowner::regrole::text FROM pg_catalog.pg_proc AS p "
        f"WHERE p.oid = '{function}'::regprocedure AND p.proowner <> "
        f"(SELECT oid FROM pg_catalog.pg_roles WHERE rolname = current_user)").scalar()
    return owner
