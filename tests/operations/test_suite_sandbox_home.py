"""The suite runs in a home of its own (tests/sandbox_home.py): what a user did
with leaseq before cannot change a result, and the suite writes nothing there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import platformdirs
import pytest
from conftest import SANDBOX

from app.config import Settings
from app.db.embedded import SERVER_ROOT, server_root


def test_settings_default_into_the_sessions_own_home() -> None:
    home = Path(os.environ["HOME"])
    assert home == SANDBOX.home
    assert Settings().data_dir.is_relative_to(home)
    assert Path(platformdirs.user_config_dir("leaseq")).is_relative_to(home)
    assert not SANDBOX.real_data_dir.is_relative_to(home)
    # Run as root, embedded servers keep their files in the session's own root.
    assert server_root() == SANDBOX.embedded_root.resolve() != SERVER_ROOT


@pytest.mark.e2e
def test_a_process_the_tests_start_sees_the_same_home() -> None:
    code = "import platformdirs; print(platformdirs.user_data_dir('leaseq'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout.strip()
    assert Path(out).is_relative_to(SANDBOX.home)


def test_a_change_to_the_real_data_directory_is_seen(tmp_path: Path) -> None:
    """The session's final check can fail: it notices a file made, changed or removed."""
    from sandbox_home import Sandbox, listing

    folder = tmp_path / "real"
    folder.mkdir()
    (folder / "receipt-secret").write_text("x")
    machine = tmp_path / "var-lib-leaseq-pg"
    machine.mkdir()
    watch = Sandbox(tmp_path / "home", folder, listing(folder), tmp_path / "pgroot",
                    machine, listing(machine))
    assert watch.real_changes() == set()
    (folder / "pgdata").mkdir()
    assert watch.real_changes() == {"pgdata"}
    (folder / "receipt-secret").write_text("changed")
    assert watch.real_changes() == {"pgdata", "receipt-secret"}
    (machine / "leaseq-abc").mkdir()  # a server's files in the machine's root
    assert watch.real_changes() == {"pgdata", "receipt-secret", str(machine / "leaseq-abc")}
