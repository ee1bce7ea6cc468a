"""The server's commands: serve, migrate, keys, grants. The `leaseq` command is the
client package's (leaseq.cli); it hands these to `main` here through the
`leaseq.commands` entry point, and `leaseq worker` stays the client's.

Server modules are imported inside the commands that need them.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app import __version__

if TYPE_CHECKING:
    from app.config import Settings
    from app.db.embedded import EmbeddedPostgres


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="leaseq", description="A durable lease-based message queue on PostgreSQL."
    )
    parser.add_argument("--version", action="version", version=f"leaseq {__version__}")
    commands = parser.add_subparsers(dest="command")

    serve = commands.add_parser(
        "serve",
        help="run the HTTP service (the default command)",
        description="Run the service. Without DATABASE_URL, an embedded PostgreSQL is "
        "started in the data directory and stopped on exit.",
    )
    serve.add_argument("--host", help="address to listen on (LEASEQ_HOST, default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to listen on (LEASEQ_PORT, default 8000)")
    serve.add_argument("--data-dir", type=Path, help="data directory (LEASEQ_DATA_DIR)")
    serve.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    serve.add_argument(
        "--insecure", action="store_true",
        help="listen on a non-loopback address with no API key (anyone who reaches the "
        "port may do anything), and let a missing LEASEQ_SECRET be generated",
    )

    commands.add_parser("migrate", help="apply the database migrations to DATABASE_URL")
    # `leaseq worker` is the client package's (leaseq.cli); listed here for --help.
    commands.add_parser(
        "worker", add_help=False,
        help="run a handler for the messages of a queue (leaseq worker --help)",
    )
    # `leaseq queues` and `leaseq top` are the client package's too.
    commands.add_parser(
        "queues", add_help=False,
        help="list, show, create, change, purge, peek at and redrive queues "
        "(leaseq queues --help)",
    )
    commands.add_parser(
        "top", add_help=False, help="every queue's depth and rates, refreshed in place",
    )
    _keys_parser(commands)
    _grants_parser(commands)
    doctor = commands.add_parser(
        "doctor",
        help="check a deployment's settings and database, with a fix for each problem",
        description="Check the settings (this shell's environment, as `leaseq serve` would "
        "read it) and the database: reachable and migrated, LEASEQ_SECRET, API keys on a "
        "public address, connections against max_connections, autovacuum, durable "
        "commits, clock skew, PgBouncer, the receipt keys' age. Reads only. Exit status 1 "
        "when a check fails. Works on DATABASE_URL, else on the running embedded "
        "PostgreSQL of the data directory.",
    )
    doctor.add_argument("--data-dir", type=Path, help="data directory (LEASEQ_DATA_DIR)")
    doctor.add_argument("--replicas", type=_positive, default=1,
                        help="service hosts on this database (1), for the connection count")
    doctor.add_argument("--workers", type=_positive, default=1,
                        help="`leaseq serve --workers` of each (1)")
    doctor.add_argument("--json", action="store_true", help="findings as JSON")
    return parser


def _keys_parser(commands: Any) -> None:
    keys = commands.add_parser(
        "keys",
        help="manage API keys and receipt keys (see docs/security.md)",
        description="API keys for both doors (REST bearer tokens and SQS SigV4 access keys), "
        "and the keys that sign receipt handles. Works on DATABASE_URL, else on the embedded "
        "PostgreSQL of the data directory (running or not).",
    )
    keys.add_argument("--data-dir", type=Path, help="data directory (LEASEQ_DATA_DIR)")
    actions = keys.add_subparsers(dest="keys_command", required=True)
    create = actions.add_parser("create", help="create a key and print its secret, once")
    create.add_argument("--name", required=True, help="what the key is for")
    create.add_argument(
        "--scope", action="extend", nargs="+", required=True, metavar="ACTION:PATTERN",
        help="send, receive, read or admin, on queues matching PATTERN (* matches any "
        "characters): send:orders-*. Several after one --scope, or --scope again; "
        "admin:* manages keys too",
    )
    create.add_argument("--expires", help="lifetime: 90d, 12h, 30m or seconds (never)")
    create.add_argument("--rate", type=float, help="requests a second, per service process")
    actions.add_parser("list", help="list keys (never their secrets)")
    revoke = actions.add_parser("revoke", help="revoke a key: refused everywhere within 1 s")
    revoke.add_argument("key_id")
    actions.add_parser(
        "rotate-receipts", help="add a receipt key; it signs new handles in 10 s"
    )
    retire = actions.add_parser(
        "retire-receipts", help="retire a receipt key: handles it signed stop working"
    )
    retire.add_argument("key_id", type=int)
    actions.add_parser("list-receipts", help="list the receipt keys")


def _grants_parser(commands: Any) -> None:
    grants = commands.add_parser(
        "grants",
        help="let PostgreSQL roles send and settle through the SQL API (docs/transactions.md)",
        description="Which PostgreSQL roles may call leaseq.send, leaseq.delete and "
        "leaseq.change_visibility on which queues, in the scope words of API keys. Works on "
        "DATABASE_URL, else on the embedded PostgreSQL of the data directory.",
    )
    grants.add_argument("--data-dir", type=Path, help="data directory (LEASEQ_DATA_DIR)")
    actions = grants.add_subparsers(dest="grants_command", required=True)
    scope_help = ("send (leaseq.send, leaseq.send_batch), receive (leaseq.delete, "
                  "leaseq.change_visibility) or admin (both), on queues matching PATTERN "
                  "(* matches any characters): send:orders-*")
    add = actions.add_parser("add", help="allow ROLE what each scope names")
    add.add_argument("role", metavar="ROLE")
    add.add_argument("scope", nargs="+", metavar="ACTION:PATTERN", help=scope_help)
    remove = actions.add_parser("remove", help="take grants back from ROLE")
    remove.add_argument("role", metavar="ROLE")
    remove.add_argument("scope", nargs="+", metavar="ACTION:PATTERN", help=scope_help)
    actions.add_parser("list", help="list the grants")


def main(argv: list[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:1] in (["worker"], ["queues"], ["top"]):
        from leaseq.cli import main as client_main

        return client_main(given)
    args = _parser().parse_args(given)
    if args.command == "migrate":
        return _migrate()
    if args.command == "keys":
        return _keys(args)
    if args.command == "grants":
        return _grants(args)
    if args.command == "doctor":
        return _doctor(args)
    if args.command is None:  # bare `leaseq` serves, like `leaseq serve`
        args = _parser().parse_args(["serve", *given])
    from pydantic import ValidationError

    from app.errors import EmbeddedPostgresError

    try:
        return _serve(args)
    except ValidationError as exc:
        print(f"leaseq serve: the configuration is not valid:\n{_settings_errors(exc)}",
              file=sys.stderr)
        return 2
    except EmbeddedPostgresError as exc:
        # An operator's problem (data directory in use, server will not start):
        # one clear line, not a traceback.
        print(f"leaseq serve: {exc}", file=sys.stderr)
        return 1


def _settings_errors(exc: Any) -> str:
    """A pydantic ValidationError of the settings as lines an operator reads:
    the variable and what is wrong, never the value (it may be a secret)."""
    lines = []
    for error in exc.errors():
        name = "_".join(str(part) for part in error["loc"]).upper() or "settings"
        variable = name if name == "DATABASE_URL" else f"LEASEQ_{name}"
        message = str(error["msg"]).removeprefix("Value error, ")
        lines.append(f"  {variable}: {message}")
    return "\n".join(lines)


def _settings(**overrides: object) -> Settings:
    from app.config import Settings

    # Overrides go into the environment too: uvicorn worker processes and
    # Alembic read their settings from there.
    for key, value in overrides.items():
        if value is not None:
            os.environ[f"LEASEQ_{key.upper()}"] = str(value)
    return Settings()


def _migrate() -> int:
    from app.config import Settings
    from app.db.migrate import upgrade

    settings = Settings()
    if settings.database_url is None:
        print("leaseq migrate: set DATABASE_URL to the database to migrate", file=sys.stderr)
        return 2
    upgrade(settings.listen_url or settings.database_url)
    return 0


def _serve(args: argparse.Namespace) -> int:
    from app.config import Settings
    from app.db.embedded import EmbeddedPostgres
    from app.db.migrate import upgrade
    from app.logs import configure

    settings = _settings(host=args.host, port=args.port, data_dir=args.data_dir)
    configure(settings)
    log = logging.getLogger("leaseq")
    # SIGTERM is a requested stop, handled like Ctrl-C: it unwinds through
    # `finally` (stopping an embedded server started here) and exits 0. It must
    # not raise SystemExit(143): uvicorn re-raises the signal it captured after
    # its graceful shutdown, so that would turn every clean stop into exit 143.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    embedded: EmbeddedPostgres | None = None
    try:
        if settings.database_url is None:
            embedded = EmbeddedPostgres(settings.data_dir)
            log.info("starting embedded PostgreSQL in %s", embedded.pgdata)
            os.environ["DATABASE_URL"] = embedded.start()
            settings = Settings()
        assert settings.database_url is not None
        # Alembic holds a session-level advisory lock while it migrates: on the
        # direct connection, which a PgBouncer in transaction mode is not.
        upgrade(settings.listen_url or settings.database_url)
        refusal = _unsafe_to_serve(settings, insecure=args.insecure, embedded=embedded)
        if refusal:
            print(f"leaseq serve: {refusal}", file=sys.stderr)
            return 2
        # Make sure the master secret exists before worker processes race for it.
        if settings.secret is None:
            log.warning("LEASEQ_SECRET is unset: using the secret kept in %s",
                        settings.data_dir)
        settings.master_secret()
        if args.workers > 1:
            with _shared_metrics():
                _run_uvicorn(settings, workers=args.workers)
        else:
            _run_uvicorn(settings, workers=1)
    except KeyboardInterrupt:
        pass
    finally:
        if embedded is not None:
            log.info("stopping embedded PostgreSQL")
            embedded.stop()
    return 0


@contextlib.contextmanager
def _shared_metrics() -> Iterator[None]:
    """prometheus_client's multiprocess mode for worker processes: each writes
    its metrics to files in a fresh folder, and a scrape of any one reads them
    all (one process's own counters would look like resets to Prometheus)."""
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="leaseq-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = folder
    try:
        yield
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _unsafe_to_serve(
    settings: Settings, *, insecure: bool, embedded: EmbeddedPostgres | None
) -> str | None:
    """Why serving as configured would be unsafe (Redis's protected mode), or None."""
    import asyncio

    if settings.is_loopback() or insecure:
        return None
    assert settings.database_url is not None
    # A secret file in the data directory belongs to this host alone: replicas on
    # one database each read their own, so keys sealed on one fail on the others.
    # With a database of its own (embedded) the file is right; with DATABASE_URL
    # only LEASEQ_SECRET is, whatever an earlier run left behind.
    if settings.secret is None and embedded is None:
        kept = settings.data_dir / "receipt-secret"
        carry = (
            f"\n  To keep the secret an earlier run stored in {kept}, set "
            f"LEASEQ_SECRET=\"$(cat {kept})\" on every replica."
            if kept.exists() else ""
        )
        return (
            f"refusing to listen on {settings.host} with DATABASE_URL and no LEASEQ_SECRET: "
            "each replica would use a secret of its own, and SQS clients' keys would work "
            "on one of them only. Set LEASEQ_SECRET on every replica "
            "(make one: openssl rand -hex 32)." + carry
        )
    if settings.sqs_credentials is None and not asyncio.run(_usable_key(settings)):
        return (
            f"refusing to listen on {settings.host} with no usable API key: anyone who "
            "reaches the port could read, send and delete every message.\n"
            "  Create a key:  leaseq keys create --name admin --scope 'admin:*'\n"
            "  or give one:   LEASEQ_ADMIN_KEY=<key id>.<secret> (or LEASEQ_ADMIN_KEY_FILE;\n"
            "                 a bootstrap key that was revoked stays revoked)\n"
            "  or serve open: leaseq serve --insecure (only on a network you trust)"
        )
    return None


async def _usable_key(settings: Settings) -> bool:
    """Whether a key works now, after the bootstrap key (if any) is created: a
    variable being set is not a key, and a revoked or expired one opens nothing."""
    from app.auth.sql import Q
    from app.auth.store import KeyStore
    from app.db.connector import Connector
    from app.db.engine import engine_for
    from app.main import bootstrap_admin_key

    engine = engine_for(settings, pool_size=1)
    try:
        db = Connector(engine)
        keys = KeyStore(db, master=settings.master_secret(), listening=lambda: False)
        await bootstrap_admin_key(keys, settings)
        (row,) = await db.fetch(Q.any_api_key)
        return row["any"]
    finally:
        await engine.dispose()


def _keys(args: argparse.Namespace) -> int:
    import asyncio

    from app.auth import admin

    return _on_database("keys", args, lambda settings, url: asyncio.run(admin.run(
        args.keys_command, args, settings=settings, database_url=url, out=sys.stdout,
    )))


def _grants(args: argparse.Namespace) -> int:
    import asyncio

    from app.auth import grants

    return _on_database("grants", args, lambda settings, url: asyncio.run(grants.run(
        args.grants_command, args, settings=settings, database_url=url, out=sys.stdout,
    )))


def _on_database(
    command: str, args: argparse.Namespace, work: Callable[[Settings, str], int]
) -> int:
    """Runs `work` on DATABASE_URL, else on the data directory's embedded
    PostgreSQL (borrowed from a `leaseq serve` running it, else started for it),
    migrated first."""
    from app.db.embedded import EmbeddedPostgres
    from app.db.migrate import upgrade
    from app.errors import LeaseqError

    settings = _settings(data_dir=args.data_dir)
    embedded: EmbeddedPostgres | None = None
    url = settings.database_url
    try:
        if url is None:
            server = EmbeddedPostgres(settings.data_dir)
            url = server.running_dsn()  # a `leaseq serve` owns it: borrow its server
            if url is None:
                embedded = server
                url = embedded.start()
        upgrade(url)
        return work(settings, url)
    except (ValueError, LeaseqError) as exc:
        print(f"leaseq {command}: {exc}", file=sys.stderr)
        return 2
    finally:
        if embedded is not None:
            embedded.stop()


def _run_uvicorn(settings: Settings, *, workers: int) -> None:
    import uvicorn

    from app.asgi.header_limits import HeaderLimitedProtocol
    from app.logs import logging_config
    from app.main import create_app

    # uvicorn counts open connections (idle keep-alive ones too) and requests
    # against this, per process, and past it answers a plain-text 503. Above the
    # waiter cap, a long poll too many meets leaseq's own 503 overloaded (with
    # Retry-After) first; the rest is room for short requests and idle connections.
    limit_concurrency = settings.connection_limit()
    if limit_concurrency <= settings.max_waiters:
        logging.getLogger("leaseq").warning(
            "LEASEQ_LIMIT_CONCURRENCY (%d) is not above LEASEQ_MAX_WAITERS (%d): "
            "long polls will be refused by uvicorn's plain 503 rather than leaseq's",
            limit_concurrency, settings.max_waiters,
        )
    common: dict[str, object] = {
        "host": settings.host,
        "port": settings.port,
        "log_level": settings.log_level.lower(),
        "log_config": logging_config(settings),
        # leaseq.access writes the access line (route templates, request ids).
        "access_log": False,
        # Parked long polls answer the moment a stop signal arrives (app/stopping.py);
        # other requests have this long to finish.
        "timeout_graceful_shutdown": settings.shutdown_grace_seconds,
        "limit_concurrency": limit_concurrency,
        "timeout_keep_alive": settings.keep_alive_seconds,
        # No `server: uvicorn` on every answer: it tells a scanner what runs here,
        # and costs each response a header the server checks and writes.
        "server_header": False,
        # uvicorn's httptools protocol, each answer written to its socket once,
        # with deadlines and caps on what unfinished headers may hold.
        "http": HeaderLimitedProtocol,
        # X-Forwarded-Proto from the documented TLS proxy makes the request https
        # (docs/security.md); from anyone else it is ignored.
        "proxy_headers": True,
        "forwarded_allow_ips": settings.forwarded_allow_ips,
    }
    if workers > 1:
        uvicorn.run("app.main:create_app", factory=True, workers=workers, **common)  # type: ignore[arg-type]
        return
    uvicorn.Server(uvicorn.Config(create_app(settings), **common)).run()  # type: ignore[arg-type]


def _doctor(args: argparse.Namespace) -> int:
    import asyncio

    from alembic.script import ScriptDirectory
    from pydantic import ValidationError

    from app.db.embedded import EmbeddedPostgres
    from app.db.migrate import alembic_config
    from app.doctor import checks as doctor

    try:
        settings = _settings(data_dir=args.data_dir)
    except ValidationError as exc:
        errors = [line.strip() for line in _settings_errors(exc).splitlines()]
        return doctor.report(doctor.settings_findings(errors), as_json=args.json,
                             where="the settings did not load", out=sys.stdout)
    deployment = doctor.Deployment(replicas=args.replicas, workers=args.workers,
                                   embedded=settings.database_url is None)
    url = settings.database_url
    if url is None:
        # Reads only: the data directory's server is checked when a `leaseq serve`
        # runs it, never started (or created) by the doctor.
        url = EmbeddedPostgres(settings.data_dir).running_dsn()
        if url is None:
            missing = doctor.Finding(
                "database", "fail",
                f"DATABASE_URL is unset and no embedded PostgreSQL runs in {settings.data_dir}",
                "start leaseq serve (with --data-dir), or set DATABASE_URL")
            return doctor.report([missing], as_json=args.json, where=str(settings.data_dir),
                                 out=sys.stdout)
    head = ScriptDirectory.from_config(alembic_config(url)).get_current_head()
    assert head is not None
    findings = asyncio.run(doctor.examine(settings, url, deployment, head))
    return doctor.report(findings, as_json=args.json, where=doctor.shown_url(url),
                         out=sys.stdout)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value
