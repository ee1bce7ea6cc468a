"""LEASEQ_MAX_HEADER_BYTES is the cap, to the byte, however the headers are split
across reads: real sockets against a real `leaseq serve`
(app/asgi/header_limits.py). Counted per read, headers whose last read crossed
the cap were taken, up to about twice it."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from processes import Service, ServiceProcesses

pytestmark = pytest.mark.e2e

CAP = 8192


@pytest.fixture
def service(tmp_path: Path, database_url: str) -> Iterator[Service]:
    with ServiceProcesses(tmp_path) as services:
        started = services.start(tmp_path / "data", database_url=database_url, env={
            "LEASEQ_MAX_HEADER_BYTES": str(CAP),
        })
        started.wait_healthy()
        yield started


def _headers(total: int) -> bytes:
    """A GET /healthz whose headers (request line and blank line included) are
    `total` bytes."""
    head = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: "
    end = b"\r\n\r\n"
    return head + b"a" * (total - len(head) - len(end)) + end


def _answer(service: Service, *writes: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", service.port), timeout=10) as sock:
        for write in writes:
            sock.sendall(write)
        answer = b""
        try:
            while not answer.endswith(b"}") and (chunk := sock.recv(65536)):
                answer += chunk
        except ConnectionResetError:
            pass
    return answer


def test_headers_at_the_cap_are_taken_and_one_byte_more_is_not(service: Service) -> None:
    assert _answer(service, _headers(CAP)).startswith(b"HTTP/1.1 200 ")
    assert _answer(service, _headers(CAP - 100)).startswith(b"HTTP/1.1 200 ")
    assert _answer(service, _headers(CAP + 1)).startswith(b"HTTP/1.1 431 ")


@pytest.mark.parametrize("first", [CAP - 1, CAP // 2])
def test_headers_over_the_cap_in_two_writes_are_refused(service: Service, first: int) -> None:
    # Whether the two writes reach the service as one read or as two, the
    # headers are about 1.5 times the cap and the read that completes them
    # crosses it.
    request = _headers(CAP + CAP // 2)
    answer = _answer(service, request[:first], request[first:])
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert b'"code": "request_header_too_large"' in answer
