"""`python -m bench --quick` runs and produces a well-formed table (the benchmark
itself never runs inside the test suite: its figures are not asserted)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(
    bool(os.environ.get("DATABASE_URL")),
    reason="runs on its own embedded server whatever DATABASE_URL says: the same test "
    "as without it",
)
def test_quick_benchmark_runs_and_reports(tmp_path: Path) -> None:
    output = tmp_path / "bench.json"
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    run = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--output", str(output)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("cycle"))
    assert lines[header].split() == [
        "cycle", "raw", "msg/s", "rest", "msg/s", "rest/raw", "lost", "dup", "claim", "p99",
        "delete", "p99", "gen", "CPU", "svc", "CPU",
    ]
    rows = lines[header + 1 : header + 6]
    assert [row.split(",")[0] for row in rows] == [
        "single", "batch 10", "single", "batch 10", "batch 10"]
    assert all("acks ride" in row for row in rows[2:4])
    assert "SQS JSON" in rows[4]
    assert any(line.startswith("  CPU per message at 16 clients, service + database")
               for line in lines)
    assert any(line.startswith("uvicorn floor: a bare ASGI app") for line in lines)
    assert any(line.startswith("  service CPU per message: single x16") for line in lines)
    assert any(line.startswith("  PostgreSQL per message at 16 clients, lockstep")
               for line in lines)
    assert any(line.startswith("  per database core at 16 clients, lockstep") for line in lines)
    apart = next(i for i, line in enumerate(lines) if line.startswith("apart"))
    assert [row.split(",")[0] for row in lines[apart + 1 : apart + 5]] == [
        "minimal single", "leaseq single", "minimal batch 10", "leaseq batch 10"]
    fifo = next(i for i, line in enumerate(lines) if line.startswith("fifo cycle"))
    assert lines[fifo - 1].startswith("FIFO queues, batch 10, 16 clients")
    assert [row.split("  ")[0] for row in lines[fifo + 1 : fifo + 4]] == [
        "standard queue", "FIFO, 100 groups", "FIFO, 1 hot group"]
    assert any(line.startswith("heartbeats: 1000 leases") for line in lines)
    assert any(line.startswith("heartbeat capacity: 2000 leases") for line in lines)
    assert any(line.startswith("send -> receive through a long poll") for line in lines)
    assert any(line.startswith("HTTP floor: GET /healthz") for line in lines)
    assert any(line.startswith("service RSS") for line in lines)

    report = json.loads(output.read_text())
    assert report["quick"] is True and len(report["cycle"]) == 2
    assert [row["rest"]["clients"] for row in report["cycle"] if "minimal" in row] == [16, 16]
    for row in report["cycle"]:
        for side in ("minimal", "raw", "rest") if "minimal" in row else ("raw", "rest"):
            assert row[side]["messages_per_second"] > 0
            assert row[side]["lost"] == 0
            assert row[side]["wal_bytes_per_message"] > 0
        assert row["ratio"] > 0
        if row["rest"]["clients"] == 16:  # the workers' cycle, acknowledgements riding
            assert row["worker"]["messages_per_second"] > 0 and row["worker"]["lost"] == 0
            assert row["worker"]["duplicated"] == 0
            if row["rest"]["batch"] == 10:  # the SQS door's JSON protocol
                assert row["sqs"]["messages_per_second"] > 0 and row["sqs"]["lost"] == 0
                assert row["sqs"]["database_cpu_percent"] > 0
    assert [(pair["backlog"], pair["batch"]) for pair in report["apart"]] == [
        (1000, 1), (1000, 10)]
    for pair in report["apart"]:
        for side in ("minimal", "rest"):
            shape = pair[side]
            assert shape["messages_per_second"] > 0, shape
            assert shape["lost"] == 0 and shape["duplicated"] == 0, shape
            assert shape["database_us_per_message"] > 0 and shape["wal_bytes_per_message"] > 0
            # The backlog stood: the producers kept it, the consumers never ran dry.
            assert shape["standing_after"] >= pair["backlog"] // 2, shape
        assert pair["rest"]["service_us_per_message"] > 0
    standard, *fifo_rows = [report["fifo"]["standard"], *report["fifo"]["rows"]]
    assert [row["groups"] for row in fifo_rows] == [100, 1]
    for row in (standard, *fifo_rows):
        assert row["messages_per_second"] > 0 and row["lost"] == 0 and row["duplicated"] == 0
        assert row["clients"] == 16 and row["batch"] == 10
    assert all(row["ratio"] > 0 for row in fifo_rows)
    (beats,) = report["heartbeats"]
    assert beats["with"]["heartbeats_per_second"] > 0 and beats["with"]["lost"] == 0
    capacity = report["heartbeat_capacity"]
    assert capacity["leases"] == 2000
    for side in ("rest", "raw"):
        assert capacity[side]["beats_per_second"] > 0
        assert capacity[side]["failed"] == 0 and capacity[side]["errors"] == 0
    assert capacity["failed"] == 0
    assert report["long_poll"]["n"] == 100
    assert report["floor"]["requests_per_second"] > 0
    assert report["bare_floor"]["requests_per_second"] > 0
    assert 0 < report["rss_idle_mb"] <= report["rss_peak_mb"]


@pytest.mark.skipif(
    bool(os.environ.get("DATABASE_URL")),
    reason="runs on its own embedded server whatever DATABASE_URL says",
)
def test_quick_fair_bench_runs_and_loses_nothing(tmp_path: Path) -> None:
    output = tmp_path / "fair.json"
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    run = subprocess.run(
        [sys.executable, "-m", "bench.fair", "--quick", "--output", str(output)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(output.read_text())
    assert report["burst"] == 2_000
    rows = report["rows"]
    assert list(rows) == ["steady", "burst", "ungrouped burst"]
    for row in rows.values():
        assert (row["lost"], row["duplicated"]) == (0, 0), row
        assert row["quiet_messages"] > 0 and row["messages_per_second"] > 0, row
    assert any(line.startswith("fair queues: 20 quiet tenants") for line in
               run.stdout.splitlines())


def test_heartbeat_capacity_runs_the_engines_statement() -> None:
    """bench/heartbeat_capacity.py's raw side is change_visibility of queries.sql, its
    fragments in place, on the parent table (as the engine names it with no view of
    the generations)."""
    module = ast.parse((ROOT / "bench" / "heartbeat_capacity.py").read_text())
    (raw,) = [node.value.value for node in module.body
              if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
              and [getattr(t, "id", None) for t in node.targets] == ["RAW_HEARTBEAT"]]
    from app.queue.generations import View
    from app.queue.sql import Q

    block = View().rename(Q.change_visibility.text).split(";", 1)[0]
    statement = " ".join(line for line in block.splitlines() if not line.startswith("--"))
    for name, number in (("ids", 1), ("tokens", 2), ("visibility_timeouts", 3),
                         ("queue_id", 4)):
        statement = statement.replace(f":{name}", f"${number}")
    assert statement.split() == raw.split()


def test_the_edges_bench_times_a_real_authorization_check() -> None:
    """bench.edges times the Guard's rule and the reach check a request runs: if
    either stopped refusing, the figure would time nothing worth a target."""
    from app.api.routes import redrive
    from app.auth.guard import Rules
    from app.auth.scopes import Principal, parse_scopes
    from app.errors import Forbidden

    code = ("import json; from bench.edges import authorization_cost; "
            "print(json.dumps(authorization_cost(n=200, rounds=1)))")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    figure = json.loads(run.stdout)
    assert figure["us_per_request"] > 0 and figure["queues"] == 3
    outsider = Principal("LQX", "x", parse_scopes(["admin:team-a-*"]))
    found = Rules(redrive.router.routes).find("POST", "/v1/queues/team-a-dlq/redrive")
    assert found is not None
    found[0].check_request_line(outsider, found[1])
    with pytest.raises(Forbidden):
        found[0].require(outsider, "redrive_targets", ["team-b-src"])
