"""The embedded server and generated secrets keep what they hold to their owner:
the postmaster's environment and socket directory are private, run as root it lives
in a root of its own, and a generated receipt secret is created private."""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import stat
import tempfile
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import psutil
import pytest

from app.config import Settings
from app.db import embedded
from app.db.embedded import SYSTEM_USER, EmbeddedPostgres

# -- the embedded server and secrets ----------------------------------------------


def test_embedded_server_environment_and_socket_directory_are_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = f"leaseq-hardening-{uuid.uuid4().hex}"
    for name in ("LEASEQ_SECRET", "DATABASE_URL", "AWS_SECRET_ACCESS_KEY", "PGPASSWORD"):
        monkeypatch.setenv(name, secret)
    # Deep enough that the socket cannot live in the server's directory itself
    # (which, run as root, is under the embedded root).
    data_dir = tmp_path / ("d" * 80)
    deep_root = Path(os.environ["LEASEQ_EMBEDDED_ROOT"]) / ("r" * 80)
    monkeypatch.setenv("LEASEQ_EMBEDDED_ROOT", str(deep_root))
    server = EmbeddedPostgres(data_dir, database="postgres")
    server.start()
    try:
        pid = server.postmaster_pid()
        assert pid is not None
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        assert b"PATH=" in environ and b"LEASEQ_" not in environ
        assert secret.encode() not in environ
        children = psutil.Process(pid).children()
        assert children  # the checkpointer and other background processes
        for child in children:
            try:
                environ = Path(f"/proc/{child.pid}/environ").read_bytes()
            except (FileNotFoundError, ProcessLookupError):
                continue  # a worker that came and went (autovacuum's)
            assert secret.encode() not in environ, child
        socket_dir = Path(server.dsn().split("host=")[1].split("&")[0])
        assert socket_dir.parent == Path(tempfile.gettempdir())
        assert socket_dir.name.startswith("leaseq-pg-")
        info = socket_dir.stat()
        assert stat.S_IMODE(info.st_mode) == 0o700
        owner = pwd.getpwnam(SYSTEM_USER).pw_uid if os.geteuid() == 0 else os.geteuid()
        assert info.st_uid == owner
        assert psutil.Process(pid).uids().real == owner

        async def select_one() -> int:
            conn = await asyncpg.connect(server.dsn())
            try:
                return int(await conn.fetchval("SELECT 1"))
            finally:
                await conn.close()

        assert asyncio.run(select_one()) == 1
    finally:
        server.stop()
    assert not socket_dir.exists()


@pytest.mark.skipif(os.geteuid() != 0,
                    reason="only a server started by root runs as another user")
def test_as_root_the_server_lives_in_a_root_of_its_own_and_no_parent_is_loosened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Root's home stays closed: the server's files and, when pip put them where
    its user cannot go, its binaries live under the embedded root; a data
    directory an earlier leaseq kept in place is moved there whole."""
    private = tmp_path / "home"
    private.mkdir(mode=0o700)
    installed = embedded._bin_dir().parent.parent
    install = private / "site-packages" / installed.name / "pginstall"
    shutil.copytree(installed / "pginstall", install, symlinks=True)
    shutil.copytree(installed.with_name(f"{installed.name}.libs"),
                    private / "site-packages" / f"{installed.name}.libs", symlinks=True)
    monkeypatch.setattr(embedded, "_bin_dir", lambda: install / "bin")
    data_dir = private / "leaseq"
    modes = {path: path.stat().st_mode for path in [install, *install.parents]}
    root = Path(os.environ["LEASEQ_EMBEDDED_ROOT"]).resolve()

    async def sql(dsn: str, statement: str) -> Any:
        conn = await asyncpg.connect(dsn)
        try:
            return await conn.fetchval(statement)
        finally:
            await conn.close()

    server = EmbeddedPostgres(data_dir, database="postgres")
    server.start()
    try:
        link = data_dir / "pgdata"
        real = link.resolve()
        assert link.is_symlink() and real.parent.parent == root
        assert (real.parent / "data-directory").read_text() == f"{data_dir}\n"
        assert real.stat().st_uid == pwd.getpwnam(SYSTEM_USER).pw_uid
        pid = server.postmaster_pid()
        assert pid is not None
        postmaster = psutil.Process(pid)
        assert postmaster.cwd() == str(real)
        assert Path(postmaster.exe()).is_relative_to(root)
        asyncio.run(sql(server.dsn(), "CREATE TABLE kept (n int)"))
    finally:
        server.stop()
    assert {path: path.stat().st_mode for path in modes} == modes

    # The layout of an earlier leaseq: the server's directory inside data_dir.
    link.unlink()
    shutil.move(real, link)
    again = EmbeddedPostgres(data_dir, database="postgres")
    again.start()
    try:
        assert link.is_symlink() and link.resolve().parent.parent == root
        assert not real.exists() or not any(real.iterdir())
        assert asyncio.run(sql(again.dsn(), "SELECT to_regclass('kept') IS NOT NULL"))
    finally:
        again.stop()
    assert {path: path.stat().st_mode for path in modes} == modes


def test_a_generated_receipt_secret_is_created_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only the mode the file is created with counts: chmod does nothing here,
    # and the umask would leave a file created without a mode readable by all.
    monkeypatch.setattr(os, "chmod", lambda *args, **kwargs: None)
    umask = os.umask(0o022)
    try:
        settings = Settings(data_dir=tmp_path / "data", secret=None)
        first = settings.master_secret()
    finally:
        os.umask(umask)
    path = tmp_path / "data" / "receipt-secret"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(first) == 64 and path.read_bytes().strip() == first
    assert Settings(data_dir=tmp_path / "data", secret=None).master_secret() == first
    assert [p.name for p in path.parent.iterdir()] == ["receipt-secret"]
