"""`leaseq doctor`'s checks: a deployment's settings and database, and for each
thing found wrong how to fix it (docs/operating.md, "leaseq doctor").

Each check is a function from what was gathered (the settings, a database
session, the deployment's shape) to a Finding. They read (app/doctor/queries.sql);
none changes anything, so the doctor is safe to run against a live deployment.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

from app.db.connector import DatabaseError
from app.db.engine import parse_url
from app.doctor.sql import Q
from app.errors import DatabaseUnavailable
from app.queue.horizon import XidClock, reading_of

if TYPE_CHECKING:
    from app.config import Settings
    from app.db.connector import Session


Status = Literal["ok", "warn", "fail"]

CLOCK_WARN_SECONDS = 1.0
CLOCK_FAIL_SECONDS = 30.0
RECEIPT_KEY_DAYS = 180
"""A receipt key older than this is due to be rotated (docs/security.md)."""
CONNECTIONS_PER_PROCESS_BEYOND_POOL = 2
"""The LISTEN connection and the maintenance lock's, beside LEASEQ_POOL_SIZE."""


@dataclass(frozen=True, slots=True)
class Finding:
    check: str
    status: Status
    found: str
    fix: str | None = None


@dataclass(frozen=True, slots=True)
class Deployment:
    """What the doctor cannot read from one process's settings: how many run."""

    replicas: int = 1
    workers: int = 1
    embedded: bool = False
    """The database is the data directory's embedded PostgreSQL."""

    @property
    def processes(self) -> int:
        return self.replicas * self.workers


def settings_findings(errors: list[str]) -> list[Finding]:
    """The settings that would not load (LEASEQ_SECRET too weak, say): each a failure."""
    return [Finding("settings", "fail", error,
                    "set the variable as README.md's table of settings says")
            for error in errors]


def check_secret(settings: Settings, deployment: Deployment) -> Finding:
    if settings.secret is not None:
        return Finding("secret", "ok", "LEASEQ_SECRET is set, and strong enough")
    if deployment.embedded:
        return Finding("secret", "ok", "LEASEQ_SECRET is unset: the secret kept in the "
                       f"data directory ({settings.data_dir}) serves this one host")
    fix = "set LEASEQ_SECRET to the same value on every replica (openssl rand -hex 32)"
    if deployment.replicas == 1 and settings.is_loopback():
        return Finding("secret", "warn",
                       "LEASEQ_SECRET is unset: this one host keeps a secret in its data "
                       "directory, which a second replica would not share", fix)
    return Finding(
        "secret", "fail",
        "LEASEQ_SECRET is unset while DATABASE_URL is set: each replica would use a "
        "secret of its own, and an SQS client's key would work on one of them only "
        "(leaseq serve refuses a public address so)", fix,
    )


async def check_keys(settings: Settings, conn: Session) -> Finding:
    if settings.is_loopback():
        return Finding("keys", "ok", f"listening on {settings.host}, the loopback")
    if settings.sqs_credentials is not None:
        return Finding("keys", "ok", f"listening on {settings.host}; SQS credentials set")
    usable = await conn.fetchval(Q.usable_api_key)
    if usable:
        return Finding("keys", "ok", f"listening on {settings.host}; an API key is usable")
    bootstrap = settings.bootstrap_admin_key()
    if bootstrap is not None and not await conn.fetchval(
            Q.api_key_revoked, {"id": bootstrap.partition(".")[0]}):
        return Finding("keys", "ok", f"listening on {settings.host}; LEASEQ_ADMIN_KEY is "
                       "created on start")
    return Finding(
        "keys", "fail",
        f"listening on {settings.host} with no usable API key: anyone who reaches the "
        "port may read, send and delete every message (leaseq serve refuses to start)",
        "leaseq keys create --name admin --scope 'admin:*', or set LEASEQ_ADMIN_KEY",
    )




async def check_migration(conn: Session, head: str) -> Finding:
    migrated = await conn.fetchval(Q.has_schema)
    current = await conn.fetchval(Q.revision) if migrated else None
    if current == head:
        return Finding("migration", "ok", f"at {head}, the latest")
    if current is None:
        return Finding("migration", "fail", "the database has no leaseq schema yet",
                       "leaseq migrate (leaseq serve migrates on start)")
    return Finding(
        "migration", "fail",
        f"at {current}, not {head}: behind this leaseq, or migrated by a newer one",
        "leaseq migrate; if the database is newer, upgrade this leaseq instead",
    )


