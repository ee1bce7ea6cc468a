"""A request's body has deadlines, as its headers do: real sockets against a
real `leaseq serve` (app/asgi/header_limits.py). A body that falls below the
minimum rate after its grace, or is not whole within the total time, is cut
off (408 when nothing was answered yet), so trickling bodies never hold the
connection slots that keep /healthz at 503."""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from processes import Service, ServiceProcesses

pytestmark = pytest.mark.e2e

BODY_TIMEOUT = 3.0
MIN_RATE = 2000
SLOTS = 40


@pytest.fixture
def service(tmp_path: Path, database_url: str) -> Iterator[Service]:
    with ServiceProcesses(tmp_path) as services:
        started = services.start(tmp_path / "data", database_url=database_url, env={
            "LEASEQ_BODY_TIMEOUT_SECONDS": str(BODY_TIMEOUT),
            "LEASEQ_BODY_MIN_BYTES_PER_SECOND": str(MIN_RATE),
            "LEASEQ_LIMIT_CONCURRENCY": str(SLOTS),
        })
        started.wait_healthy()
        yield started


def _open(service: Service, path: str = "/v1/queues", length: int = 100_000) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", service.port), timeout=10)
    sock.sendall((
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n{{").encode())
    return sock


def _trickle_until_closed(socks: list[socket.socket], chunk: int, *,
                          seconds: float) -> dict[socket.socket, bytes]:
    """Sends `chunk` bytes of body on each socket every tenth of a second until the
    service has closed every one of them; what each was answered."""
    answers = {sock: b"" for sock in socks}
    open_ = set(socks)
    deadline = time.monotonic() + seconds
    try:
        while open_:
            assert time.monotonic() < deadline, f"{len(open_)} trickling bodies never cut off"
            readable, _, _ = select.select(list(open_), [], [], 0.1)
            for sock in readable:
                try:
                    data = sock.recv(65536)
                except ConnectionResetError:
                    data = b""
                answers[sock] += data
                if not data:
                    open_.discard(sock)
            for sock in open_ - set(readable):
                try:
                    sock.sendall(b" " * chunk)
                except OSError:
                    open_.discard(sock)
    finally:
        for sock in socks:
            sock.close()
    return answers


def test_trickling_bodies_are_cut_off_and_free_their_slots(service: Service) -> None:
    # All the connections uvicorn takes but one (which /healthz would need), each
    # sending its body a byte at a time: below the minimum rate, so each is cut
    # once its grace is over.
    socks = [_open(service) for _ in range(SLOTS - 1)]
    answers = _trickle_until_closed(socks, 1, seconds=10 * BODY_TIMEOUT)
    assert all(answer.startswith(b"HTTP/1.1 408 ") for answer in answers.values()), [
        answer[:100] for answer in answers.values() if not answer.startswith(b"HTTP/1.1 408 ")]
    assert all(b'"code": "request_timeout"' in answer for answer in answers.values())
    with httpx.Client(base_url=service.url, timeout=5) as client:
        assert client.get("/healthz").status_code == 200
    # The requests cut off end quietly on the app's side: no 500, no traceback.
    log = service.log_path.read_text()
    assert "Traceback" not in log and " 500" not in log, log[-2000:]


def test_a_body_fast_enough_but_never_whole_is_cut_at_the_total_deadline(
    service: Service,
) -> None:
    # Above the minimum rate (four times it), so only the total time can end it.
    sock = _open(service, path="/v1/queues/q/messages", length=5_000_000)
    answers = _trickle_until_closed([sock], MIN_RATE * 4 // 10, seconds=10 * BODY_TIMEOUT)
    assert answers[sock].startswith(b"HTTP/1.1 408 "), answers[sock][:200]


def test_a_silent_body_is_cut_off_on_the_sqs_door_too(service: Service) -> None:
    sock = _open(service, path="/")
    answers = _trickle_until_closed([sock], 0, seconds=10 * BODY_TIMEOUT)
    assert answers[sock].startswith(b"HTTP/1.1 408 "), answers[sock][:200]


def test_whole_bodies_still_go_through(service: Service) -> None:
    with httpx.Client(base_url=service.url, timeout=30) as client:
        assert client.post("/v1/queues", json={"name": "bodies"}).status_code == 201
        big = {"messages": [{"body": "x" * 200_000} for _ in range(10)]}
        sent = client.post("/v1/queues/bodies/messages", json=big)
        assert sent.status_code == 200, sent.text[:300]
        assert all(result["ok"] for result in sent.json()["results"])
        assert client.get("/healthz").status_code == 200
