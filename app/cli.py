"""The `leaseq` command: serve, migrate, worker.

Server modules are imported inside the commands that need them: `leaseq worker`
loads only `app.worker` (and httpx), never FastAPI, SQLAlchemy or asyncpg.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from app import __version__

if TYPE_CHECKING:
    from app.config import Settings
    from app.db.embedded import EmbeddedPostgres
    from app.worker import Backoff


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
    _worker_parser(commands)
    _keys_parser(commands)
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
        "--scope", action="append", required=True, metavar="ACTION:PATTERN",
        help="send, receive, read or admin, on queues matching PATTERN (* matches any "
        "characters): send:orders-*. Repeat for more; admin:* manages keys too",
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


def _worker_parser(commands: Any) -> None:
    worker = commands.add_parser(
        "worker",
        help="run a handler for the messages of a queue (see docs/workers.md)",
        description="Receive messages from a leaseq service and run HANDLER (module:function, "
        "a sync or async function taking (message, ctx)) for each, with heartbeats and a "
        "watchdog that cancels the handler when its lease is lost. SIGTERM or SIGINT stops "
        "receiving and lets in-flight handlers finish within the grace period.",
    )
    worker.add_argument("handler", metavar="module:function", help="the handler to run")
    worker.add_argument("--queue", required=True, help="queue to receive from")
    worker.add_argument("--concurrency", type=int, default=1, help="handlers at once (1)")
    worker.add_argument(
        "--url", help="the service (LEASEQ_URL, default http://127.0.0.1:8000)"
    )
    worker.add_argument(
        "--api-key", help="<key id>.<secret> when the service requires keys (LEASEQ_API_KEY)"
    )
    worker.add_argument(
        "--lease", type=int, help="seconds per lease and per extension (the queue's timeout)"
    )
    worker.add_argument(
        "--heartbeat-period", type=float, help="seconds between heartbeats (lease / 3)"
    )
    worker.add_argument(
        "--heartbeat", choices=["auto", "task", "thread"], default="auto",
        help="where heartbeats run: an asyncio task, or a thread of their own "
        "(auto: task for async handlers, thread for sync ones)",
    )
    worker.add_argument("--wait", type=int, default=20, help="long-poll seconds, 0-20 (20)")
    worker.add_argument(
        "--grace", type=float, default=30.0, help="seconds in-flight handlers get at shutdown"
    )
    retries = worker.add_argument_group(
        "retries",
        "Without these options a failed message is released with no delay of the "
        "worker's: the queue's retry ladder (its retry_backoff attribute) decides, and "
        "on a queue without one the message is retried at once. --retry-delay gives the "
        "worker a backoff of its own, whose delay overrides the queue's ladder.",
    )
    retries.add_argument(
        "--retry-delay", type=float,
        help="seconds before a failed message is retried, first time (0: at once)",
    )
    retries.add_argument(
        "--retry-multiplier", type=float,
        help="growth of the retry delay per attempt (2; needs --retry-delay)",
    )
    retries.add_argument(
        "--retry-max", type=float, help="longest retry delay (900; needs --retry-delay)"
    )
    retries.add_argument(
        "--retry-jitter", type=float,
        help="spread of the retry delay, a fraction (0.2; needs --retry-delay)",
    )
    worker.add_argument(
        "--app-dir", default=".", help="directory put first on sys.path to import from (.)"
    )
    worker.add_argument(
        "--log-level", default=os.environ.get("LEASEQ_LOG_LEVEL", "info"), help="log level"
    )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "migrate":
        return _migrate()
    if args.command == "worker":
        return _worker(args)
    if args.command == "keys":
        return _keys(args)
    if args.command is None:  # bare `leaseq` serves, like `leaseq serve`
        args = _parser().parse_args(["serve", *(argv if argv is not None else sys.argv[1:])])
    from app.errors import EmbeddedPostgresError

    try:
        return _serve(args)
    except EmbeddedPostgresError as exc:
        # An operator's problem (data directory in use, server will not start):
        # one clear line, not a traceback.
        print(f"leaseq serve: {exc}", file=sys.stderr)
        return 1


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
    upgrade(settings.database_url)
    return 0


def _serve(args: argparse.Namespace) -> int:
    from app.config import Settings
    from app.db.embedded import EmbeddedPostgres
    from app.db.migrate import upgrade

    settings = _settings(host=args.host, port=args.port, data_dir=args.data_dir)
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
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
        upgrade(settings.database_url)
        refusal = _unsafe_to_serve(settings, insecure=args.insecure, embedded=embedded)
        if refusal:
            print(f"leaseq serve: {refusal}", file=sys.stderr)
            return 2
        # Make sure the master secret exists before worker processes race for it.
        if settings.secret is None:
            log.warning("LEASEQ_SECRET is unset: using the secret kept in %s",
                        settings.data_dir)
        settings.receipt_secret()
        _run_uvicorn(settings, workers=args.workers)
    except KeyboardInterrupt:
        pass
    finally:
        if embedded is not None:
            log.info("stopping embedded PostgreSQL")
            embedded.stop()
    return 0


def _unsafe_to_serve(
    settings: Settings, *, insecure: bool, embedded: EmbeddedPostgres | None
) -> str | None:
    """Why serving as configured would be unsafe (Redis's protected mode), or None."""
    import asyncio

    if settings.is_loopback() or insecure:
        return None
    assert settings.database_url is not None
    if settings.secret is None and not (settings.data_dir / "receipt-secret").exists():
        if embedded is None:
            return (
                f"refusing to listen on {settings.host} without LEASEQ_SECRET: each replica "
                "would invent its own, and SQS clients' keys would work on one of them only. "
                "Set LEASEQ_SECRET (at least 16 characters) on every replica."
            )
    if (
        settings.sqs_credentials is None
        and settings.bootstrap_admin_key() is None
        and not asyncio.run(_any_key_stored(settings.database_url))
    ):
        return (
            f"refusing to listen on {settings.host} with no API key: anyone who reaches the "
            "port could read, send and delete every message.\n"
            "  Create a key:  leaseq keys create --name admin --scope 'admin:*'\n"
            "  or give one:   LEASEQ_ADMIN_KEY=<key id>.<secret> (or LEASEQ_ADMIN_KEY_FILE)\n"
            "  or serve open: leaseq serve --insecure (only on a network you trust)"
        )
    return None


async def _any_key_stored(database_url: str) -> bool:
    import asyncpg

    from app.db.engine import plain_url

    conn = await asyncpg.connect(plain_url(database_url))
    try:
        found: bool = await conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM api_keys WHERE revoked_at IS NULL"
            " AND (expires_at IS NULL OR expires_at > now()))"
        )
        return found
    finally:
        await conn.close()


