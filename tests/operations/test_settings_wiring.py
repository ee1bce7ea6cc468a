"""The house is wired through constructors: settings are read once, by the
entry points (app/main.py's create_app, app/cli.py), and handed down; nothing
below them reads the environment or builds settings of its own."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parents[2] / "app"
ENTRY_POINTS = {"app/main.py", "app/cli.py", "app/config.py"}
"""config.py defines Settings; main.py and cli.py build them."""

ALLOWED_ENVIRONMENT = {
    # prometheus_client's own variable, which it reads itself: ours must agree.
    ("app/api/metrics.py", "PROMETHEUS_MULTIPROC_DIR"),
    # Where embedded servers live on this machine (tests and the bench move it),
    # and the environment handed to the postmaster: not the service's settings.
    ("app/db/embedded.py", "LEASEQ_EMBEDDED_ROOT"),
    ("app/db/embedded.py", "environ.items"),
}


def _readings(tree: ast.AST) -> list[str]:
    """What a module reads of the environment or of settings it builds itself."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else (
                func.attr if isinstance(func, ast.Attribute) else "")
            if name in {"Settings", "get_settings", "getenv"}:
                found.append(f"{name}()")
            if name in {"get", "items"} and isinstance(func, ast.Attribute) and (
                isinstance(func.value, ast.Attribute) and func.value.attr == "environ"
            ):
                first = node.args[0] if node.args else None
                found.append(
                    first.value if isinstance(first, ast.Constant) else f"environ.{name}"
                )
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and (
            node.value.attr == "environ"
        ):
            key = node.slice
            found.append(key.value if isinstance(key, ast.Constant) else "environ[...]")
    return found


@pytest.mark.unit
def test_nothing_below_the_entry_points_reads_settings_or_the_environment() -> None:
    offenders = []
    for path in sorted(APP.rglob("*.py")):
        name = path.relative_to(APP.parent).as_posix()
        if name in ENTRY_POINTS:
            continue
        for reading in _readings(ast.parse(path.read_text(), name)):
            if (name, reading) not in ALLOWED_ENVIRONMENT:
                offenders.append(f"{name}: {reading}")
    assert offenders == []


@pytest.mark.unit
def test_the_check_sees_each_way_of_reading() -> None:
    source = (
        "import os\n"
        "a = Settings()\n"
        "b = config.get_settings()\n"
        "c = os.environ.get('X')\n"
        "d = os.environ['Y']\n"
        "e = os.getenv('Z')\n"
    )
    assert _readings(ast.parse(source)) == ["Settings()", "get_settings()", "X", "Y", "getenv()"]
