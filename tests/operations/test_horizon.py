"""Operators see the cleanup horizon before it hurts (issue 44): a real session
holding a snapshot (`BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1`) shows in
/metrics with its pid and application name and leaves when it ends, the process
holding the maintenance lock names it in one warning line, and the xid clock and
the holder's description hold to what PostgreSQL counts. `leaseq doctor`'s check
is in test_doctor.py."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from conftest import AppClient
from prometheus_client.parser import text_string_to_metric_families
from support import eventually, make_queue, send, wait_until

from app.db.engine import plain_url
from app.doctor.sql import Q as DOCTOR
from app.queue.horizon import Holder, XidClock, reading_of
from app.queue.rows import HorizonRow
from app.queue.sql import Q as QUEUE

HOLDER_APP = "horizon-test-holder"
ADMIN = "LQBOOTSTRAPADMIN0001.admin-secret-0123456789abcdefghij"
WARN = 0.5
"""LEASEQ_HORIZON_WARN_SECONDS in these tests: a holder is named past it."""


async def _hold(database_url: str) -> asyncpg.Connection:
    """A session holding a snapshot: its xmin is the horizon until it ends."""
    conn = await asyncpg.connect(plain_url(database_url),
                                 server_settings={"application_name": HOLDER_APP})
    await conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    await conn.fetchval("SELECT 1")
    return conn


def _horizon(text: str) -> tuple[float, float, list[dict[str, str]]]:
    """/metrics' horizon: its age in seconds and in transactions, and the holders named."""
    samples = {family.name: family.samples for family in text_string_to_metric_families(text)}
    (seconds,) = samples["leaseq_database_horizon_age_seconds"]
    (transactions,) = samples["leaseq_database_horizon_age_transactions"]
    named = [s.labels for s in samples["leaseq_database_horizon_holder_info"]]
    return seconds.value, transactions.value, named


async def _held_for(conn: asyncpg.Connection, pid: int) -> float:
    """How long `pid`'s transaction has been open, on the database's clock."""
    return float(await conn.fetchval(
        "SELECT extract(epoch FROM clock_timestamp() - xact_start) FROM pg_stat_activity "
        "WHERE pid = $1", pid))


async def test_the_gauge_names_a_held_snapshot_and_drops_back_when_it_ends(
    app_factory: AppClient, db: asyncpg.Connection, database_url: str,
) -> None:
    client = await app_factory(horizon_warn_seconds=WARN)
    await make_queue(client, "work")
    _, _, named = _horizon((await client.get("/metrics")).text)
    assert named == []
    holder = await _hold(database_url)
    pid = holder.get_server_pid()
    last: dict[str, Any] = {}
    try:
        async def holder_named() -> bool:
            # Sends begin and end transactions past the snapshot: rows it keeps.
            await send(client, "work")
            last["metrics"] = _horizon((await client.get("/metrics")).text)
            return [labels["pid"] for labels in last["metrics"][2]] == [str(pid)]

        await eventually(holder_named, seconds=30)
        seconds, transactions, (labels,) = last["metrics"]
        assert labels["kind"] == "backend"
        assert labels["holder"].startswith(f"pid {pid} (application {HOLDER_APP}, user ")
        assert WARN <= seconds <= await _held_for(db, pid)
        assert transactions >= 1
    finally:
        await holder.close()

    async def dropped_back() -> bool:
        seconds, _, named = _horizon((await client.get("/metrics")).text)
        return named == [] and seconds < WARN

    await eventually(dropped_back, seconds=30)


async def test_only_keys_reading_every_queue_see_who_holds_it(
    app_factory: AppClient, database_url: str,
) -> None:
    client = await app_factory(horizon_warn_seconds=WARN, admin_key=ADMIN)
    client.headers["Authorization"] = f"Bearer {ADMIN}"
    scoped = await client.post("/v1/keys", json={"name": "one", "scopes": ["read:work"]})
    assert scoped.status_code == 201, scoped.text
    await make_queue(client, "work")
    holder = await _hold(database_url)
    try:
        async def named() -> bool:
            await send(client, "work")
            return [s["pid"] for s in _horizon((await client.get("/metrics")).text)[2]] == [
                str(holder.get_server_pid())]

        await eventually(named, seconds=30)
        as_scoped = await client.get(
            "/metrics", headers={"Authorization": f"Bearer {scoped.json()['token']}"})
        assert as_scoped.status_code == 200
        seconds, _, holders = _horizon(as_scoped.text)
        assert holders == [] and seconds >= WARN
    finally:
        await holder.close()


