"""The README's curl walk-through works as written (against a live server)."""

from __future__ import annotations

import asyncio
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.e2e

README = Path(__file__).resolve().parents[2] / "README.md"


def walkthrough() -> str:
    text = README.read_text()
    section = text.split("## A walk through with curl", 1)[1]
    match = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert match, "the README lost its curl walk-through"
    return match.group(1)


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
async def test_the_curl_walkthrough(served: tuple[str, Any], tmp_path: Path) -> None:
    base, _app = served
    port = base.rsplit(":", 1)[1]
    script = walkthrough().replace("localhost:8000", f"localhost:{port}")
    script = script.replace("/tmp/msg.json", str(tmp_path / "msg.json"))
    process = await asyncio.create_subprocess_exec(
        "bash", "-euo", "pipefail", "-c", script,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(60):
        out, err = await process.communicate()
    output = out.decode()
    assert process.returncode == 0, err.decode()
    assert '"name":"emails"' in output
    assert '"receipt_handle"' in output
    assert '"lease_seconds":30' in output
    assert "\n204\n" in output
    assert output.rstrip().endswith("}") and '"code":"lease_lost"' in output.splitlines()[-1]
