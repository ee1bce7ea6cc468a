"""The dashboard's cookie is Secure whenever the request came over https: behind
the documented TLS proxy, X-Forwarded-Proto from an address in
LEASEQ_FORWARDED_ALLOW_IPS says so; from any other address it is ignored."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from processes import Service, ServiceProcesses

pytestmark = pytest.mark.e2e

ADMIN = "LQBOOTSTRAPADMIN0001.admin-secret-0123456789abcdefghij"


@pytest.fixture
def services(tmp_path: Path) -> Iterator[ServiceProcesses]:
    with ServiceProcesses(tmp_path) as started:
        yield started


def _cookie(service: Service, **headers: str) -> str:
    signed = httpx.post(service.url + "/ui/session", json={"key": ADMIN}, headers=headers)
    assert signed.status_code == 200, signed.text
    return signed.headers["set-cookie"]


def test_the_cookie_is_secure_through_the_trusted_proxy(
    services: ServiceProcesses, tmp_path: Path, database_url: str,
) -> None:
    service = services.start(tmp_path / "data", database_url=database_url,
                             env={"LEASEQ_ADMIN_KEY": ADMIN})
    service.wait_healthy()
    assert "secure" not in _cookie(service).lower()
    # The proxy (here on loopback, the default LEASEQ_FORWARDED_ALLOW_IPS) says https.
    assert "secure" in _cookie(service, **{"x-forwarded-proto": "https"}).lower()


def test_forwarded_headers_from_another_address_are_ignored(
    services: ServiceProcesses, tmp_path: Path, database_url: str,
) -> None:
    service = services.start(tmp_path / "data", database_url=database_url,
                             env={"LEASEQ_ADMIN_KEY": ADMIN,
                                  "LEASEQ_FORWARDED_ALLOW_IPS": "10.9.9.9"})
    service.wait_healthy()
    assert "secure" not in _cookie(service, **{"x-forwarded-proto": "https"}).lower()