async def test_the_lock_holder_warns_once_naming_the_holder(
    app_factory: AppClient, database_url: str, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="leaseq.horizon")
    clients = [await app_factory(horizon_warn_seconds=WARN, vacuum_check_seconds=0.05)
               for _ in range(2)]
    locks = [c.app.state.maintenance.lock for c in clients]  # type: ignore[attr-defined]
    await wait_until(lambda: any(lock.held for lock in locks), seconds=20)
    (lead,) = [c.app.state.horizon_watch for c, lock in zip(clients, locks, strict=True)  # type: ignore[attr-defined]
               if lock.held]
    (other,) = [c.app.state.horizon_watch for c, lock in zip(clients, locks, strict=True)  # type: ignore[attr-defined]
                if not lock.held]
    await make_queue(clients[0], "work")
    holder = await _hold(database_url)
    pid = holder.get_server_pid()

    def lines() -> list[logging.LogRecord]:
        return [r for r in caplog.records
                if r.name == "leaseq.horizon" and getattr(r, "holder_pid", None) == pid]

    try:
        async def warned() -> bool:
            await send(clients[0], "work")
            return bool(lines())

        await eventually(warned, seconds=30)
        checks = lead.checks
        await wait_until(lambda: lead.checks >= checks + 10, seconds=20)
        (line,) = lines()
        assert other.checks == 0, "only the process holding the maintenance lock checks"
    finally:
        await holder.close()
    assert line.levelno == logging.WARNING
    message = line.getMessage()
    assert f"by pid {pid} (application {HOLDER_APP}, user " in message
    assert ", idle in transaction, transaction open since " in message
    assert 'query "SELECT 1". No VACUUM' in message
    assert f"SELECT pg_terminate_backend({pid})" in message
    assert "idle_in_transaction_session_timeout" in message
    assert vars(line)["holder_application_name"] == HOLDER_APP
    assert vars(line)["holder_kind"] == "backend"
    assert vars(line)["horizon_age_seconds"] >= WARN


async def test_prepared_transactions_hold_it_too(
    app_factory: AppClient, db: asyncpg.Connection, database_url: str,
) -> None:
    if int(await db.fetchval("SHOW max_prepared_transactions")) == 0:
        pytest.skip("the server allows no prepared transaction (max_prepared_transactions)")
    client = await app_factory(horizon_warn_seconds=WARN)
    await make_queue(client, "work")
    gid = f"horizon-test-{plain_url(database_url)[-12:]}"
    await db.execute(f"BEGIN; SELECT pg_current_xact_id(); PREPARE TRANSACTION '{gid}'")
    try:
        async def named() -> bool:
            await send(client, "work")
            return [s["kind"] for s in _horizon((await client.get("/metrics")).text)[2]] == [
                "prepared"]

        await eventually(named, seconds=30)
        (labels,) = _horizon((await client.get("/metrics")).text)[2]
        assert labels["holder"].startswith(f"prepared transaction '{gid}'")
    finally:
        await db.execute(f"ROLLBACK PREPARED '{gid}'")


async def _expected_horizon(db: asyncpg.Connection) -> tuple[int, set[int | None]]:
    """The oldest xmin's age by PostgreSQL's rules for this database's tables, read
    from the raw views in the caller's transaction (pg_stat_activity holds still
    within one): the age, and who may hold it (pids; None for a slot or a
    prepared transaction)."""
    ours = await db.fetchval("SELECT current_database()")
    held: dict[int | None, int] = {}
    for r in await db.fetch(
        "SELECT pid, datid, datname, backend_type, state, query, age(backend_xid) AS xid, "
        "age(backend_xmin) AS xmin FROM pg_stat_activity WHERE pid <> pg_backend_pid()"
    ):
        lazy_vacuum = (r["state"] == "active" and (r["query"] or "").lstrip().lower()
                       .startswith("vacuum") and "full" not in r["query"].lower())
        if r["backend_type"] == "autovacuum worker" or lazy_vacuum or (
                r["backend_type"] == "walsender" and r["datid"] is not None):
            continue
        xmin = r["xmin"] if r["datname"] == ours or r["datid"] is None else None
        ages = [a for a in (r["xid"], xmin) if a is not None]
        if ages:
            held[r["pid"]] = max(ages)
    for age in await db.fetch(
            "SELECT age(xmin) FROM pg_replication_slots WHERE xmin IS NOT NULL "
            "UNION ALL SELECT age(transaction) FROM pg_prepared_xacts"):
        held[None] = max(held.get(None, 0), age[0])
    oldest = max(held.values(), default=0)
    return oldest, {pid for pid, age in held.items() if age == oldest}


async def test_the_statement_counts_what_holds_this_databases_tables(
    db: asyncpg.Connection, server_url: str,
) -> None:
    """A snapshot in another database keeps nothing of this one's tables (since
    PostgreSQL 14); a transaction that wrote, in any database, does: the statement
    agrees with PostgreSQL's rules applied to the views it reads, in one snapshot
    of them, while another database holds both."""
    if int(await db.fetchval("SHOW server_version_num")) < 140000:
        pytest.skip("before PostgreSQL 14 every database's snapshots count")
    snapshot, writer = [await asyncpg.connect(plain_url(server_url),
                                              server_settings={"application_name": HOLDER_APP})
                        for _ in range(2)]
    try:
        await snapshot.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await snapshot.fetchval("SELECT 1")
        await db.execute("SELECT pg_current_xact_id()")  # IDs past its snapshot
        await writer.execute("BEGIN")
        await writer.fetchval("SELECT pg_current_xact_id()::text")
        await db.execute("SELECT pg_current_xact_id()")
        async with db.transaction(isolation="repeatable_read"):
            age, holders = await _expected_horizon(db)
            row = await db.fetchrow(QUEUE.database_horizon.sql)
        assert row is not None and row["xid_age"] == age and age >= 1
        assert (row["pid"] if row["kind"] == "backend" else None) in holders
        assert row["pid"] != snapshot.get_server_pid()
        own = await db.fetchval("SELECT age(backend_xid) FROM pg_stat_activity "
                                "WHERE pid = $1", writer.get_server_pid())
        assert row["xid_age"] >= own >= 1
    finally:
        await snapshot.close()
        await writer.close()


