"""Real `leaseq` processes for the crash and CLI tests: start, wait, stop, clean up.

Every wait here has a deadline. `ServiceProcesses` remembers everything it
started and, on exit, kills what is left: the service processes and every
PostgreSQL process still serving one of their data directories, so a failing
test never leaves a server behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import asyncpg
import httpx
import psutil

from app.db.engine import plain_url

LEASEQ = str(Path(sys.executable).parent / "leaseq")
"""The console script installed next to the interpreter running the tests."""

START_TIMEOUT = 60.0  # includes initdb, or WAL replay after a crash
STOP_TIMEOUT = 30.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_until(
    condition: Callable[[], bool], *, timeout: float, what: str, interval: float = 0.05
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def service_env(database_url: str | None = None) -> dict[str, str]:
    """The test's environment without any leaseq setting: embedded PostgreSQL
    unless `database_url` is given. The session's embedded root stays
    (tests/sandbox_home.py): where a server's files go, not how leaseq behaves."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key != "DATABASE_URL"
        and (not key.startswith("LEASEQ_") or key == "LEASEQ_EMBEDDED_ROOT")
    }
    if database_url is not None:
        env["DATABASE_URL"] = database_url
    return env


def run_cli(
    *args: str,
    command: Sequence[str] = (LEASEQ,),
    env: dict[str, str] | None = None,
    timeout: float = 60.0,
) -> subprocess.CompletedProcess[str]:
    """Runs a command that ends by itself (help, migrate) and captures its output."""
    return subprocess.run(
        [*command, *args],
        env=env if env is not None else service_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# -- PostgreSQL processes of a data directory -------------------------------------


def pgdata_of(data_dir: Path) -> Path:
    """The server's real directory (run as root, `pgdata` links to it)."""
    return (data_dir.resolve() / "pgdata").resolve()


def postmaster_pid(data_dir: Path) -> int | None:
    """Line 1 of postmaster.pid, or None when there is no (complete) file."""
    try:
        first = (pgdata_of(data_dir) / "postmaster.pid").read_text().splitlines()[0]
    except (FileNotFoundError, IndexError):
        return None
    return int(first) if first.strip().isdigit() else None


def is_running(pid: int) -> bool:
    """Alive and not a zombie (nobody reaps a daemonised postmaster in a container)."""
    try:
        status: str = psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return False
    return bool(status != psutil.STATUS_ZOMBIE)


def postgres_processes(data_dir: Path) -> list[psutil.Process]:
    """Running postgres processes (postmaster, children, orphans) of the data directory:
    PostgreSQL makes its data directory the working directory of all of them."""
    pgdata = str(pgdata_of(data_dir))
    found = []
    for proc in psutil.process_iter(["name"]):
        try:
            if (
                proc.info["name"] == "postgres"
                and proc.status() != psutil.STATUS_ZOMBIE
                and proc.cwd() == pgdata
            ):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def kill_postgres(data_dir: Path, *, timeout: float = 15.0) -> None:
    """Stop every postgres of the data directory: an immediate shutdown first
    (SIGQUIT, which also frees the shared memory), then SIGKILL for the rest."""
    pid = postmaster_pid(data_dir)
    if pid is not None and pid in {p.pid for p in postgres_processes(data_dir)}:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGQUIT)
        with contextlib.suppress(AssertionError):
            wait_until(lambda: not is_running(pid), timeout=timeout / 2, what="postmaster")
    for proc in postgres_processes(data_dir):
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    wait_until(
        lambda: not postgres_processes(data_dir),
        timeout=timeout,
        what=f"postgres processes of {data_dir} to exit",
    )


# -- the service ------------------------------------------------------------------


@dataclass
class Service:
    proc: subprocess.Popen[bytes]
    port: int
    data_dir: Path
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self, lines: int = 60) -> str:
        """The last `lines` lines of the service's output (for failure messages)."""
        text = self.log_path.read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def full_log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def client(self, **options: Any) -> httpx.Client:
        options.setdefault("timeout", 30.0)
        return httpx.Client(base_url=self.url, **options)

    def wait_healthy(self, timeout: float = START_TIMEOUT) -> None:
        """Polls /healthz until 200; fails early if the process exits."""
        deadline = time.monotonic() + timeout
        with httpx.Client(base_url=self.url, timeout=2.0) as client:
            while True:
                code = self.proc.poll()
                if code is not None:
                    raise AssertionError(
                        f"service exited with {code} before it was healthy:\n{self.log()}"
                    )
                try:
                    if client.get("/healthz").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"service not healthy after {timeout:.0f}s:\n{self.log()}"
                    )
                time.sleep(0.05)

    def wait_exit(self, timeout: float = STOP_TIMEOUT) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"service still running {timeout:.0f}s later:\n{self.log()}"
            ) from None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT) -> int:
        """Sends `sig` and waits for the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.wait_exit(timeout)

    def kill(self) -> None:
        """kill -9: no cleanup of any kind runs in the service."""
        self.proc.kill()
        self.proc.wait(timeout=STOP_TIMEOUT)


class ServiceProcesses:
    """Starts services; on exit, kills leftovers and the PostgreSQL of their data dirs."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.started: list[Service] = []
        self.data_dirs: set[Path] = set()

    def start(
        self,
        data_dir: Path,
        *,
        port: int | None = None,
        database_url: str | None = None,
        command: Sequence[str] = (LEASEQ,),
        extra_args: Sequence[str] = (),
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> Service:
        port = port or free_port()
        self.data_dirs.add(data_dir)
        log_path = self.workdir / f"service-{len(self.started)}-{port}.log"
        args = [
            *command, "serve", "--host", "127.0.0.1", "--port", str(port),
            "--data-dir", str(data_dir), *extra_args,
        ]
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                args,
                env={**service_env(database_url), **(env or {})},
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Its own process group: a Ctrl-C of pytest does not reach it,
                # and cleanup can kill whatever it spawned.
                start_new_session=True,
            )
        service = Service(proc=proc, port=port, data_dir=data_dir, log_path=log_path)
        self.started.append(service)
        return service

    def cleanup(self) -> None:
        for service in self.started:
            if service.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(service.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                service.proc.wait(timeout=STOP_TIMEOUT)
        for data_dir in self.data_dirs:
            kill_postgres(data_dir)

    def __enter__(self) -> ServiceProcesses:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()


def create_fifo_queue(service: Service, name: str, **attributes: Any) -> None:
    with service.client() as client:
        response = client.post("/v1/queues", json={"name": name, "fifo": True, **attributes})
        assert response.status_code == 201, response.text


def count_messages(database_url: str, queue: str) -> int:
    """Messages of `queue` in any state, read from the database itself."""
    async def go() -> int:
        conn = await asyncpg.connect(plain_url(database_url))
        try:
            count: int = await conn.fetchval(
                "SELECT count(*) FROM leaseq.messages m JOIN leaseq.queues q ON q.id = m.queue_id "
                "WHERE q.name = $1", queue,
            )
            return count
        finally:
            await conn.close()

    return asyncio.run(go())
