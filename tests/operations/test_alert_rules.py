"""The alerting rules (deploy/prometheus/leaseq-alerts.yml): valid and unit-tested
by promtool, every alert tested firing and not firing and given a runbook entry,
every series they read exported by leaseq, and a real Prometheus scraping a real
leaseq sees an alert fire. The promtool and Prometheus tests skip where Debian's
`prometheus` package is missing (.ci/run installs it)."""

from __future__ import annotations

import re
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from processes import ServiceProcesses, free_port, wait_until

ROOT = Path(__file__).resolve().parents[2]
RULES_DIR = ROOT / "deploy" / "prometheus"
RULES = RULES_DIR / "leaseq-alerts.yml"
RULE_TESTS = RULES_DIR / "leaseq-alerts.test.yml"
PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")
MISSING = "Debian's prometheus package is not installed (apt-get install prometheus)"


def _rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def _alerts() -> list[str]:
    return [rule["alert"] for rule in _rules() if "alert" in rule]


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    alerts = set(_alerts())
    assert len(alerts) == 10
    assert alerts - firing == set(), "never tested firing"
    assert alerts - quiet == set(), "never tested staying quiet"


def test_every_alert_has_a_runbook_entry() -> None:
    operating = (ROOT / "docs" / "operating.md").read_text()
    headings = set(re.findall(r"^### (Leaseq\w+)$", operating, re.MULTILINE))
    assert headings == set(_alerts())
    for rule in _rules():
        if "alert" in rule:
            assert f'"{rule["alert"]}"' in rule["annotations"]["description"]


async def test_the_rules_read_only_series_leaseq_exports(client: httpx.AsyncClient) -> None:
    exported = set(re.findall(r"^# TYPE (\w+) ", (await client.get("/metrics")).text,
                              re.MULTILINE))
    recorded = {rule["record"] for rule in _rules() if "record" in rule}
    read = set()
    for rule in _rules():
        read |= set(re.findall(r"\b(leaseq[_:][\w:]+)", rule["expr"]))
        read |= set(re.findall(r"\b(leaseq_\w+)\{(?:queue|job)",
                               str(rule.get("annotations", ""))))
    counters = {name.removesuffix("_total") for name in read if name.endswith("_total")}
    assert read - recorded - exported - {f"{c}_total" for c in counters & exported} == set()
    assert {"leaseq_waiting_receivers_limit", "leaseq_maintenance_lock_held"} <= exported


@pytest.mark.e2e
def test_promtool_checks_the_rules_and_passes_their_unit_tests() -> None:
    if PROMTOOL is None:
        pytest.skip(MISSING)
    checked = subprocess.run([PROMTOOL, "check", "rules", str(RULES)],
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 17 rules found" in checked.stdout
    tested = subprocess.run([PROMTOOL, "test", "rules", RULE_TESTS.name], cwd=RULES_DIR,
                            capture_output=True, text=True, timeout=120)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def _instant(text: str) -> datetime:
    """A Prometheus timestamp (RFC 3339, up to nanoseconds)."""
    whole, _, fraction = text.rstrip("Z").partition(".")
    return datetime.fromisoformat(f"{whole}.{(fraction or '0')[:6]:0<6}+00:00")


def _last_scrape(prometheus: httpx.Client) -> datetime:
    try:
        (target,) = prometheus.get("/api/v1/targets").json()["data"]["activeTargets"]
    except (httpx.TransportError, ValueError):
        return datetime.min.replace(tzinfo=UTC)
    if target["health"] != "up":
        return datetime.min.replace(tzinfo=UTC)
    return _instant(target["lastScrape"])


def _last_evaluation(prometheus: httpx.Client) -> datetime:
    groups = prometheus.get("/api/v1/rules").json()["data"]["groups"]
    return min(_instant(g["lastEvaluation"]) for g in groups)


def _firing(prometheus: httpx.Client, alert: str) -> list[dict[str, str]]:
    alerts = prometheus.get("/api/v1/alerts").json()["data"]["alerts"]
    return [a["labels"] for a in alerts if a["labels"]["alertname"] == alert
            and a["state"] == "firing"]


@pytest.mark.e2e
def test_a_real_prometheus_fires_the_dead_letter_alert_of_a_running_leaseq(
    services: ServiceProcesses, tmp_path: Path, database_url: str,
) -> None:
    if PROMETHEUS is None:
        pytest.skip(MISSING)
    service = services.start(tmp_path / "data", database_url=database_url)
    service.wait_healthy()
    # The rules as shipped, but with no `for:` to sit out: the durations are
    # promtool's to test; this test is about the expressions on real series.
    rules = tmp_path / "rules.yml"
    rules.write_text(re.sub(r"^(\s+)for: \S+$", r"\1for: 0s", RULES.read_text(),
                            flags=re.MULTILINE))
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [{"job_name": "leaseq",
                            "static_configs": [{"targets": [f"127.0.0.1:{service.port}"]}]}],
    }))
    log = (tmp_path / "prometheus.log").open("wb")
    prometheus_proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as prometheus, \
                service.client() as leaseq:
            wait_until(lambda: _last_scrape(prometheus).year > 2000, timeout=60,
                       what="Prometheus scraping leaseq")
            for body in ({"name": "dlq"},
                         {"name": "work", "dead_letter_queue": "dlq", "max_receive_count": 1}):
                assert leaseq.post("/v1/queues", json=body).status_code == 201
            for n in range(3):
                assert leaseq.post("/v1/queues/work/messages",
                                   json={"body": f"poison {n}"}).status_code == 201
            # Received once with no lease: the next receive moves each to dlq.
            received = leaseq.get("/v1/queues/work/receive",
                                  params={"max": 10, "visibility_timeout": 0}).json()
            assert len(received["messages"]) == 3
            # A scrape after those receives, and the rules evaluated on it: nothing
            # is dead-lettered yet, and nothing fires.
            now = datetime.now(UTC)
            wait_until(lambda: _last_scrape(prometheus) > now, timeout=30, what="a scrape")
            scraped = _last_scrape(prometheus)
            wait_until(lambda: _last_evaluation(prometheus) > scraped, timeout=30,
                       what="the rules evaluated")
            assert _firing(prometheus, "LeaseqDeadLetterQueueGrowing") == []
            assert leaseq.get("/v1/queues/work/receive", params={"max": 10}).json() == {
                "messages": []}
            wait_until(lambda: _firing(prometheus, "LeaseqDeadLetterQueueGrowing") != [],
                       timeout=60, what="LeaseqDeadLetterQueueGrowing firing")
            (labels,) = _firing(prometheus, "LeaseqDeadLetterQueueGrowing")
            assert labels["queue"] == "work" and labels["dead_letter_queue"] == "dlq"
            assert labels["job"] == "leaseq" and labels["severity"] == "warning"
            # The maintenance lock is held by the one process: that alert stays quiet.
            assert _firing(prometheus, "LeaseqMaintenanceLockNotHeld") == []
    finally:
        prometheus_proc.terminate()
        try:
            prometheus_proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            prometheus_proc.kill()
        log.close()
