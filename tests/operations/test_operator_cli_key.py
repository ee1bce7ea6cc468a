"""The operator commands take their key from LEASEQ_API_KEY or a file
(--key-file); a key on the command line still works, with a warning on stderr:
every user of the machine can read a command line (`ps`)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from processes import LEASEQ, Service, ServiceProcesses, service_env

pytestmark = pytest.mark.e2e

ADMIN = "LQOPERATORADMIN0001.operator-secret-0123456789abcdef"
WARNING = "visible to every user of this machine"


@pytest.fixture
def service(tmp_path: Path, database_url: str) -> Iterator[Service]:
    with ServiceProcesses(tmp_path) as services:
        started = services.start(tmp_path / "data", database_url=database_url,
                                 env={"LEASEQ_ADMIN_KEY": ADMIN})
        started.wait_healthy()
        yield started


def _cli(service: Service, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = service_env()
    environment.pop("LEASEQ_API_KEY", None)
    environment.update(env)
    return subprocess.run([LEASEQ, "queues", "list", "--json", "--url", service.url, *args],
                          env=environment, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=60, check=False)


def test_the_key_from_the_environment_or_a_file_goes_unwarned(
    service: Service, tmp_path: Path,
) -> None:
    from_env = _cli(service, LEASEQ_API_KEY=ADMIN)
    assert from_env.returncode == 0, from_env.stderr
    assert WARNING not in from_env.stderr
    key_file = tmp_path / "key"
    key_file.write_text(ADMIN + "\n")
    from_file = _cli(service, "--key-file", str(key_file))
    assert from_file.returncode == 0, from_file.stderr
    assert WARNING not in from_file.stderr
    assert (_cli(service).returncode, "unauthenticated" in _cli(service).stderr) == (1, True)


def test_a_key_on_the_command_line_works_with_a_warning(service: Service) -> None:
    given = _cli(service, "--api-key", ADMIN)
    assert given.returncode == 0, given.stderr
    assert WARNING in given.stderr and "LEASEQ_API_KEY" in given.stderr
    assert ADMIN not in given.stderr


def test_a_key_file_that_gives_no_key_is_a_usage_error(
    service: Service, tmp_path: Path,
) -> None:
    empty = tmp_path / "empty"
    empty.write_text("\n")
    for path in (empty, tmp_path / "missing"):
        refused = _cli(service, "--key-file", str(path))
        assert refused.returncode == 2 and "--key-file" in refused.stderr, refused.stderr
    both = _cli(service, "--key-file", str(empty), "--api-key", ADMIN)
    assert both.returncode == 2 and "not both" in both.stderr
    top = subprocess.run([LEASEQ, "top", "--once", "--url", service.url, "--key-file",
                          str(tmp_path / "missing")], env=service_env(),
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
                         check=False)
    assert top.returncode == 2 and "--key-file" in top.stderr