def _keys(args: argparse.Namespace) -> int:
    import asyncio

    from app.auth import admin
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
        return asyncio.run(admin.run(
            args.keys_command, args, database_url=url, master=settings.receipt_secret(),
            out=sys.stdout,
        ))
    except (ValueError, LeaseqError) as exc:
        print(f"leaseq keys: {exc}", file=sys.stderr)
        return 2
    finally:
        if embedded is not None:
            embedded.stop()


def _run_uvicorn(settings: Settings, *, workers: int) -> None:
    import uvicorn

    from app.main import create_app

    # uvicorn counts open connections (idle keep-alive ones too) and requests
    # against this, per process, and past it answers a plain-text 503. Above the
    # waiter cap, a long poll too many meets leaseq's own 503 overloaded (with
    # Retry-After) first; the rest is room for short requests and idle connections.
    limit_concurrency = settings.limit_concurrency or settings.max_waiters + 1000
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
        # Long polls are woken at shutdown; this bounds anything else.
        "timeout_graceful_shutdown": 5,
        "limit_concurrency": limit_concurrency,
        "timeout_keep_alive": settings.keep_alive_seconds,
    }
    if workers > 1:
        uvicorn.run("app.main:create_app", factory=True, workers=workers, **common)  # type: ignore[arg-type]
        return
    app = create_app(settings)

    class _Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            # Wake every parked long poll so shutdown does not wait for them.
            state = app.state
            loop = getattr(state, "loop", None)
            hub = getattr(state, "hub", None)
            if loop is not None and hub is not None:
                loop.call_soon_threadsafe(hub.close)
            super().handle_exit(sig, frame)

    _Server(uvicorn.Config(app, **common)).run()  # type: ignore[arg-type]


def load_handler(spec: str, app_dir: str = ".") -> Callable[..., Any]:
    """`module:function` (the function may be a dotted attribute path), imported
    with `app_dir` first on sys.path."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"{spec!r} is not module:function")
    path = str(Path(app_dir).resolve())
    if path not in sys.path:
        sys.path.insert(0, path)
    target: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"{spec} is not callable")
    handler: Callable[..., Any] = target
    return handler


def worker_backoff(args: argparse.Namespace) -> Backoff | None:
    """The worker's own backoff from the --retry-* options; None (the queue's retry
    ladder decides) without --retry-delay. ValueError for options that do not fit."""
    from app.worker import Backoff

    if args.retry_delay is None:
        given = [
            f"--retry-{name}" for name in ("multiplier", "max", "jitter")
            if getattr(args, f"retry_{name}") is not None
        ]
        if given:
            verb = "needs" if len(given) == 1 else "need"
            raise ValueError(f"{', '.join(given)} {verb} --retry-delay")
        return None
    options: dict[str, float] = {"initial": args.retry_delay}
    for name, field in (("multiplier", "multiplier"), ("max", "maximum"), ("jitter", "jitter")):
        value = getattr(args, f"retry_{name}")
        if value is not None:
            options[field] = value
    return Backoff(**options)


def _worker(args: argparse.Namespace) -> int:
    from app.worker import ClientError, Worker

    logging.basicConfig(
        level=str(args.log_level).upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        handler = load_handler(args.handler, args.app_dir)
    except (ImportError, AttributeError, ValueError) as exc:
        print(f"leaseq worker: cannot load {args.handler}: {exc}", file=sys.stderr)
        return 2
    try:
        worker = Worker(
            handler,
            queue=args.queue,
            url=args.url,
            concurrency=args.concurrency,
            lease=args.lease,
            heartbeat_period=args.heartbeat_period,
            heartbeat=args.heartbeat,
            wait=args.wait,
            grace=args.grace,
            backoff=worker_backoff(args),
            api_key=args.api_key,
        )
    except ValueError as exc:
        print(f"leaseq worker: {exc}", file=sys.stderr)
        return 2
    try:
        worker.run()
    except ClientError as exc:
        print(f"leaseq worker: {exc}", file=sys.stderr)
        return 1
    return 0
