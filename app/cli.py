"""The `leaseq` command: serve, migrate."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path
from types import FrameType

from app import __version__
from app.config import Settings
from app.errors import EmbeddedPostgresError


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

    commands.add_parser("migrate", help="apply the database migrations to DATABASE_URL")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "migrate":
        return _migrate()
    if args.command is None:  # bare `leaseq` serves, like `leaseq serve`
        args = _parser().parse_args(["serve", *(argv if argv is not None else sys.argv[1:])])
    try:
        return _serve(args)
    except EmbeddedPostgresError as exc:
        # An operator's problem (data directory in use, server will not start):
        # one clear line, not a traceback.
        print(f"leaseq serve: {exc}", file=sys.stderr)
        return 1


def _settings(**overrides: object) -> Settings:
    # Overrides go into the environment too: uvicorn worker processes and
    # Alembic read their settings from there.
    for key, value in overrides.items():
        if value is not None:
            os.environ[f"LEASEQ_{key.upper()}"] = str(value)
    return Settings()


def _migrate() -> int:
    from app.db.migrate import upgrade

    settings = Settings()
    if settings.database_url is None:
        print("leaseq migrate: set DATABASE_URL to the database to migrate", file=sys.stderr)
        return 2
    upgrade(settings.database_url)
    return 0


def _serve(args: argparse.Namespace) -> int:
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
        # Make sure the receipt secret exists before worker processes race for it.
        settings.receipt_secret()
        upgrade(settings.database_url)
        _run_uvicorn(settings, workers=args.workers)
    except KeyboardInterrupt:
        pass
    finally:
        if embedded is not None:
            log.info("stopping embedded PostgreSQL")
            embedded.stop()
    return 0


def _run_uvicorn(settings: Settings, *, workers: int) -> None:
    import uvicorn

    from app.main import create_app

    common: dict[str, object] = {
        "host": settings.host,
        "port": settings.port,
        "log_level": settings.log_level.lower(),
        # Long polls are woken at shutdown; this bounds anything else.
        "timeout_graceful_shutdown": 5,
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
