"""examples/curl-worker.sh against the real service: it acknowledges what its
command finishes, releases what it fails through the release endpoint, and kills
the command when a heartbeat answers 409."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from processes import service_env
from support import wait_until

from leaseq import AsyncClient

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "curl-worker.sh"

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not all(shutil.which(tool) for tool in ("bash", "curl", "jq"))
        or not Path("/proc/uptime").exists(),
        reason="the shell worker needs bash, curl, jq and /proc/uptime",
    ),
]


@pytest.fixture
async def shell_worker(served: tuple[str, Any], tmp_path: Path) -> AsyncIterator[Any]:
    """Runs the script for one message (LEASEQ_ONCE); `finish()` gives its exit
    code and log."""
    started: list[asyncio.subprocess.Process] = []

    async def start(queue: str, command: str, lease: int) -> Any:
        log = tmp_path / f"shell-{len(started)}.log"
        env = service_env() | {
            "LEASEQ_URL": served[0], "LEASEQ_LEASE": str(lease), "LEASEQ_WAIT": "5",
            "LEASEQ_ONCE": "1",
        }
        with log.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                "bash", str(SCRIPT), queue, "sh", "-c", command, env=env,
                stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out,
                start_new_session=True,
            )
        started.append(proc)

        async def finish() -> tuple[int, str]:
            async with asyncio.timeout(30):
                code = await proc.wait()
            return code, log.read_text()

        return finish

    yield start
    for proc in started:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()


async def test_the_shell_worker_runs_the_command_and_acknowledges(
    shell_worker: Any, api: AsyncClient, tmp_path: Path
) -> None:
    await api.create_queue("shell", visibility_timeout=1)
    await api.send("shell", "payload")
    out = tmp_path / "out"
    # 2.5 s of work on a 1 s lease: only the background heartbeat keeps it
    finish = await shell_worker(
        "shell", f'cat > {out}; echo " $LEASEQ_RECEIVE_COUNT" >> {out}; sleep 2.5', 1
    )
    code, log = await finish()
    assert code == 0, log
    assert out.read_text() == "payload\n 1\n"
    assert ") acknowledged" in log
    stats = (await api.get_queue("shell")).stats
    assert stats is not None and stats.visible == stats.in_flight == 0


async def test_a_failed_command_s_message_is_released_with_the_queue_s_ladder(
    shell_worker: Any, api: AsyncClient
) -> None:
    ladder = {"initial": 30, "max": 30, "jitter": 0}
    await api.create_queue("shellfail", visibility_timeout=30, retry_backoff=ladder)
    await api.send("shellfail", "payload")
    finish = await shell_worker("shellfail", "exit 3", 30)
    code, log = await finish()
    assert code == 0, log
    assert "failed (exit 3); released, visible again in 30s" in log
    stats = (await api.get_queue("shellfail")).stats
    assert stats is not None and (stats.visible, stats.in_flight, stats.delayed) == (0, 0, 1)


async def test_a_409_on_a_shell_heartbeat_kills_the_command(
    shell_worker: Any, api: AsyncClient, tmp_path: Path
) -> None:
    await api.create_queue("shell409", visibility_timeout=3)
    await api.send("shell409", "payload")
    handle_file = tmp_path / "handle"
    finish = await shell_worker(
        "shell409", f'printf %s "$LEASEQ_RECEIPT_HANDLE" > {handle_file}; sleep 60', 3
    )
    await wait_until(lambda: handle_file.exists() and handle_file.stat().st_size > 0, 20)
    await api.release("shell409", handle_file.read_text(), 0)
    (mine,) = await api.receive("shell409", visibility_timeout=60, wait=0)
    taken = time.monotonic()
    code, log = await finish()
    assert time.monotonic() - taken < 1.0 + 0.5  # the next beat (every second) got 409
    assert code == 0, log
    assert "abandoned: the watchdog cancelled it (lease_lost)" in log
    await api.delete("shell409", mine.receipt_handle)  # our claim was never touched
