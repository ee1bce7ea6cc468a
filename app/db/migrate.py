"""Runs the Alembic migrations (the schema's only owner) against a URL."""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from typing import Any

from alembic.config import Config
from sqlalchemy.exc import DBAPIError

from alembic import command

_log = logging.getLogger("leaseq.migrate")

MIGRATION_LOCK = 0x6C65_6173_6571_0001
"""pg_advisory_lock key (bigint) that alembic/env.py holds while it migrates:
"leaseq" in ASCII, then 1. Replicas starting together on a fresh database
queue on it: the first migrates, the others then find the schema at head."""

LOCK_NOT_AVAILABLE = "55P03"
"""The SQLSTATE of a lock not had within lock_timeout: a migration's step that
waits for its locks a bounded time (alembic/env.py, 0022) tries again on it."""


# A session that has held a lock on the table for a while (a pg_dump holds ACCESS
# SHARE on every table it dumps until it ends; a report; a migration of the
# application's): a try would only wait behind it, and every statement queued
# behind the try with it.
_LONG_HOLDER = """
SELECT a.pid, coalesce(nullif(a.application_name, ''), a.backend_type) AS who,
       a.xact_start
FROM pg_locks AS l JOIN pg_stat_activity AS a ON a.pid = l.pid
WHERE l.locktype = 'relation' AND l.granted AND l.pid <> pg_backend_pid()
  AND l.relation = to_regclass('{table}')
  AND a.xact_start < clock_timestamp() - interval '1 second'
ORDER BY a.xact_start
LIMIT 1
"""


def retried(bind: Any, sql: str, *, table: str, revision: str) -> None:
    """Runs one online step of a migration, again whenever it could not get its
    locks within its lock_timeout (the step sets it). What waits behind a try
    waits no longer than that, nothing between two tries, and no try is made
    while a long transaction holds a lock on `table`: the step waits, naming it."""
    if not re.fullmatch(r"[a-z_]+\.[a-z_0-9]+", table):
        raise ValueError(f"not a table name: {table!r}")
    pause = 0.05
    while True:
        holder = bind.exec_driver_sql(_LONG_HOLDER.format(table=table)).first()
        if holder is None:
            try:
                bind.exec_driver_sql(sql)
                return
            except DBAPIError as exc:
                if getattr(exc.orig, "sqlstate", None) != LOCK_NOT_AVAILABLE:
                    raise
        elif pause >= 1.0:
            _log.warning("migration %s waits for pid %s (%s, in a transaction since "
                         "%s), which holds a lock on %s", revision, *holder, table)
        time.sleep(pause)
        pause = min(pause * 2, 5.0)


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
