"""`python -m bench.history --quick` runs every row end to end and loses nothing
(its figures are not asserted: the rows run for seconds here, not minutes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
@pytest.mark.skipif(
    bool(os.environ.get("DATABASE_URL")),
    reason="runs on its own embedded server whatever DATABASE_URL says",
)
def test_quick_history_bench_runs_every_row(tmp_path: Path) -> None:
    output = tmp_path / "history.json"
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    run = subprocess.run(
        [sys.executable, "-m", "bench.history", "--quick", "--minutes", "0.1",
         "--output", str(output)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=540,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    for start in ("held horizon: 8 producers and 8 consumers apart", "fair tenants:",
                  "backlog:", "service RSS peak"):
        assert any(line.startswith(start) for line in lines), start
    report = json.loads(output.read_text())

    runs = report["horizon"]["runs"]
    assert [(r["kind"], r["batch"]) for r in runs] == [
        ("rest", 1), ("minimal", 1), ("rest", 10), ("minimal", 10)]
    dump = report["dump"]
    if "skipped" not in dump:
        assert [(r["kind"], r["batch"], r["hold"]) for r in dump["runs"]] == [
            ("rest", 1, "pg_dump"), ("rest", 10, "pg_dump")]
        runs = [*runs, *dump["runs"]]
    for held in runs:
        assert held["holder"]["held_to_end"], held["holder"]
        assert (held["lost"], held["duplicated"]) == (0, 0), held
        assert held["windows"], held
        for window in (held["clean"], *held["windows"]):
            assert window["messages_per_second"] > 0 and window["database_us_per_message"] > 0
            # The backlog stood: the producers kept it, the consumers never ran dry.
            assert window["standing_after"] >= held["backlog"] // 2, window
        for window in held["windows"]:
            assert window["holder_age_xids"] > 0 and window["rate_x_clean"] > 0, window
        assert held["windows"][-1]["dead_rows"] > 0

    tenants, backlog = report["tenants"], report["backlog"]
    assert [row["tenants"] for row in tenants] == [10, 1000, 20_000]
    assert [row["messages"] for row in backlog] == [1000, 100_000]
    for row in (*tenants, *backlog):
        assert (row["lost"], row["duplicated"]) == (0, 0), row
        assert row["cycles"] >= 3 and row["database_us_per_message"] > 0, row


@pytest.mark.timeout(300)
@pytest.mark.skipif(
    bool(os.environ.get("DATABASE_URL")),
    reason="runs on its own embedded server whatever DATABASE_URL says",
)
@pytest.mark.parametrize(("option", "kind"), [("--fair", "fair"), ("--fifo", "fifo")])
def test_held_rows_on_a_fair_or_fifo_queue_only(tmp_path: Path, option: str, kind: str) -> None:
    """The options that pick the held rows: leaseq's alone, batches of 10, on a
    queue made fair by its messages' tenants (a FIFO queue, its messages in
    groups); each window says the rotation's epoch."""
    output = tmp_path / "history.json"
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    run = subprocess.run(
        [sys.executable, "-m", "bench.history", "--quick", "--minutes", "0.1", "--only",
         "horizon", "--leaseq-only", "--batch", "10", option, "10", "--output", str(output)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert any(line.startswith(f"{kind} 10 batch 10, clean") for line in run.stdout.splitlines())
    report = json.loads(output.read_text())
    assert set(report) >= {"horizon"} and "tenants" not in report
    (held,) = report["horizon"]["runs"]
    assert (held["kind"], held["batch"], held["spread"]) == ("rest", 10, f"{kind} 10")
    assert (held["fair"], held["fifo"]) == (kind == "fair", kind == "fifo"), held
    assert (held["lost"], held["duplicated"]) == (0, 0), held
    for window in (held["clean"], *held["windows"]):
        assert isinstance(window["epoch"], int) and window["generations_used"] >= 0, window
        assert window["canary_ms"] > 0 and window["standing_after"] >= held["backlog"] // 2
