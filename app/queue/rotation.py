"""The rotation of the messages' generations: what is left of the live generation
moved into another, the old one emptied by TRUNCATE, which frees its storage
whatever the cleanup horizon (docs/decisions.md, "History costs nothing").

Run by the process holding the maintenance lock, one step a second; each step
reads where the rotation stands from the database, so a step cut short (the
process killed, the database restarted) is taken up by the next, in whichever
process holds the lock then.

1. Due: the live generation has left behind ROTATE_AFTER row versions that no
   VACUUM may remove yet, settled since the oldest transaction the cleanup
   horizon keeps (`held_since`; doubled for each generation waiting to be
   emptied past PINNED_BEFORE_DOUBLING), and at least four times what it holds.
   While nothing holds the horizon, VACUUM keeps the history short and nothing
   rotates: moving a large backlog costs the cycle for nothing then. A spare
   (empty) generation becomes live, or a new one is made
   (a pg_dump may hold the others: it locks every table it dumps until it
   ends). A new epoch names it live and the old one draining; sends go into
   the new one, everything else reads through the parent (app/queue/generations.py).
2. Drain: once no process acts by an older epoch (app/db/epochs.py) and no
   transaction begun before the rotation still holds a write lock on the old
   generation (a send of the SQL API inside its caller's transaction), nothing
   can write a new row into it; its messages are moved in batches, each whole,
   and when it holds none a new epoch names the live generation alone.
3. Empty: the drained generation is locked NOWAIT (a reader holding it, a
   pg_dump, makes the try fail at once and it is tried again later; the cycle
   never waits behind it), a message found in it all the same is moved, and it
   is truncated and becomes a spare.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from app.db.connector import Connector, DatabaseError
from app.db.fleet import FleetLock
from app.db.migrate import LOCK_NOT_AVAILABLE
from app.db.queries import Query
from app.queue.generations import EPOCH_LOCKS, table
from app.queue.periodic import every
from app.queue.rows import RotationRow
from app.queue.sql import Q

_log = logging.getLogger("leaseq.rotation")

ROTATE_AFTER = 300_000
"""Row versions the live generation leaves behind before it rotates (settings)."""
STANDING_RATIO = 4
"""...and at least this many times the messages it holds, so that moving them
is a bounded share of the work the rotation saves."""
MAX_GENERATIONS = 32
PINNED_BEFORE_DOUBLING = 8
"""While a pg_dump holds the drained generations, each rotation makes a new one;
past this many waiting to be emptied, the threshold doubles with each, so that a
long dump does not make one generation a minute (a statement through the parent
plans every generation)."""
BATCH = 200
"""Messages moved by one statement: what waits for them waits that long."""
DRAIN_SECONDS = 5.0
"""How long one step moves messages before it lets the next step go on."""
WARN_AFTER = 30.0
READINGS = 4096
"""Readings of the live generation's settled history kept (one a step): past
them the oldest go, and history older than the rest counts as held."""


def on(query: Query[Any], generation: int) -> Query[Any]:
    """A statement of the rotation naming `generation` (queries.sql: messages_g0)."""
    return query.renamed(query.text.replace("leaseq.messages_g0", table(generation)))


class Rotation:
    def __init__(self, db: Connector, *, rotate_after: int = ROTATE_AFTER) -> None:
        self._db = db
        self._rotate_after = rotate_after
        self._waiting_since: float | None = None
        self._readings: deque[tuple[int, int]] = deque(maxlen=READINGS)
        self._readings_of: int | None = None

    async def forever(self, seconds: float, *, only_while: FleetLock) -> None:
        await every(seconds, self.step, what="generation rotation", only_while=only_while)

    async def step(self) -> None:
        """One step of the rotation, wherever it stands."""
        state = await self._state()
        self._read(state)
        if state["draining"] is not None:
            await self._drain(state)
            return
        if state["published"] != state["live"]:
            await self._republish(state)
        for generation in state["used"]:
            await self.empty(generation, state["live"])
        if await self._due(state):
            await self.start(state)

    async def _state(self) -> RotationRow:
        (state,) = await self._db.fetch(Q.rotation_state)
        return state

    def _read(self, state: RotationRow) -> None:
        """A reading of how much the live generation had settled by which
        transaction ID; a new live generation, or statistics reset, starts anew."""
        settled = state["settled"] or 0
        if (state["live"] != self._readings_of
                or (self._readings and settled < self._readings[-1][1])):
            self._readings.clear()
            self._readings_of = state["live"]
        self._readings.append((state["next_xid"], settled))

    async def _due(self, state: RotationRow) -> bool:
        if self._rotate_after <= 0:
            return False
        needed: int = self._rotate_after * 2 ** max(0, len(state["used"]) - PINNED_BEFORE_DOUBLING)
        needed = max(needed, STANDING_RATIO * (state["standing"] or 0))
        settled = state["settled"] or 0
        if settled < needed:
            return False
        (horizon,) = await self._db.fetch(Q.database_horizon)
        kept_from: int = horizon["next_xid"] - (horizon["xid_age"] or 0)
        return held_since(self._readings, settled, kept_from) >= needed

    async def start(self, state: RotationRow | None = None) -> bool:
        """A rotation begun (step 1), if one can be: whether it was."""
        state = state or await self._state()
        if state["draining"] is not None:
            return False
        if state["spares"]:
            target = state["spares"][0]
        elif state["top"] + 1 < MAX_GENERATIONS:
            target = state["top"] + 1
            if not await self._make(target):
                return False
        else:
            _log.warning("no generation to rotate into: %d generations wait to be "
                         "emptied (a transaction holds them)", len(state["used"]))
            return False
        rows = await self._db.fetch(Q.start_rotation, {
            "epoch": state["epoch"], "live": state["live"], "target": target,
        })
        if rows:
            _log.info("rotation: generation %d live, %d draining (epoch %d)",
                      target, state["live"], rows[0]["epoch"])
        return bool(rows)

    async def _make(self, generation: int) -> bool:
        made = await self._brief(Q.make_generation, {"generation": generation})
        if made:
            _log.info("rotation: generation %d made", generation)
        return made

    async def _republish(self, state: RotationRow) -> None:
        # A rotation cut short after its sequence moved and before its row did:
        # the SQL API may have sent into the generation the sequence named. It
        # is emptied (its messages moved into the live one) like a drained one.
        await self._db.fetch(Q.publish_live, {"live": state["live"]})
        stray = state["published"]
        if stray in state["spares"]:
            await self.empty(stray, state["live"], force=True)

    async def _drain(self, state: RotationRow) -> None:
        draining = state["draining"]
        assert draining is not None
        held = await self._fetchrow(
            Q.epochs_held_below, {"space": EPOCH_LOCKS, "epoch": state["epoch"]}
        )
        holders = held["holders"] if held else 0
        if holders:
            self._waiting("%d process(es) still act by an earlier epoch", holders)
            return
        writer = await self._fetchrow(Q.old_writers, {
            "generation_table": table(draining), "since": state["since"],
        })
        if writer is not None:
            self._waiting("pid %s (%s, in a transaction since %s) may have written into "
                          "generation %d", writer["pid"], writer["who"],
                          writer["xact_start"], draining)
            return
        self._waiting_since = None
        if await self.move(draining, state["live"]):
            rows = await self._db.fetch(
                Q.finish_drain, {"epoch": state["epoch"], "draining": draining}
            )
            if rows:
                _log.info("rotation: generation %d drained (epoch %d)", draining,
                          rows[0]["epoch"])
                await self._brief(on(Q.pause_autovacuum, draining))

    async def move(self, draining: int, live: int) -> bool:
        """Moves `draining`'s messages into `live` for at most DRAIN_SECONDS;
        whether it holds none left."""
        drained = on(Q.drained, draining)
        deadline = time.monotonic() + DRAIN_SECONDS
        while time.monotonic() < deadline:
            # A pass leaves rows locked meanwhile, or below the last id moved.
            await _moved(self._db.fetch, draining, live, until=deadline)
            if (await self._fetchrow(drained, {}))["drained"]:
                return True
        return False

    async def empty(self, generation: int, live: int, *, force: bool = False) -> bool:
        """Step 3 for a drained generation: whether it was emptied."""
        try:
            async with self._db.transaction() as tx:
                await tx.execute(Q.lock_briefly)
                await tx.execute(on(Q.lock_generation, generation))
                # Nothing can write into it while it is locked: one pass moves all.
                await _moved(tx.fetch, generation, live)
                await tx.execute(on(Q.truncate_generation, generation))
                await tx.execute(on(Q.resume_autovacuum, generation))
                if not force:
                    await tx.execute(Q.spare_generation, {"generation": generation})
        except DatabaseError as exc:
            if exc.sqlstate != LOCK_NOT_AVAILABLE:
                raise
            return False
        _log.info("rotation: generation %d emptied", generation)
        return True

    async def _brief(self, query: Query[Any], params: dict[str, Any] | None = None) -> bool:
        """A catalog change that waits at most a fifth of a second for its locks:
        whether it was made (else it is tried again at a later step)."""
        try:
            async with self._db.transaction() as tx:
                await tx.execute(Q.lock_briefly)
                await tx.execute(query, params or {})
        except DatabaseError as exc:
            if exc.sqlstate != LOCK_NOT_AVAILABLE:
                raise
            return False
        return True

    async def _fetchrow(self, query: Query[Any], params: dict[str, Any]) -> Any:
        rows = await self._db.fetch(query, params)
        return rows[0] if rows else None

    def _waiting(self, message: str, *args: object) -> None:
        now = time.monotonic()
        if self._waiting_since is None:
            self._waiting_since = now
        elif now - self._waiting_since > WARN_AFTER:
            _log.warning("rotation waits: " + message, *args)
            self._waiting_since = now


def held_since(readings: Iterable[tuple[int, int]], settled: int, kept_from: int) -> int:
    """Of the `settled` row versions, those no VACUUM may remove yet: settled
    after the last reading (next transaction ID, settled by then) whose next ID
    the horizon (`kept_from`, the oldest transaction ID it keeps) has reached:
    every version settled before that reading was deleted by a transaction
    older than the horizon. All of them when the horizon is older than every
    reading (held since before this process read)."""
    removable = 0
    for next_xid, settled_then in readings:
        if next_xid > kept_from:
            break
        removable = settled_then
    return max(settled - removable, 0)


async def _moved(fetch: Callable[..., Awaitable[list[Any]]], draining: int, live: int, *,
                 until: float | None = None) -> None:
    """One pass over `draining` by id, BATCH messages a statement moved into
    `live`, until a statement moves none (or the monotonic time `until`)."""
    move = on(Q.move_messages, draining)
    after = 0
    while until is None or time.monotonic() < until:
        rows = await fetch(move, {"after": after, "batch": BATCH, "draining": draining,
                                  "live": live})
        if not rows or not rows[0]["moved"]:
            return
        after = rows[0]["last"]
