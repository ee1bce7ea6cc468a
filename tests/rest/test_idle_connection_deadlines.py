"""A kept-alive connection idle after an answer is closed whatever it sends that
begins no request: uvicorn's keep-alive timer ends at any byte, and a stray CRLF
(which the parser skips between requests) began no header deadline either, so a
connection that sent one after its answer was held for good. Real sockets
against a real `leaseq serve` (app/asgi/header_limits.py)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from processes import Service, ServiceProcesses

pytestmark = pytest.mark.e2e

SLOTS = 20


@pytest.fixture
def service(tmp_path: Path, database_url: str) -> Iterator[Service]:
    with ServiceProcesses(tmp_path) as services:
        started = services.start(tmp_path / "data", database_url=database_url, env={
            "LEASEQ_LIMIT_CONCURRENCY": str(SLOTS),
            "LEASEQ_KEEP_ALIVE_SECONDS": "1",
            "LEASEQ_HEADER_TIMEOUT_SECONDS": "1",
        })
        started.wait_healthy()
        yield started


def _answered_once(service: Service) -> socket.socket:
    """A kept-alive connection that made one whole request and read its whole
    answer (so the server's keep-alive timer runs)."""
    sock = socket.create_connection(("127.0.0.1", service.port), timeout=10)
    _ask_health(sock)
    return sock


def _ask_health(sock: socket.socket) -> None:
    """GET /healthz on `sock`, and its whole answer (200) read."""
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "closed before answering"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head[:200]
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        body += sock.recv(65536)


def _closed_by_the_server(sock: socket.socket, within: float) -> bool:
    """Reads until the server closes the connection (b""), for at most `within`."""
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


@pytest.mark.parametrize("stray", [b"\r\n", b"\r\n\r\n\r\n", b"\n"], ids=["crlf", "crlfs", "lf"])
def test_a_stray_line_break_after_an_answer_is_held_to_the_header_deadline(
    service: Service, stray: bytes
) -> None:
    socks = []
    try:
        for _ in range(SLOTS - 2):
            sock = _answered_once(service)
            sock.sendall(stray)
            socks.append(sock)
        # Every one is closed by the header deadline (1 s, swept within a second).
        held = [sock for sock in socks if not _closed_by_the_server(sock, within=10)]
        assert not held, f"{len(held)} connections were never closed"
        with httpx.Client(base_url=service.url, timeout=5) as client:
            assert client.get("/healthz").status_code == 200
    finally:
        for sock in socks:
            sock.close()


def test_an_idle_connection_is_closed_by_its_keep_alive(service: Service) -> None:
    with _answered_once(service) as sock:
        assert _closed_by_the_server(sock, within=10)


def test_a_second_request_after_a_stray_line_break_is_answered(service: Service) -> None:
    with _answered_once(service) as sock:
        sock.sendall(b"\r\n")
        _ask_health(sock)
