"""A home of the test session's own: HOME and the XDG directories point into a
fresh folder before any test runs, so nothing a user did with leaseq before (a
master secret or a database in `~/.local/share/leaseq`) changes a result, and
nothing the suite does lands in the user's own directories.

Processes the tests start inherit it. npm keeps its download cache where it was:
a cache of packages, not anything of leaseq's, and refilling it would download
the AWS SDK again on every run.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from app.db.embedded import SERVER_ROOT

_XDG = ("XDG_DATA_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME")


@dataclass(frozen=True)
class Entry:
    name: str
    is_dir: bool
    size: int
    mtime_ns: int


def listing(folder: Path) -> frozenset[Entry]:
    """What a folder holds at its top level (not below: a leaseq serve the user
    runs meanwhile may write in its own pgdata, which is not the suite's doing)."""
    if not folder.is_dir():
        return frozenset()
    entries = set()
    for path in folder.iterdir():
        stat = path.lstat()
        is_dir = path.is_dir()
        entries.add(Entry(path.name, is_dir, 0 if is_dir else stat.st_size,
                          0 if is_dir else stat.st_mtime_ns))
    return frozenset(entries)


@dataclass(frozen=True)
class Sandbox:
    home: Path
    real_data_dir: Path
    real_before: frozenset[Entry]
    embedded_root: Path
    machine_root: Path
    machine_root_before: frozenset[Entry]

    def real_changes(self) -> set[str]:
        """Names in the user's real leaseq data directory (or, as paths, in the
        machine's embedded root) the suite created, changed or removed."""
        now = listing(self.real_data_dir)
        machine_now = listing(self.machine_root)
        return {e.name for e in now ^ self.real_before} | {
            str(self.machine_root / e.name) for e in machine_now ^ self.machine_root_before
        }


def enter() -> Sandbox:
    """Points HOME and XDG_* into a fresh folder; returns what it replaced."""
    real_data_dir = Path(platformdirs.user_data_dir("leaseq"))
    real_npm_cache = Path(os.environ.get("HOME", str(Path.home()))) / ".npm"
    home = Path(tempfile.mkdtemp(prefix="leaseq-test-home-"))
    os.environ["HOME"] = str(home)
    for name in _XDG:
        os.environ[name] = str(home / name.removeprefix("XDG_").lower())
    if "npm_config_cache" not in os.environ and real_npm_cache.is_dir():
        os.environ["npm_config_cache"] = str(real_npm_cache)
    # Run as root, every embedded server's files go to the embedded root
    # (app/db/embedded.py): the session's own, removed with it, not the
    # machine's /var/lib/leaseq-pg.
    embedded_root = Path(tempfile.mkdtemp(prefix="leaseq-test-pgroot-"))
    embedded_root.chmod(0o711)  # as the service would make it; tests nest roots in it
    os.environ["LEASEQ_EMBEDDED_ROOT"] = str(embedded_root)
    return Sandbox(home, real_data_dir, listing(real_data_dir), embedded_root,
                   SERVER_ROOT, listing(SERVER_ROOT))
