"""`leaseq keys`: API keys and receipt keys, managed straight in the database
(no running service needed; every running process hears of the change)."""

from __future__ import annotations

import re
from typing import Any, TextIO

from app.auth import receipt_keys
from app.auth.sql import Q
from app.auth.store import KeyStore
from app.config import Settings
from app.db.connector import Connector
from app.db.engine import engine_for

_DURATION = re.compile(r"^(\d+)([smhdw]?)$")
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> int:
    """`90d`, `12h`, `30m`, `45s`, `2w` or plain seconds."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a duration such as 90d, 12h, 30m or 3600")
    return int(match[1]) * _UNIT[match[2]]


async def run(command: str, args: Any, *, settings: Settings, database_url: str,
              out: TextIO) -> int:
    engine = engine_for(settings, pool_size=2, url=database_url)
    db = Connector(engine)
    store = KeyStore(db, master=settings.master_secret(), listening=lambda: False)
    try:
        if command == "create":
            expires = None if args.expires is None else parse_duration(args.expires)
            created = await store.create(args.name, args.scope, expires_in=expires,
                                         rate_per_second=args.rate)
            assert created is not None
            info, secret = created
            print(f"key id:  {info.id}", file=out)
            print(f"secret:  {secret}", file=out)
            print(f"scopes:  {' '.join(info.scopes)}", file=out)
            if info.expires_at is not None:
                print(f"expires: {info.expires_at.isoformat()}", file=out)
            print("", file=out)
            print("The secret is shown only now. REST: Authorization: Bearer "
                  f"{info.id}.{secret}", file=out)
            print(f"SQS clients: aws_access_key_id={info.id} "
                  f"aws_secret_access_key={secret}", file=out)
            return 0
        if command == "list":
            print(f"{'ID':22} {'NAME':20} {'STATE':8} {'EXPIRES':25} {'LAST USED':25} SCOPES",
                  file=out)
            for key in await store.list():
                state = "revoked" if key.revoked_at else "active"
                until = key.expires_at.isoformat(timespec="seconds") if key.expires_at else "-"
                used = (key.last_used_at.isoformat(timespec="seconds")
                        if key.last_used_at else "-")
                print(f"{key.id:22} {key.name[:20]:20} {state:8} {until:25} {used:25} "
                      f"{' '.join(key.scopes)}", file=out)
            return 0
        if command == "revoke":
            if not await store.revoke(args.key_id):
                print(f"leaseq keys: no unrevoked key {args.key_id}", file=out)
                return 1
            print(f"revoked {args.key_id}", file=out)
            return 0
        if command == "rotate-receipts":
            async with db.transaction() as session:
                key_id = await receipt_keys.rotate(session)
            print(f"receipt key {key_id} added: it signs new handles in "
                  f"{receipt_keys.ACTIVATION_SECONDS:g} s; older keys still verify "
                  "until retired (leaseq keys retire-receipts ID)", file=out)
            return 0
        if command == "retire-receipts":
            async with db.transaction() as session:
                retired = await receipt_keys.retire(session, args.key_id)
            if not retired:
                print(f"leaseq keys: receipt key {args.key_id} is unknown, retired already, "
                      "or the newest (which must keep signing)", file=out)
                return 1
            print(f"retired receipt key {args.key_id}", file=out)
            return 0
        if command == "list-receipts":
            for receipt_key in await db.fetch(Q.list_receipt_keys):
                state = "retired" if receipt_key["retired_at"] else "active"
                since = receipt_key["created_at"].isoformat(timespec="seconds")
                print(f"{receipt_key['id']:5} {state:8} {since}", file=out)
            return 0
        raise ValueError(f"unknown keys command {command}")
    finally:
        await engine.dispose()
