"""The Worker's options and `leaseq worker`'s: checked when given, the earlier
name of the visibility timeout, the retry options, and the command's refusals
(a handler it cannot load, a missing queue).

The process-level faults (SIGKILL, SIGSTOP, a cut network) are in
test_worker_faults.py.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

import pytest
from processes import LEASEQ, service_env

from leaseq import Backoff, Context, Message, Worker
from leaseq.cli import _parser, worker_backoff

TESTS = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"concurrency": 0}, "concurrency"),
        ({"visibility_timeout": 0}, "visibility timeout"),
        ({"lease": 0}, "visibility timeout"),  # the option's earlier name
        ({"lease": 3, "visibility_timeout": 4}, "not both"),
        ({"visibility_timeout": 3, "heartbeat_period": 3}, "heartbeat period"),
        ({"wait": 21}, "wait"),
    ],
)
def test_worker_options_are_checked(options: dict[str, Any], message: str) -> None:
    def handler(message: Message, ctx: Context) -> None:
        pass

    with pytest.raises(ValueError, match=message):
        Worker(handler, queue="q", **options)


def test_the_visibility_timeout_option_keeps_its_earlier_name() -> None:
    def handler(message: Message, ctx: Context) -> None:
        pass

    assert Worker(handler, queue="q", lease=7).visibility_timeout == 7
    for flag in ("--visibility-timeout", "--lease"):
        args = _parser().parse_args(["worker", "--queue", "q", flag, "9", "m:f"])
        assert args.visibility_timeout == 9


def test_the_cli_s_retry_options_give_the_worker_a_backoff_or_leave_it_to_the_queue() -> None:
    def backoff(*options: str) -> Backoff | None:
        return worker_backoff(_parser().parse_args(["worker", "--queue", "q", *options, "m:f"]))

    assert backoff() is None  # the queue's retry ladder decides
    assert backoff("--retry-delay", "0") == Backoff(initial=0)
    assert backoff("--retry-delay", "5", "--retry-max", "60", "--retry-jitter", "0") == Backoff(
        initial=5, maximum=60, jitter=0
    )
    with pytest.raises(ValueError, match="--retry-multiplier needs --retry-delay"):
        backoff("--retry-multiplier", "3")


@pytest.mark.e2e
def test_the_cli_refuses_a_handler_it_cannot_load() -> None:
    result = subprocess.run(
        [LEASEQ, "worker", "--queue", "q", "no_such_module_here:handle"],
        env=service_env(), capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 2
    assert "cannot load no_such_module_here:handle" in result.stderr
    bad = subprocess.run(
        [LEASEQ, "worker", "--queue", "q", "no-colon"],
        env=service_env(), capture_output=True, text=True, timeout=60, check=False,
    )
    assert bad.returncode == 2 and "is not module:function" in bad.stderr


@pytest.mark.e2e
async def test_the_cli_reports_a_missing_queue(url: str) -> None:
    process = await asyncio.create_subprocess_exec(
        LEASEQ, "worker", "--queue", "absent", "--url", url, "--app-dir", str(TESTS),
        "worker_handlers.faults:steps",
        env=service_env(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(30):
        _out, err = await process.communicate()
    assert process.returncode == 1, err.decode()
    assert "queue_not_found" in err.decode().splitlines()[-1]
