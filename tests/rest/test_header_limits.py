"""Before any authentication, a connection costs little and not for long: real
sockets against a real `leaseq serve` (app/asgi/header_limits.py). Headers that
never finish are cut at the deadline, oversized headers answered 431, and slow
connections beyond the cap close the oldest of them, so a normal request is
still served while they last."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from processes import Service, ServiceProcesses
from support import stored_then_revoked

pytestmark = pytest.mark.e2e

TIMEOUT = 1.0
CAP = 5


@pytest.fixture
def service(tmp_path: Path, database_url: str) -> Iterator[Service]:
    with ServiceProcesses(tmp_path) as services:
        started = services.start(tmp_path / "data", database_url=database_url, env={
            "LEASEQ_HEADER_TIMEOUT_SECONDS": str(TIMEOUT),
            "LEASEQ_MAX_UNFINISHED_HEADERS": str(CAP),
            "LEASEQ_MAX_HEADER_BYTES": "8192",
            "LEASEQ_LIMIT_CONCURRENCY": "40",
        })
        started.wait_healthy()
        yield started


def _connect(service: Service, first: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", service.port), timeout=10)
    if first:
        sock.sendall(first)
    return sock


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes `sock` within `seconds` (reading what it sends)."""
    sock.settimeout(seconds)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return True


def test_headers_that_never_finish_are_cut_at_the_deadline(service: Service) -> None:
    silent = _connect(service)
    partial = _connect(service, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    started = time.monotonic()
    assert _closed_within(silent, 5 * TIMEOUT)
    assert _closed_within(partial, 5 * TIMEOUT)
    assert time.monotonic() - started < 5 * TIMEOUT
    silent.close()
    partial.close()
    # A connection trickling a byte at a time is cut too: the deadline is for
    # the whole headers, not between two bytes.
    trickle = _connect(service)
    request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 200
    started = time.monotonic()
    with pytest.raises(OSError):
        for byte in request:
            trickle.sendall(bytes([byte]))
            trickle.settimeout(0.05)
            try:
                if trickle.recv(1) == b"":
                    raise ConnectionResetError("closed")
            except TimeoutError:
                pass
    trickle.close()
    assert time.monotonic() - started < 5 * TIMEOUT


def test_oversized_headers_are_refused_with_431(service: Service) -> None:
    over = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 20_000
    with _connect(service, over) as sock:
        sock.settimeout(10)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert b'"code": "request_header_too_large"' in answer
    # 16 MiB of header: cut off long before it is all sent, and the service is fine.
    with _connect(service, b"GET /healthz HTTP/1.1\r\nX-Big: ") as sock, \
            pytest.raises(OSError):
        for _ in range(16 * 16):
            sock.sendall(b"a" * 65536)
    with httpx.Client(base_url=service.url, timeout=5) as client:
        assert client.get("/healthz").status_code == 200


def test_slow_connections_beyond_the_cap_never_crowd_out_a_request(service: Service) -> None:
    # More slow connections than the cap, and as many as LEASEQ_LIMIT_CONCURRENCY.
    slow = [_connect(service, b"GET /healthz HTTP/1.1\r\n") for _ in range(40)]
    with httpx.Client(base_url=service.url, timeout=5) as client:
        for _ in range(5):
            assert client.get("/healthz").status_code == 200
    # The oldest were closed to keep at most CAP unfinished.
    closed = sum(_closed_within(sock, 0.2) for sock in slow)
    assert closed >= len(slow) - CAP
    for sock in slow:
        sock.close()


def test_a_whole_request_on_a_kept_alive_connection_is_not_cut(service: Service) -> None:
    with httpx.Client(base_url=service.url, timeout=5) as client:
        for _ in range(3):
            assert client.get("/healthz").status_code == 200
        # Idle between requests is the keep-alive timeout's business, not the
        # header deadline's: a request after a pause still goes through.
        assert client.get("/readyz").status_code == 200


def _answer_to_a_partial_body(service: Service, head: bytes) -> bytes:
    """Sends headers announcing 10 MiB and only the first 64 KiB of it: an answer
    that comes now was given without waiting for (or reading) the rest."""
    with _connect(service, head + b"a" * 65536) as sock:
        sock.settimeout(10)
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass
    return answer


def test_an_unauthenticated_body_is_refused_before_it_is_read(
    service: Service, database_url: str
) -> None:
    # Keys are required (one was stored) and none works.
    asyncio.run(stored_then_revoked(database_url, "LQHEADERLIMIT0001.secret-0123456789abcdef"))
    length = 10 * 1024 * 1024
    rest = _answer_to_a_partial_body(service, (
        "POST /v1/queues/q/messages HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n").encode())
    assert rest.startswith(b"HTTP/1.1 401 "), rest[:200]
    assert b"connection: close" in rest.lower()
    sqs = _answer_to_a_partial_body(service, (
        "POST / HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/x-www-form-urlencoded\r\n"
        f"Content-Length: {length}\r\n\r\n").encode())
    assert sqs.startswith(b"HTTP/1.1 403 "), sqs[:200]
    assert b"MissingAuthenticationToken" in sqs and b"connection: close" in sqs.lower()