def test_the_doctor_reads_the_engines_statement_word_for_word() -> None:
    def sql(text: str) -> list[str]:
        return [line for line in text.splitlines() if not line.startswith("--")]

    assert sql(DOCTOR.horizon_holder.text) == sql(QUEUE.database_horizon.text)


# -- the xid clock and the holder's description, on rows as the statement answers ----

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def _row(**columns: Any) -> HorizonRow:
    row: dict[str, Any] = dict.fromkeys(HorizonRow.__annotations__)
    row.update(now=NOW, next_xid=1000, kind="backend", xid_age=0)
    row.update(columns)
    return row  # type: ignore[return-value]


def test_a_held_id_is_timed_from_the_last_reading_that_saw_it_not_yet_ended() -> None:
    clock = XidClock()
    clock.saw(NOW.timestamp() - 100, 900)
    clock.saw(NOW.timestamp() - 60, 950)
    clock.saw(NOW.timestamp() - 30, 990)
    assert clock.held_at_most(960, NOW.timestamp()) == 60
    assert clock.held_at_most(950, NOW.timestamp()) == 60
    assert clock.held_at_most(899, NOW.timestamp()) is None
    # An hour-old READ COMMITTED transaction whose snapshot is its current
    # statement's: the clock's bound, not the transaction's start.
    reading = reading_of(_row(xid_age=40, since=NOW - timedelta(hours=1)), clock)
    assert reading.seconds == 60 and reading.timed and reading.transactions == 40
    # A snapshot open for 10 s, older than the last reading to see its ID unended.
    assert reading_of(_row(xid_age=40, since=NOW - timedelta(seconds=10)),
                      clock).seconds == 10
    # Its ID not ended yet: nothing held.
    assert reading_of(_row(xid_age=0, since=NOW - timedelta(hours=1)), clock).seconds == 0


def test_an_untimed_holder_older_than_every_reading_is_at_least_as_old_as_they() -> None:
    clock = XidClock()
    clock.saw(NOW.timestamp() - 300, 990)
    reading = reading_of(_row(kind="slot", xid_age=500, slot_name="standby",
                              slot_type="physical"), clock)
    assert reading.seconds == 300 and not reading.timed
    assert reading.holder is not None
    assert reading.holder.name == "replication slot standby (physical, unused)"


def test_the_clock_stays_bounded_and_only_widens_its_bounds() -> None:
    clock = XidClock(limit=16)
    for n in range(100):
        clock.saw(float(n), 10 * n)
    assert len(clock._xids) <= 17 and clock._xids[0] == 0 and clock._xids[-1] == 990
    bound = clock.held_at_most(505, 100.0)
    assert bound is not None and bound >= 100.0 - 50
    clock.saw(50.0, 500)  # a reading that finished late changes nothing
    assert clock._xids[-1] == 990
    clock.saw(200.0, 5)  # numbered afresh: a restored server
    assert clock._xids == [5]


@pytest.mark.parametrize(("columns", "name", "how"), [
    (dict(kind="prepared", gid="it's", username="alice", database="shop"),
     "prepared transaction 'it''s' (owner alice, database shop)",
     "ROLLBACK PREPARED 'it''s' (or COMMIT PREPARED) in database shop"),
    (dict(kind="slot", slot_name="cdc", slot_type="logical", database="shop", pid=77),
     "replication slot cdc (logical, database shop, in use by pid 77)",
     "SELECT pg_drop_replication_slot('cdc')"),
    (dict(pid=9, backend_type="walsender", username="repl", client_addr="10.0.0.2"),
     "pid 9 (walsender: a standby's hot_standby_feedback, user repl, client 10.0.0.2)",
     "hot_standby_feedback = off"),
    (dict(pid=12, application_name="pg_dump", username="ops", state="active",
          backend_type="client backend", database="shop"),
     "pid 12 (application pg_dump, user ops, database shop)",
     "pg_dump holds it until the dump ends"),
])
def test_each_kind_of_holder_is_named_with_how_to_end_it(
    columns: dict[str, Any], name: str, how: str,
) -> None:
    holder = Holder(_row(**columns))
    assert holder.name == name
    assert how in holder.how_to_end()


def test_a_query_is_quoted_on_one_bounded_line() -> None:
    holder = Holder(_row(pid=5, state="active", backend_type="client backend",
                         since=NOW, query="SELECT 1\n\tFROM t WHERE x = '\x1b[31m'" + "x" * 500))
    described = holder.describe()
    assert "\n" not in described and "\x1b" not in described and "\\x1b" in described
    assert described.endswith('..."') and len(described) < 300
