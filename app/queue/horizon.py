"""Who holds PostgreSQL's cleanup horizon back, and for how long.

While a snapshot or a transaction ID is old -- a forgotten BEGIN in psql, pg_dump,
an analytics query, a standby's hot_standby_feedback, a replication slot, a
prepared transaction -- no VACUUM may remove a row version deleted after it, and
every claim that walks the messages with SKIP LOCKED steps over the dead versions
of every message settled since (docs/operating.md, "LeaseqDatabaseHorizonHeld").
The `database_horizon` statement finds the oldest holder; `Horizon` times it and
names it, for /metrics (app/api/horizon_gauges.py) and `leaseq doctor`; and
`HorizonWatch`, in the process holding the maintenance lock, warns in the log
once the horizon is older than LEASEQ_HORIZON_WARN_SECONDS, at most once a minute
per holder.

PostgreSQL numbers transactions; it does not time them. A holder's age in seconds
is the tighter of two bounds from above:

* its own time, where it has one: a backend's transaction start, a prepared
  transaction's PREPARE;
* the xid clock (`XidClock`): every reading records the first transaction ID
  not yet ended, and a holder keeps nothing from before the last reading at
  which its xmin had not ended. This keeps a READ COMMITTED transaction open for
  an hour, whose snapshot is only its current statement's, from reading an hour,
  and a snapshot taken while nothing writes from counting time in which there was
  nothing to keep.

A replication slot or a standby's feedback has no time of its own, nor has another
role's session unless leaseq's role may read its times (pg_read_all_stats): their
age is the clock's, and for an xmin older than this process's first reading, the
time since that reading, a bound from below that grows until the holder moves on
(`HorizonReading.timed` is False then).
"""

from __future__ import annotations

import bisect
import logging
import re
import time
from dataclasses import dataclass

from app.db.connector import Connector
from app.db.fleet import FleetLock
from app.queue.periodic import every
from app.queue.rows import HorizonRow
from app.queue.sql import Q

_log = logging.getLogger("leaseq.horizon")

WARN_EVERY_SECONDS = 60.0
"""The warning names one holder at most this often."""
QUERY_SHOWN = 120
"""How much of a holder's query the warning quotes (it may carry data)."""
CLOCK_READINGS = 4096
"""Readings the xid clock keeps; past them every other one is dropped, which only
widens its bounds, so it covers a process's whole life in bounded memory."""

_UNSAFE = re.compile(r"[^\x20-\x7e]|\\")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code == 0x5C:
        return "\\\\"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _shown(value: str, limit: int = 200) -> str:
    """A value of the database's (a query, a gid, an application name) on one
    bounded line: whitespace runs as one space, control characters, non-ASCII and
    the backslash escaped, cut to `limit` with `...`."""
    value = _UNSAFE.sub(_escaped, " ".join(value.split()))
    return value if len(value) <= limit else value[: limit - 3] + "..."


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


