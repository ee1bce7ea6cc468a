"""`leaseq grants`: which PostgreSQL roles may send to and settle on which
queues through the SQL API (docs/transactions.md), in the scope words of API
keys. Kept in leaseq.grants and read by the functions themselves on every
call, so a change holds from the next call on, with no process to tell."""

from __future__ import annotations

from typing import Any, TextIO

from app.auth.scopes import Scope
from app.auth.sql import Q
from app.config import Settings
from app.db.connector import Connector
from app.db.engine import engine_for


async def run(command: str, args: Any, *, settings: Settings, database_url: str,
              out: TextIO) -> int:
    engine = engine_for(settings, pool_size=1, url=database_url)
    db = Connector(engine)
    try:
        if command == "list":
            print(f"{'ROLE':24} {'SCOPE':40} GRANTED", file=out)
            for grant in await db.fetch(Q.list_grants):
                granted = grant["created_at"].isoformat(timespec="seconds")
                print(f"{grant['role']:24} {grant['scope']:40} {granted}", file=out)
            return 0
        # Parsed as an API key's scopes are: the same words, the same errors.
        scopes = [Scope.parse(text) for text in args.scope]
        if command == "add":
            async with db.transaction() as session:
                (role,) = await session.fetch(Q.role_exists, {"role": args.role})
                if not role["exists"]:
                    print(f"leaseq grants: role {args.role} does not exist "
                          f"(CREATE ROLE {args.role} LOGIN ...)", file=out)
                    return 1
                for scope in scopes:
                    await session.fetch(Q.add_grant, {"role": args.role, "scope": str(scope)})
            print(f"granted {args.role}: {' '.join(map(str, scopes))}", file=out)
            return 0
        missing = []
        async with db.transaction() as session:
            for scope in scopes:
                (row,) = await session.fetch(
                    Q.remove_grant, {"role": args.role, "scope": str(scope)}
                )
                if not row["removed"]:
                    missing.append(str(scope))
        if missing:
            print(f"leaseq grants: {args.role} had no grant {' '.join(missing)}", file=out)
            return 1
        print(f"removed from {args.role}: {' '.join(args.scope)}", file=out)
        return 0
    finally:
        await engine.dispose()
