"""A primary whose host vanishes: no FIN, no RST, no ICMP; its packets are lost.

test_failover.py kills the primary's postmaster, and the kernel closes its
sockets at once: the service hears of it. Here the primary's host is cut off
first, so the service's connections to it go silent, and only then is it killed
and its synchronous standby promoted. What used to happen: statements in flight
waited as long as the kernel retransmits (about 15 minutes), and every new
connection spent asyncpg's whole connect timeout (60 s, for all hosts together)
on the vanished first host and never tried the promoted one.

The network is the test's own: a network namespace for the service, joined to
this machine by two veth pairs, one a host of each database server. Nothing
leaves this machine. Cutting the primary's link (its side of the pair down, a
permanent neighbour entry on the service's side) drops every packet to it, as a
switched-off machine would. Runs as root, which CI is; skipped elsewhere.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from processes import LEASEQ, ServiceProcesses, free_port
from support import TEST_SECRET
from test_failover import (
    SENDERS,
    Load,
    _sender,
    _until_listening,
    lost_sends,
    stop_load,
    until_sent_after,
)

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._replication import ReplicatedPostgres  # noqa: E402

DEAD_PEER_SECONDS = 4  # LEASEQ_DB_DEAD_PEER_SECONDS for the service (default 10)
CONNECT_TIMEOUT = 1  # LEASEQ_DB_CONNECT_TIMEOUT_SECONDS (default 5)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=20)


pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        bool(os.environ.get("DATABASE_URL")),
        reason="starts its own primary and standby: the same test as without DATABASE_URL",
    ),
]


@dataclass
class Link:
    """A veth pair: `outer` on this machine with `host` (a database server's
    address), `inner` in the service's namespace with `peer`."""

    outer: str
    inner: str
    host: str
    peer: str


@dataclass
class Network:
    namespace: str
    primary: Link
    standby: Link

    def run(self, *command: str) -> list[str]:
        """`command` inside the service's namespace."""
        return ["ip", "netns", "exec", self.namespace, *command]

    def vanish(self, link: Link) -> None:
        """Every packet to `link.host` from the namespace is dropped from now on."""
        _ip("link", "set", link.outer, "down")


@pytest.fixture
def network() -> Iterator[Network]:
    # 198.18.0.0/15 is reserved for tests of network devices (RFC 2544); these
    # addresses exist only on the pairs made here.
    tag = os.getpid() % 100_000
    third = tag % 250
    ns = f"lqv{tag}"
    primary = Link(f"lqp{tag}o", f"lqp{tag}i", f"198.18.{third}.1", f"198.18.{third}.2")
    standby = Link(f"lqs{tag}o", f"lqs{tag}i", f"198.18.{third}.5", f"198.18.{third}.6")
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and `ip netns` (iproute2) for its own network")
    try:
        _ip("netns", "add", ns)
    except (subprocess.SubprocessError, OSError) as exc:
        pytest.skip(f"cannot make a network namespace here: {exc}")
    try:
        _ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
        for link in (primary, standby):
            _ip("link", "add", link.outer, "type", "veth", "peer", "name", link.inner)
            _ip("link", "set", link.inner, "netns", ns)
            _ip("addr", "add", f"{link.host}/30", "dev", link.outer)
            _ip("link", "set", link.outer, "up")
            _ip("netns", "exec", ns, "ip", "addr", "add", f"{link.peer}/30", "dev", link.inner)
            _ip("netns", "exec", ns, "ip", "link", "set", link.inner, "up")
            # Known for good: a vanished host is not looked up again (a failed
            # lookup would answer "no route to host" at once, as a LAN may).
            mac = Path(f"/sys/class/net/{link.outer}/address").read_text().strip()
            _ip("netns", "exec", ns, "ip", "neigh", "replace", link.host, "lladdr", mac,
                "dev", link.inner, "nud", "permanent")
        yield Network(ns, primary, standby)
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)
        for link in (primary, standby):
            subprocess.run(["ip", "link", "del", link.outer], capture_output=True, timeout=20)