class XidClock:
    """The first transaction ID not yet ended at each of this process's readings,
    on the database's clock: when an ID can at most have begun to hold anything."""

    def __init__(self, limit: int = CLOCK_READINGS) -> None:
        self._times: list[float] = []
        self._xids: list[int] = []
        self._limit = limit

    def saw(self, at: float, xid: int) -> None:
        if self._xids:
            if xid < self._xids[-1]:
                if at < self._times[-1]:
                    return  # a reading that finished after a later one
                # Numbered afresh (a server restored from a backup): start over.
                self._times.clear()
                self._xids.clear()
            else:
                at = max(at, self._times[-1])
                if xid == self._xids[-1]:
                    self._times[-1] = at
                    return
        self._times.append(at)
        self._xids.append(xid)
        if len(self._xids) > self._limit:
            self._times = [*self._times[:-1:2], self._times[-1]]
            self._xids = [*self._xids[:-1:2], self._xids[-1]]

    def held_at_most(self, xid: int, now: float) -> float | None:
        """Seconds for which `xid` can have held anything back, at most: since the
        last reading at which it had not ended. None: ended before every reading."""
        seen = bisect.bisect_right(self._xids, xid)
        return None if seen == 0 else max(0.0, now - self._times[seen - 1])

    def since_first(self, now: float) -> float:
        return max(0.0, now - self._times[0]) if self._times else 0.0


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds the horizon: a backend, a replication slot or a prepared transaction."""

    row: HorizonRow

    @property
    def kind(self) -> str:
        return self.row["kind"] or "backend"

    @property
    def pid(self) -> int | None:
        return self.row["pid"]

    @property
    def key(self) -> tuple[str, str]:
        """Who it is, for the once-a-minute warning."""
        row = self.row
        if self.kind == "slot":
            return ("slot", row["slot_name"] or "")
        if self.kind == "prepared":
            return ("prepared", row["gid"] or "")
        return ("backend", str(row["pid"]))

    @property
    def name(self) -> str:
        """One bounded line naming it (the `holder` label of /metrics): never its query."""
        row = self.row
        if self.kind == "slot":
            use = (f"in use by pid {row['pid']}" if row["pid"] is not None else "unused")
            where = f", database {_shown(row['database'])}" if row["database"] else ""
            return (f"replication slot {_shown(row['slot_name'] or '')} "
                    f"({row['slot_type'] or 'unknown'}{where}, {use})")
        if self.kind == "prepared":
            return (f"prepared transaction {_literal(_shown(row['gid'] or ''))} (owner "
                    f"{_shown(row['username'] or '?')}, database {_shown(row['database'] or '?')})")
        parts = []
        if row["backend_type"] == "walsender":
            parts.append("walsender: a standby's hot_standby_feedback")
        if row["application_name"]:
            parts.append(f"application {_shown(row['application_name'], 64)}")
        if row["username"]:
            parts.append(f"user {_shown(row['username'], 64)}")
        if row["client_addr"]:
            parts.append(f"client {row['client_addr']}")
        if row["database"]:
            parts.append(f"database {_shown(row['database'], 64)}")
        return f"pid {row['pid']}" + (f" ({', '.join(parts)})" if parts else "")

    def describe(self) -> str:
        """Its name, and for a backend its state, transaction start and query."""
        row = self.row
        if self.kind == "prepared" and row["since"] is not None:
            return f"{self.name}, prepared at {row['since'].isoformat()}"
        if self.kind != "backend":
            return self.name
        if row["backend_type"] is None and row["since"] is None:
            return (f"{self.name}, another role's session: leaseq's role may not see its "
                    "state or query (grant it pg_read_all_stats)")
        state = row["state"] or "state unknown"
        since = f", transaction open since {row['since'].isoformat()}" if row["since"] else ""
        query = f', query "{_shown(row["query"], QUERY_SHOWN)}"' if row["query"] else ""
        return f"{self.name}, {state}{since}{query}"

    def how_to_end(self) -> str:
        """What ends its hold, as an operator would run it."""
        row = self.row
        if self.kind == "slot":
            name = _literal(row["slot_name"] or "")
            return (f"if the slot's consumer is gone, SELECT pg_drop_replication_slot({name}); "
                    "else let it catch up (a standby: end its long query, or turn its "
                    "hot_standby_feedback off)")
        if self.kind == "prepared":
            return (f"ROLLBACK PREPARED {_literal(row['gid'] or '')} (or COMMIT PREPARED) "
                    f"in database {row['database'] or '?'}")
        if row["backend_type"] == "walsender":
            return ("end the long query on the standby, or set hot_standby_feedback = off "
                    "there (its queries may then be cancelled instead)")
        advice = f"SELECT pg_terminate_backend({row['pid']})"
        if row["state"] in ("idle in transaction", "idle in transaction (aborted)"):
            advice += ("; idle_in_transaction_session_timeout ends such sessions by "
                       "themselves")
        if row["application_name"] == "pg_dump":
            advice += "; pg_dump holds it until the dump ends"
        return advice


@dataclass(frozen=True, slots=True)
class HorizonReading:
    seconds: float
    """How long the oldest holder has held the horizon back (0: nothing holds it)."""
    transactions: int
    """The same in transaction IDs: how many transactions began since its xmin."""
    holder: Holder | None
    timed: bool = True
    """False: `seconds` is a bound from below only (an untimed holder older than
    every reading of this process)."""


def reading_of(row: HorizonRow, clock: XidClock) -> HorizonReading:
    """A `database_horizon` row timed: `clock` records it, then bounds its holder."""
    now = row["now"].timestamp()
    clock.saw(now, row["next_xid"])
    age = row["xid_age"]
    if row["kind"] is None or age is None:
        return HorizonReading(0.0, 0, None)
    bounds = [bound for bound in (
        None if row["since"] is None else max(0.0, now - row["since"].timestamp()),
        clock.held_at_most(row["next_xid"] - age, now),
    ) if bound is not None]
    if bounds:
        return HorizonReading(min(bounds), age, Holder(row))
    return HorizonReading(clock.since_first(now), age, Holder(row), timed=False)


class Horizon:
    """This process's view of the database's cleanup horizon: readings timed by one
    xid clock, whoever asks (the gauges, the watch)."""

    def __init__(self, db: Connector, *, warn_seconds: float) -> None:
        self._db = db
        self.warn_seconds = warn_seconds
        self.clock = XidClock()

    async def read(self) -> HorizonReading:
        (row,) = await self._db.fetch(Q.database_horizon)
        return reading_of(row, self.clock)

    def named(self, reading: HorizonReading) -> Holder | None:
        """The holder worth naming: one that has held the horizon at least
        LEASEQ_HORIZON_WARN_SECONDS. Younger ones come and go with every
        transaction (leaseq's own among them) and would only churn series."""
        return reading.holder if reading.seconds >= self.warn_seconds else None


class HorizonWatch:
    """The warning line naming the holder, from the process holding the
    maintenance lock, at most once a minute per holder."""

    def __init__(self, horizon: Horizon) -> None:
        self._horizon = horizon
        self._warned: dict[tuple[str, str], float] = {}
        self.checks = 0
        """Rounds done (for tests)."""

    async def check(self) -> HorizonReading:
        reading = await self._horizon.read()
        self.checks += 1
        holder = self._horizon.named(reading)
        now = time.monotonic()
        self._warned = {k: t for k, t in self._warned.items() if now - t < WARN_EVERY_SECONDS}
        if holder is None or holder.key in self._warned:
            return reading
        self._warned[holder.key] = now
        row = holder.row
        at_least = "" if reading.timed else "at least "
        _log.warning(
            "PostgreSQL's cleanup horizon held back for %s%.0f s (%d transactions) by %s. "
            "No VACUUM removes a row version deleted since, and claims step over them; "
            "to end it: %s (docs/operating.md, \"LeaseqDatabaseHorizonHeld\")",
            at_least, reading.seconds, reading.transactions, holder.describe(),
            holder.how_to_end(),
            extra={
                "horizon_age_seconds": round(reading.seconds, 3),
                "horizon_age_transactions": reading.transactions,
                "holder_kind": holder.kind, "holder": holder.name, "holder_pid": row["pid"],
                "holder_application_name": row["application_name"],
                "holder_user": row["username"], "holder_client_addr": row["client_addr"],
                "holder_state": row["state"],
                "holder_since": None if row["since"] is None else row["since"].isoformat(),
                "holder_query": None if row["query"] is None else _shown(row["query"],
                                                                         QUERY_SHOWN),
                "holder_slot": row["slot_name"], "holder_gid": row["gid"],
            },
        )
        return reading

    async def forever(self, interval: float, only_while: FleetLock | None = None) -> None:
        """A check every `interval` seconds (while this process holds `only_while`)."""
        await every(interval, self.check, what="horizon check", only_while=only_while)
