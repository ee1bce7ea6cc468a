"""Typed rows (app/db/queries.py): every statement's declared row holds the
columns PostgreSQL says the statement answers, by name and by type;
the views the engine reads claimed rows through fit every statement they read;
and a declaration that strays from queries.sql stops the load."""

from __future__ import annotations

import types
import typing
from datetime import datetime
from decimal import Decimal
from typing import Any, TypedDict
from uuid import UUID

import asyncpg
import pytest

from app.auth import rows as auth_rows
from app.auth.sql import Q as AUTH
from app.db.queries import Queries, Query, declare
from app.doctor import rows as doctor_rows
from app.doctor.sql import Q as DOCTOR
from app.queue import rows as queue_rows
from app.queue.sql import Q as QUEUE

PACKAGES: list[tuple[Queries, types.ModuleType]] = [
    (QUEUE, queue_rows), (AUTH, auth_rows), (DOCTOR, doctor_rows),
]

PYTHON_TYPE = {
    "int2": int, "int4": int, "int8": int, "float8": float, "numeric": Decimal,
    "text": str, "varchar": str, "bool": bool, "uuid": UUID, "timestamptz": datetime,
    "bytea": bytes, "void": type(None), "redrive_status": str,
    "int8[]": list[int], "int2[]": list[int], "float8[]": list[float], "text[]": list[str],
}


def _base(hint: Any) -> Any:
    """A declared column's type without its `| None`."""
    if isinstance(hint, types.UnionType):
        kept = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return kept[0] if len(kept) == 1 else hint
    return hint


def _same_type(declared: Any, answered: Any) -> bool:
    declared = _base(declared)
    if typing.get_origin(declared) is list and typing.get_origin(answered) is list:
        return _base(typing.get_args(declared)[0]) is typing.get_args(answered)[0]
    return bool(declared is answered)


async def _columns(db: asyncpg.Connection, query: Query[Any]) -> list[tuple[str, Any]]:
    statement = await db.prepare(query.sql)
    return [(a.name, PYTHON_TYPE[a.type.name]) for a in statement.get_attributes()]


async def test_every_statement_answers_the_columns_of_its_declared_row(
    db: asyncpg.Connection,
) -> None:
    wrong = []
    for queries, rows in PACKAGES:
        for query in queries:
            answered = await _columns(db, query)
            if query.returns is None:
                if answered:
                    wrong.append(f"{query.name}: declares no row, answers {answered}")
                continue
            declared = typing.get_type_hints(getattr(rows, query.returns))
            if sorted(name for name, _ in answered) != sorted(declared):
                wrong.append(f"{query.name}: answers {[n for n, _ in answered]}, "
                             f"{query.returns} lists {list(declared)}")
                continue
            wrong.extend(
                f"{query.name}.{name}: answers {kind}, {query.returns} says {declared[name]}"
                for name, kind in answered if not _same_type(declared[name], kind)
            )
    assert wrong == []


VIEWS = {
    queue_rows.MessageColumns: ["claim_messages", "claim_ready_messages", "claim_fifo_messages",
                                "replay_receive_attempt"],
    queue_rows.ClaimColumns: ["claim_messages", "claim_ready_messages", "claim_fifo_messages"],
}


@pytest.mark.parametrize("view", list(VIEWS), ids=lambda view: view.__name__)
async def test_the_claimed_rows_views_fit_each_statement_read_through_them(
    db: asyncpg.Connection, view: type,
) -> None:
    wanted = typing.get_type_hints(view)
    for name in VIEWS[view]:
        answered = dict(await _columns(db, getattr(QUEUE, name)))
        missing = [column for column in wanted if column not in answered]
        assert missing == [], f"{name} answers no {missing}"
        assert all(_same_type(wanted[c], answered[c]) for c in wanted), name


class _Pair(TypedDict):
    a: int


class _Declared(Queries):
    pair: Query[_Pair]
    nothing: Query[None]


_SOURCE = {"pair": "-- returns: _Pair\nSELECT 1 AS a", "nothing": "SELECT pg_sleep(0)"}


@pytest.mark.unit
def test_declarations_that_match_the_file_load() -> None:
    loaded = declare(_Declared, _SOURCE, "tests")
    assert loaded.pair.returns == "_Pair" and loaded.nothing.returns is None


@pytest.mark.unit
@pytest.mark.parametrize(("source", "says"), [
    ({**_SOURCE, "extra": "SELECT 1"}, "statements without a declaration: .'extra'."),
    ({"pair": _SOURCE["pair"]}, "declarations without a statement: .'nothing'."),
    ({**_SOURCE, "pair": "SELECT 1 AS a"}, "declared as returning _Pair, its header says None"),
    ({**_SOURCE, "nothing": "-- returns: _Pair\nSELECT 1 AS a"},
     "declared as returning None, its header says _Pair"),
])
def test_a_declaration_that_strays_from_the_file_stops_the_load(
    source: dict[str, str], says: str,
) -> None:
    with pytest.raises(TypeError, match=says):
        declare(_Declared, source, "tests")
