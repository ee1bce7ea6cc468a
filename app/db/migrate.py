"""Runs the Alembic migrations (the schema's only owner) against a URL."""

from __future__ import annotations

from pathlib import Path

from alembic.config import Config

from alembic import command

MIGRATION_LOCK = 0x6C65_6173_6571_0001
"""pg_advisory_lock key (bigint) that alembic/env.py holds while it migrates:
"leaseq" in ASCII, then 1. Replicas starting together on a fresh database
queue on it: the first migrates, the others then find the schema at head."""

LOCK_NOT_AVAILABLE = "55P03"
"""The SQLSTATE of a lock not had within lock_timeout: a migration's step that
waits for its locks a bounded time (alembic/env.py, 0022) tries again on it."""


def _script_location() -> Path:
    package = Path(__file__).resolve().parent.parent
    # Installed: the wheel ships the migrations as app/_alembic. From a source
    # checkout: the repository's alembic/ beside the package. (Installed, the
    # directory beside the package is site-packages/alembic: the library.)
    for candidate in (package / "_alembic", package.parent / "alembic"):
        if (candidate / "env.py").exists():
            return candidate
    raise RuntimeError("alembic migrations not found next to the app package")


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(_script_location()))
    config.attributes["database_url"] = url
    return config


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)