async def check_connections(settings: Settings, deployment: Deployment,
                            conn: Session) -> Finding:
    if settings.pgbouncer != "off":
        return Finding("connections", "ok",
                       f"through PgBouncer ({settings.pgbouncer} pooling): its pool "
                       "size, not LEASEQ_POOL_SIZE, is what PostgreSQL sees")
    limits = await conn.fetchrow(Q.connection_limits)
    assert limits is not None
    usable = limits["max_connections"] - limits["reserved"]
    others = limits["others"]
    need = deployment.processes * (settings.pool_size + CONNECTIONS_PER_PROCESS_BEYOND_POOL)
    found = (f"{deployment.processes} process(es) x (LEASEQ_POOL_SIZE {settings.pool_size} + "
             f"{CONNECTIONS_PER_PROCESS_BEYOND_POOL}) = {need} connections; the server takes "
             f"{usable} (max_connections less those reserved), {others} of them held by "
             "others now")
    fix = ("lower LEASEQ_POOL_SIZE, raise max_connections, or put PgBouncer in front "
           "(docs/deploy.md)")
    if need > usable - others:
        return Finding("connections", "fail", found, fix)
    if need > 0.8 * (usable - others):
        return Finding("connections", "warn", found + ": little room left", fix)
    return Finding("connections", "ok", found)




async def check_autovacuum(conn: Session) -> Finding:
    row = await conn.fetchrow(Q.autovacuum)
    assert row is not None
    if not row["track_counts"]:
        return Finding(
            "autovacuum", "fail",
            "track_counts is off: nothing counts the queue table's dead rows, so neither "
            "autovacuum nor leaseq's own vacuum check knows when to reclaim them",
            "set track_counts = on in postgresql.conf",
        )
    if not row["server_on"] or not row["table_on"]:
        where = "on the server" if not row["server_on"] else \
            "for the messages table (autovacuum_enabled)"
        return Finding(
            "autovacuum", "warn",
            f"autovacuum is off {where}: leaseq vacuums the queue table itself "
            "(app/queue/vacuum.py), later than autovacuum would",
            f"set autovacuum = on (postgresql.conf); ALTER TABLE {row['live_table']} RESET "
            "(autovacuum_enabled)",
        )
    return Finding("autovacuum", "ok", "on, for the messages table too")


async def check_horizon(settings: Settings, conn: Session) -> Finding:
    row = await conn.fetchrow(Q.horizon_holder)
    assert row is not None
    # One reading: the xid clock has nothing before it, so a holder without a
    # time of its own (a slot, a standby's feedback, a session leaseq's role may
    # not read the times of) is counted in transactions only.
    reading = reading_of(row, XidClock())
    holder, limit = reading.holder, settings.horizon_warn_seconds
    if holder is None:
        return Finding("horizon", "ok", "no snapshot, transaction, replication slot or "
                       "prepared transaction holds PostgreSQL's cleanup horizon back")
    harm = ("no VACUUM removes a row version deleted since, and every claim steps over "
            "them")
    fix = f"end it: {holder.how_to_end()} (docs/operating.md, \"LeaseqDatabaseHorizonHeld\")"
    if not reading.timed:
        found = (f"held back {reading.transactions} transactions by {holder.describe()}; "
                 "one reading cannot tell since when (the service's "
                 "leaseq_database_horizon_age_seconds times it)")
        if holder.kind == "slot" and holder.pid is None:
            return Finding("horizon", "warn",
                           f"{found}: an unused slot holds it until dropped, and {harm}", fix)
        return Finding("horizon", "ok", found)
    if reading.seconds >= limit:
        return Finding(
            "horizon", "warn",
            f"held back for {reading.seconds:.0f} s ({reading.transactions} transactions), "
            f"past LEASEQ_HORIZON_WARN_SECONDS ({limit:g}), by {holder.describe()}: {harm}",
            fix,
        )
    return Finding("horizon", "ok", f"the oldest holder has held it {reading.seconds:.1f} s "
                   f"at most, below LEASEQ_HORIZON_WARN_SECONDS ({limit:g})")




