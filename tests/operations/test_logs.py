"""Log lines: JSON off a terminal, one shape for leaseq's and uvicorn's loggers, an
access line per request with its request id, and never a secret or a body."""

from __future__ import annotations

import io
import json
import logging
import logging.config
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from processes import ServiceProcesses

from app.config import Settings
from app.logs import log_format, logging_config


def _formatted(settings: Settings, record: logging.LogRecord) -> str:
    """`record` as the configured formatter writes it."""
    spec = dict(logging_config(settings)["formatters"]["leaseq"])
    formatter = logging.config.DictConfigurator({}).configure_formatter(spec)
    return str(formatter.format(record))


def test_json_lines_carry_the_level_logger_time_and_extra_fields() -> None:
    record = logging.LogRecord("leaseq.access", logging.INFO, __file__, 1,
                               "GET %s 200", ("/healthz",), None)
    record.request_id = "abc"
    line = json.loads(_formatted(Settings(log_format="json"), record))
    assert line["level"] == "INFO" and line["logger"] == "leaseq.access"
    assert line["message"] == "GET /healthz 200" and line["request_id"] == "abc"
    assert line["time"].endswith("+00:00")


def test_text_lines_for_a_person() -> None:
    record = logging.LogRecord("leaseq", logging.WARNING, __file__, 1, "careful", (), None)
    text = _formatted(Settings(log_format="text"), record)
    assert text.endswith("WARNING leaseq: careful")


def test_the_format_follows_the_terminal_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())
    assert log_format(Settings()) == "text"
    assert log_format(Settings(log_format="json")) == "json"
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert log_format(Settings()) == "json"
    assert log_format(Settings(log_format="text")) == "text"


def _access(records: list[logging.LogRecord]) -> list[dict[str, Any]]:
    return [vars(r) for r in records if r.name == "leaseq.access"]


async def test_every_request_has_an_id_and_one_access_line(
    served: tuple[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    base, _ = served
    caplog.set_level(logging.INFO, logger="leaseq.access")
    async with httpx.AsyncClient(base_url=base) as http:
        created = await http.post("/v1/queues", json={"name": "logged"},
                                  headers={"x-request-id": "req-1"})
        assert created.status_code == 201 and created.headers["x-request-id"] == "req-1"
        sent = await http.post("/v1/queues/logged/messages",
                               json={"body": "the body is private"},
                               headers={"authorization": "Bearer not.a-key-secret"})
        assert sent.status_code == 201
        fresh = sent.headers["x-request-id"]
        assert len(fresh) == 36  # none given: one made here (a UUID, as SQS's)
        odd = await http.get("/v1/queues/logged?x=1", headers={"x-request-id": "two words"})
        assert odd.headers["x-request-id"] not in ("two words", fresh)
        missing = await http.get("/v1/queues/nope")
        assert missing.status_code == 404
    lines = _access(caplog.records)
    assert [(x["method"], x["route"], x["queue"], x["status"]) for x in lines] == [
        ("POST", "/v1/queues", None, 201),
        ("POST", "/v1/queues/{queue}/messages", "logged", 201),
        ("GET", "/v1/queues/{queue}", "logged", 200),
        ("GET", "/v1/queues/{queue}", "nope", 404),
    ]
    assert [x["request_id"] for x in lines[:2]] == ["req-1", fresh]
    assert all(x["latency_ms"] > 0 for x in lines)
    written = [r for r in caplog.records if r.name == "leaseq.access"]
    text = repr([(r.getMessage(), vars(r)) for r in written])
    assert "private" not in text and "secret" not in text and "x=1" not in text


@pytest.mark.e2e
def test_a_served_process_writes_json_lines_only(
    services: ServiceProcesses, tmp_path: Path
) -> None:
    service = services.start(tmp_path / "data")  # its output is a file: JSON
    service.wait_healthy()
    with service.client() as client:
        assert client.post("/v1/queues", json={"name": "q"}).status_code == 201
        sent = client.post("/v1/queues/q/messages", json={"body": "body-never-logged"},
                           headers={"x-request-id": "e2e-42"})
        assert sent.status_code == 201 and sent.headers["x-request-id"] == "e2e-42"
    assert service.stop() == 0, service.log()
    lines = [json.loads(line) for line in service.full_log().splitlines() if line.strip()]
    loggers = {line["logger"] for line in lines}
    assert {"leaseq", "uvicorn.error", "leaseq.access"} <= loggers, loggers
    assert "uvicorn.access" not in loggers  # leaseq.access replaces it
    (access,) = [x for x in lines if x.get("request_id") == "e2e-42"]
    assert access["route"] == "/v1/queues/{queue}/messages" and access["status"] == 201
    assert all({"time", "level", "logger", "message"} <= line.keys() for line in lines)
    assert "body-never-logged" not in service.full_log()


async def test_a_client_cannot_forge_or_stretch_an_access_line(
    served: tuple[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """A queue name is the client's: a percent-encoded line break in it would
    otherwise end the line and start one the client wrote, and a long one would
    make a line as long as the request line may be."""
    base, _ = served
    caplog.set_level(logging.INFO, logger="leaseq.access")
    # No slash in it: the segment must stay one path parameter.
    forged = "2030-01-01 00:00:00,000 INFO leaseq.access: POST keys 201 0.10ms request_id=x"
    async with httpx.AsyncClient(base_url=base) as http:
        for path in (f"/v1/queues/q%0A{forged}%0D%1B[2J", "/v1/queues/" + "n" * 3000,
                     f"/000000000000/q%0A{forged}"):
            answer = await http.get(path, headers={"x-request-id": "forge"})
            assert answer.status_code < 500
    written = [r for r in caplog.records if r.name == "leaseq.access"]
    assert len(written) == 3
    for settings in (Settings(log_format="text"), Settings(log_format="json")):
        for record in written:
            line = _formatted(settings, record)
            assert "\n" not in line and "\r" not in line and "\x1b" not in line, line
            assert len(line) < 1000, len(line)
            assert all(len(str(record.__dict__[k] or "")) <= 203 for k in ("queue", "method"))
    assert [r.queue[:13] for r in written] == ["q\\x0a2030-01-", "n" * 13, "q\\x0a2030-01-"]
    assert all("\n" not in r.getMessage() for r in written)