async def test_a_primary_whose_host_vanishes_is_given_up_and_the_standby_taken(
    tmp_path: Path, network: Network,
) -> None:
    addresses = {"primary": network.primary.host, "standby": network.standby.host}
    with ReplicatedPostgres(synchronous=True, addresses=addresses,
                            trusted="198.18.0.0/15") as pg, \
            ServiceProcesses(tmp_path) as services:
        url = (f"postgresql://postgres@{network.primary.host}:{pg.primary.port},"
               f"{network.standby.host}:{pg.standby.port}/{pg.database}"
               "?target_session_attrs=read-write")
        port = free_port()
        service = services.start(
            tmp_path / "data", port=port, database_url=url,
            command=network.run("env", "LEASEQ_ACCESS_LOG=false",
                                f"LEASEQ_DB_DEAD_PEER_SECONDS={DEAD_PEER_SECONDS}",
                                f"LEASEQ_DB_CONNECT_TIMEOUT_SECONDS={CONNECT_TIMEOUT}",
                                "LEASEQ_ALLOWED_HOSTS=*",
                                f"LEASEQ_SECRET={TEST_SECRET}", LEASEQ),
            # Open: the namespace is this test's own network, reached by nothing else.
            extra_args=("--host", network.standby.peer, "--insecure"),
        )
        base = f"http://{network.standby.peer}:{port}"
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if (await client.get("/readyz")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert service.proc.poll() is None and time.monotonic() < deadline, service.log()
                await asyncio.sleep(0.1)
            for name in ("load", "held"):
                assert (await client.post("/v1/queues", json={"name": name})).status_code == 201
            assert (await client.post("/v1/queues/held/messages",
                                      json={"body": "held"})).status_code == 201
            got = await client.get("/v1/queues/held/receive",
                                   params={"max": 1, "visibility_timeout": 300})
            (held,) = got.json()["messages"]

            load = Load()
            # A request whose statement hung would meet this client's timeout:
            # a TransportError, recorded as a wrong answer.
            clients = [httpx.AsyncClient(base_url=base, timeout=30) for _ in range(SENDERS)]
            tasks = [asyncio.create_task(_sender(c, load)) for c in clients]
            try:
                await asyncio.sleep(1.5)
                vanished_at = time.monotonic()
                network.vanish(network.primary)
                pg.kill_primary()  # its sockets close, but nothing reaches the service
                await asyncio.to_thread(pg.promote)
                promoted_at = time.monotonic()
                recovered_at = await until_sent_after(load, promoted_at, 60, service)
                await asyncio.sleep(1.5)
            finally:
                await stop_load(load, tasks, clients, service)
            tail = [status for t, _, status in load.answers if t > recovered_at + 0.5]
            assert tail and set(tail) == {201}, tail[-20:]

            # The claim made before still holds, and LISTEN is back on the new primary.
            deleted = await client.delete(f"/v1/queues/held/messages/{held['receipt_handle']}")
            assert deleted.status_code == 204, deleted.text
            await _until_listening(client, service)

        lost, _ = await lost_sends(pg.node_url(pg.standby), load)
        slowest = max((t for t, _, s in load.answers if vanished_at <= t <= recovered_at),
                      default=vanished_at) - vanished_at
        print(
            f"\nvanished primary: sent {len(load.acknowledged) + len(load.unavailable)}, "
            f"acknowledged {len(load.acknowledged)}, lost {len(lost)}, answered 503 "
            f"{len(load.unavailable)}; vanish to first send on the new primary "
            f"{recovered_at - vanished_at:.2f} s (promotion took "
            f"{promoted_at - vanished_at:.2f} s; dead peer after {DEAD_PEER_SECONDS} s, "
            f"connect timeout {CONNECT_TIMEOUT} s a host); last answer of the outage "
            f"{slowest:.2f} s after the vanish"
        )
        assert not lost, lost[:10]