async def check_durability(conn: Session) -> Finding:
    row = await conn.fetchrow(Q.durability)
    assert row is not None
    off = [name for name in ("fsync", "full_page_writes") if row[name] != "on"]
    if row["synchronous_commit"] == "off":
        off.insert(0, "synchronous_commit")
    if off:
        return Finding(
            "durability", "fail",
            f"{', '.join(off)} off: a message acknowledged to its sender can be lost "
            "in a crash of the database server",
            f"set {', '.join(f'{name} = on' for name in off)} (postgresql.conf, or "
            "ALTER DATABASE ... RESET for a database's own setting)",
        )
    return Finding("durability", "ok",
                   f"synchronous_commit {row['synchronous_commit']}, fsync on, "
                   "full_page_writes on")




async def check_clock(conn: Session) -> Finding:
    before = time.time()
    database = await conn.fetchval(Q.database_clock)
    after = time.time()
    skew = database - (before + after) / 2
    found = (f"this host's clock is {abs(skew):.2f} s "
             f"{'behind' if skew > 0 else 'ahead of'} the database's")
    fix = ("synchronise both with NTP (leases are timed on the database's clock; this "
           "host's shows in logs and in the times its clients compare)")
    if abs(skew) > CLOCK_FAIL_SECONDS:
        return Finding("clock", "fail", found, fix)
    if abs(skew) > CLOCK_WARN_SECONDS:
        return Finding("clock", "warn", found, fix)
    return Finding("clock", "ok", found)


async def check_pgbouncer(settings: Settings, url: str, conn: Session) -> Finding:
    server_port = await conn.fetchval(Q.server_port)
    parsed = parse_url(url)
    if server_port is None or isinstance(parsed.query.get("host"), tuple):
        return Finding("pgbouncer", "ok", "not checked: a Unix socket, or several hosts")
    query_port = parsed.query.get("port")
    given = parsed.port or (int(query_port) if isinstance(query_port, str) else 5432)
    direct = given == server_port
    if settings.pgbouncer != "off" and direct:
        return Finding(
            "pgbouncer", "fail",
            f"LEASEQ_PGBOUNCER={settings.pgbouncer}, but DATABASE_URL's port {given} is "
            "PostgreSQL's own: the service connects to PostgreSQL directly",
            "unset LEASEQ_PGBOUNCER, or point DATABASE_URL at PgBouncer",
        )
    if settings.pgbouncer == "off" and not direct:
        return Finding(
            "pgbouncer", "warn",
            f"DATABASE_URL's port {given} is not PostgreSQL's ({server_port}): a pooler "
            "or a port mapping is between",
            "if it is PgBouncer, set LEASEQ_PGBOUNCER to its pool mode (docs/deploy.md)",
        )
    return Finding("pgbouncer", "ok",
                   "LEASEQ_PGBOUNCER=off, and DATABASE_URL reaches PostgreSQL directly"
                   if settings.pgbouncer == "off" else
                   f"LEASEQ_PGBOUNCER={settings.pgbouncer}, through a pooler on port {given}")


async def check_receipt_keys(conn: Session) -> Finding:
    row = await conn.fetchrow(Q.receipt_keys_age)
    assert row is not None
    if row["keys"] == 0:
        return Finding("receipt keys", "ok", "none yet: the first is made when leaseq starts")
    days = row["newest_days"]
    found = (f"{row['keys']} in use; the newest, which signs, is {days:.0f} days old")
    if days > RECEIPT_KEY_DAYS:
        return Finding("receipt keys", "warn", found,
                       "leaseq keys rotate-receipts, then retire the old key once its "
                       "handles have lapsed (docs/security.md)")
    return Finding("receipt keys", "ok", found)




async def check_sql_api_owner(conn: Session) -> Finding:
    functions = await conn.fetchval(Q.superuser_definers)
    if not functions:
        return await _check_owner_members(conn)
    return Finding(
        "sql api owner", "fail",
        f"run as a superuser, being owned by one: {', '.join(functions)}; every call of "
        "the SQL API, by any role, runs as that superuser",
        "give each to a role that is no superuser: ALTER FUNCTION <function> OWNER TO the "
        "database's SQL API role (SELECT 'leaseq_sql_api_' || left(md5(current_database()), "
        "12); migration 0018 makes it when a superuser or a CREATEROLE role migrates), or to "
        "the schema's owner if that is no superuser (docs/security.md, \"The SQL API\")",
    )


