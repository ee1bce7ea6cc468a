"""Which table of the messages each statement names: the generations of the view
this process acts by.

The messages live in generations, partitions of `leaseq.messages` (migrations
0022 and 0023), one of them live. queries.sql names the generation of a statement
on one message or one claim `leaseq.messages_g0`; before it runs, this process
names the table its view says (docs/decisions.md, "History costs nothing"):
- between rotations, the live generation, for every statement: planned against
  one table, a statement costs what it cost before there were generations;
- while a rotation drains a generation into the live one, what is sent goes into
  the live generation and everything else reads and writes through the parent,
  which sees both (a FIFO group's head may still be in the older one);
- with no view (starting, or the epoch's connection lost: app/db/epochs.py),
  everything goes through the parent, whose default puts a row into the live
  generation: right whatever the rotation is doing, a little slower.
What reads a queue whole and seldom names the parent in queries.sql itself.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from app.db.epochs import NO_EPOCH, Epochs
from app.db.queries import Query

R = TypeVar("R")

PARENT = "leaseq.messages"
EPOCH_LOCKS = 0x6C71_6570
"""The first key of the epochs' advisory locks ("lqep"), the epoch the second."""

_NAMED = re.compile(r"(INSERT INTO )?leaseq\.messages_g0\b")


def table(generation: int) -> str:
    return f"leaseq.messages_g{generation}"


@dataclass(frozen=True, slots=True)
class View:
    live: int | None = None
    """None: no view, everything through the parent."""
    draining: int | None = None

    def rename(self, text: str) -> str:
        def one(match: re.Match[str]) -> str:
            insert = match.group(1) or ""
            if self.live is None:
                return insert + PARENT
            if self.draining is None or insert:
                return insert + table(self.live)
            return PARENT

        return _NAMED.sub(one, text)


class Generations:
    """This process's view, and the router that names its tables in each statement
    (app/db/connector.py's Router)."""

    def __init__(self) -> None:
        self.view = View()
        self.epochs: Epochs | None = None
        self._routed: dict[tuple[str, View], Query[Any]] = {}

    def on_view(self, row: Mapping[str, Any] | None) -> None:
        self.view = View() if row is None else View(row["live"], row["draining"])

    def enter(self, query: Query[R]) -> tuple[Query[R], int]:
        ticket = NO_EPOCH if self.epochs is None else self.epochs.enter()
        if query.routed:
            return query, ticket
        key = (query.sql, self.view)
        routed = self._routed.get(key)
        if routed is None:
            text = self.view.rename(query.text)
            routed = self._routed[key] = query if text == query.text else query.renamed(text)
        return routed, ticket

    def leave(self, ticket: int) -> None:
        if self.epochs is not None:
            self.epochs.leave(ticket)