async def _check_owner_members(conn: Session) -> Finding:
    # A member of the functions' owner may SET ROLE to it and read every message
    # and receipt key, whatever leaseq.grants says.
    members = await conn.fetchval(Q.definer_owner_members)
    if not members:
        return Finding("sql api owner", "ok",
                       "the SQL API's SECURITY DEFINER functions run as no superuser, "
                       "and no other role may act as their owner")
    return Finding(
        "sql api owner", "fail",
        f"other roles may act as the owner of the SQL API's functions: "
        f"{', '.join(members)}; each may SET ROLE to it and read every queue's messages "
        "and receipt keys past leaseq.grants",
        "REVOKE <owner> FROM <member> for each (the owner role needs no member: "
        "leaseq.add_grant lets a role call the functions; docs/security.md, \"The SQL API\")",
    )


async def examine(settings: Settings, url: str, deployment: Deployment,
                  head: str) -> list[Finding]:
    """Every check, on one connection to `url`."""
    from app.db.connector import Connector
    from app.db.engine import engine_for

    engine = engine_for(settings, pool_size=1, url=url)
    db = Connector(engine)
    try:
        try:
            await db.ping()
        except Exception as exc:  # whatever stops the connection is the finding
            cause = exc.__cause__ or exc
            return [Finding(
                "database", "fail", f"cannot connect: {type(cause).__name__}: {cause}",
                "check DATABASE_URL (host, port, user, password, database) and that the "
                "server runs and accepts this host")]
        async with db.session() as conn:
            return await _examine(conn, settings, url, deployment, head)
    finally:
        await engine.dispose()


async def _examine(conn: Session, settings: Settings, url: str, deployment: Deployment,
                   head: str) -> list[Finding]:
    version = await conn.fetchval(Q.server_version)
    findings = [Finding("database", "ok", f"reachable: PostgreSQL {version}"),
                await check_migration(conn, head)]
    if findings[-1].status == "fail":
        return findings  # the checks below read leaseq's tables
    findings.append(check_secret(settings, deployment))
    checks: list[tuple[str, Callable[[], Awaitable[Finding]]]] = [
        ("keys", lambda: check_keys(settings, conn)),
        ("connections", lambda: check_connections(settings, deployment, conn)),
        ("autovacuum", lambda: check_autovacuum(conn)),
        ("horizon", lambda: check_horizon(settings, conn)),
        ("durability", lambda: check_durability(conn)),
        ("clock", lambda: check_clock(conn)),
        ("pgbouncer", lambda: check_pgbouncer(settings, url, conn)),
        ("receipt keys", lambda: check_receipt_keys(conn)),
        ("sql api owner", lambda: check_sql_api_owner(conn)),
    ]
    for name, check in checks:
        try:
            findings.append(await check())
        except (DatabaseError, DatabaseUnavailable) as exc:  # e.g. a view it may not read
            findings.append(Finding(name, "fail", f"could not check: {exc}",
                                    "run the doctor as the role leaseq connects as"))
    return findings


def render(findings: list[Finding], *, as_json: bool, where: str) -> str:
    if as_json:
        return json.dumps({"database": where, "findings": [asdict(f) for f in findings],
                           "ok": all(f.status != "fail" for f in findings)}, indent=2)
    width = max(len(f.check) for f in findings)
    lines = [f"leaseq doctor: {where}"]
    for finding in findings:
        mark = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}[finding.status]
        lines.append(f"  {mark}  {finding.check:<{width}}  {finding.found}")
        if finding.fix is not None and finding.status != "ok":
            lines.append(f"        {'':<{width}}  fix: {finding.fix}")
    failed = sum(f.status == "fail" for f in findings)
    warned = sum(f.status == "warn" for f in findings)
    lines.append(f"{failed} problem(s), {warned} warning(s)" if failed or warned
                 else "all checks passed")
    return "\n".join(lines)


def shown_url(url: str) -> str:
    """The database's URL without its password."""
    return parse_url(url).render_as_string(hide_password=True)


def exit_status(findings: list[Finding]) -> int:
    return 1 if any(f.status == "fail" for f in findings) else 0


def report(findings: list[Finding], *, as_json: bool, where: str, out: Any) -> int:
    print(render(findings, as_json=as_json, where=where), file=out)
    return exit_status(findings)
