"""Send and settle messages inside your own PostgreSQL transaction, on your own
connection: the SQL API of leaseq (`leaseq.send`, `leaseq.delete`, ...; see
docs/transactions.md), called for you.

    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("INSERT INTO orders ...")
        await leaseq.sql.send(conn, "orders", '{"order": 7}')

Each helper runs one statement on the connection it is given, in whatever
transaction is open there, and never begins, commits or rolls back one. It takes:

- an asyncpg `Connection` (or a pool's connection: `async with pool.acquire()`);
- a psycopg 3 `Connection` or `AsyncConnection`;
- a SQLAlchemy `Session`, `AsyncSession`, `Connection` or `AsyncConnection`.

With an async one it returns an awaitable (`await leaseq.sql.delete(conn, ...)`),
with a sync one the result itself. On a connection not in a transaction (asyncpg
outside `conn.transaction()`, psycopg in autocommit) the statement commits on its
own; a psycopg or SQLAlchemy one not in autocommit opens the transaction you then
commit, as any statement would.

Errors of the API are raised from the client's tree (`leaseq.errors`), with the
driver's exception as `__cause__`: `QueueNotFound` (SQLSTATE LQ001),
`ValidationError` (LQ002), `MessageTooLarge` (LQ003), `InvalidReceiptHandle`
(LQ004), `LeaseLost` (LQ005) and `Forbidden` (42501, the role has no grant).
Anything else is raised as the driver raised it.

The module imports no driver: it recognises the connection by the module its
class comes from.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol, TypeVar, overload

from leaseq.errors import ApiError, api_error
from leaseq.models import OutgoingMessage

__all__ = [
    "AsyncConnectionLike",
    "ConnectionLike",
    "Sent",
    "change_visibility",
    "delete",
    "send",
    "send_batch",
]

T = TypeVar("T")


class AsyncConnectionLike(Protocol):
    """An async connection: asyncpg's, psycopg's `AsyncConnection`, SQLAlchemy's
    `AsyncSession` and `AsyncConnection` (their `execute` is a coroutine)."""

    def execute(self, *args: Any, **kwargs: Any) -> Coroutine[Any, Any, Any]: ...


class ConnectionLike(Protocol):
    """A sync connection: psycopg's `Connection`, SQLAlchemy's `Session` and
    `Connection`."""

    def execute(self, *args: Any, **kwargs: Any) -> Any: ...


@dataclass(frozen=True)
class Sent:
    """A message sent in a transaction. `sequence_number` (FIFO queues only, else
    None): its place in the queue; a duplicate is answered with the first one's
    `message_id` and `sequence_number`."""

    message_id: str
    sequence_number: int | None = None


# The statements, with {name} where each driver's placeholder goes. Every
# parameter is cast: the drivers then send plain text, integers and arrays of
# them whatever codecs the caller registered (an asyncpg jsonb codec, say).
_SEND = """
SELECT CAST(message_id AS text), sequence_number
FROM leaseq.send(queue => CAST({queue} AS text), body => CAST({body} AS text),
                 attributes => CAST(CAST({attributes} AS text) AS jsonb),
                 delay => CAST({delay} AS integer), "group" => CAST({group} AS text),
                 deduplication_id => CAST({deduplication_id} AS text))
"""
_SEND_BATCH = """
SELECT CAST(message_id AS text), sequence_number
FROM leaseq.send_batch(queue => CAST({queue} AS text), bodies => CAST({bodies} AS text[]),
                       attributes => CAST(CAST({attributes} AS text[]) AS jsonb[]),
                       delays => CAST({delays} AS integer[]), groups => CAST({groups} AS text[]),
                       deduplication_ids => CAST({deduplication_ids} AS text[]))
"""
_DELETE = """
SELECT 1 FROM leaseq.delete(queue => CAST({queue} AS text),
                            receipt_handle => CAST({receipt_handle} AS text))
"""
_CHANGE_VISIBILITY = """
SELECT leaseq.change_visibility(queue => CAST({queue} AS text),
                                receipt_handle => CAST({receipt_handle} AS text),
                                seconds => CAST({seconds} AS integer))
"""

_PARAMETER = re.compile(r"\{(\w+)\}")

Rows = list[tuple[Any, ...]]


# -- the helpers ----------------------------------------------------------------


@overload
def send(
    conn: AsyncConnectionLike, queue: str, body: str, *,
    attributes: Mapping[str, str] | None = None, delay: int | None = None,
    group: str | None = None, deduplication_id: str | None = None,
) -> Coroutine[Any, Any, Sent]: ...
@overload
def send(
    conn: ConnectionLike, queue: str, body: str, *,
    attributes: Mapping[str, str] | None = None, delay: int | None = None,
    group: str | None = None, deduplication_id: str | None = None,
) -> Sent: ...
def send(
    conn: Any, queue: str, body: str, *,
    attributes: Mapping[str, str] | None = None, delay: int | None = None,
    group: str | None = None, deduplication_id: str | None = None,
) -> Sent | Coroutine[Any, Any, Sent]:
    """Send one message in the connection's transaction (`leaseq.send`): it exists
    for receivers once that transaction commits, and never if it rolls back. On a
    FIFO queue `group` is required, and `deduplication_id` too unless the queue has
    content-based deduplication; a FIFO message takes no `delay`."""
    message = OutgoingMessage(
        body, delay, dict(attributes or {}), group=group, deduplication_id=deduplication_id
    )
    params = {
        "queue": queue, "body": message.body, "attributes": _json(message.attributes),
        "delay": message.delay, "group": message.group,
        "deduplication_id": message.deduplication_id,
    }
    return _run(conn, _SEND, params, lambda rows: _sent(rows[0]))


@overload
def send_batch(
    conn: AsyncConnectionLike, queue: str,
    messages: Sequence[OutgoingMessage | Mapping[str, Any] | str],
) -> Coroutine[Any, Any, list[Sent]]: ...
@overload
def send_batch(
    conn: ConnectionLike, queue: str,
    messages: Sequence[OutgoingMessage | Mapping[str, Any] | str],
) -> list[Sent]: ...
def send_batch(
    conn: Any, queue: str, messages: Sequence[OutgoingMessage | Mapping[str, Any] | str]
) -> list[Sent] | Coroutine[Any, Any, list[Sent]]:
    """Send several messages in the connection's transaction (`leaseq.send_batch`),
    all checked before any is stored; one `Sent` per message, in order. Each is an
    `OutgoingMessage`, a dict of its fields (`{"body": ..., "group": ...}`) or a
    body."""
    outgoing = [_outgoing(m) for m in messages]
    params = {
        "queue": queue,
        "bodies": [m.body for m in outgoing],
        "attributes": _column([_json(m.attributes) for m in outgoing]),
        "delays": _column([m.delay for m in outgoing]),
        "groups": _column([m.group for m in outgoing]),
        "deduplication_ids": _column([m.deduplication_id for m in outgoing]),
    }
    return _run(conn, _SEND_BATCH, params, lambda rows: [_sent(row) for row in rows])


@overload
def delete(
    conn: AsyncConnectionLike, queue: str, receipt_handle: str
) -> Coroutine[Any, Any, None]: ...
@overload
def delete(conn: ConnectionLike, queue: str, receipt_handle: str) -> None: ...
def delete(conn: Any, queue: str, receipt_handle: str) -> Coroutine[Any, Any, None] | None:
    """Acknowledge a received message in the connection's transaction
    (`leaseq.delete`): gone once it commits. Until then its row stays locked, so
    no receive claims it even if its lease runs out. Raises `LeaseLost` when the
    claim is gone (the transaction cannot commit as intended: roll it back)."""
    params = {"queue": queue, "receipt_handle": receipt_handle}
    return _run(conn, _DELETE, params, _nothing)


@overload
def change_visibility(
    conn: AsyncConnectionLike, queue: str, receipt_handle: str, seconds: int
) -> Coroutine[Any, Any, datetime]: ...
@overload
def change_visibility(
    conn: ConnectionLike, queue: str, receipt_handle: str, seconds: int
) -> datetime: ...
def change_visibility(
    conn: Any, queue: str, receipt_handle: str, seconds: int
) -> datetime | Coroutine[Any, Any, datetime]:
    """End the message's lease `seconds` (0-43200) from now, on the database's
    clock, in the connection's transaction (`leaseq.change_visibility`); 0 releases
    it. Returns the new deadline (the database's time, for information)."""
    params = {"queue": queue, "receipt_handle": receipt_handle, "seconds": seconds}
    return _run(conn, _CHANGE_VISIBILITY, params, _deadline)


# -- the answers ----------------------------------------------------------------


def _sent(row: tuple[Any, ...]) -> Sent:
    message_id, sequence_number = row
    return Sent(str(message_id), None if sequence_number is None else int(sequence_number))


def _nothing(rows: Rows) -> None:
    return None


def _deadline(rows: Rows) -> datetime:
    deadline = rows[0][0]
    assert isinstance(deadline, datetime)
    return deadline


def _outgoing(message: OutgoingMessage | Mapping[str, Any] | str) -> OutgoingMessage:
    if isinstance(message, OutgoingMessage):
        return message
    if isinstance(message, str):
        return OutgoingMessage(message)
    return OutgoingMessage(**message)


def _json(attributes: Mapping[str, str]) -> str | None:
    return json.dumps(dict(attributes)) if attributes else None


def _column(values: list[T | None]) -> list[T | None] | None:
    # A column no message uses goes as NULL: a driver cannot tell the type of
    # an array of nothing but NULLs.
    return values if any(v is not None for v in values) else None


# -- the drivers ----------------------------------------------------------------

_Driver = Literal["asyncpg", "psycopg", "psycopg-async", "sqlalchemy", "sqlalchemy-async"]


def _driver(conn: Any) -> _Driver:
    """Which driver's connection `conn` is, by the module of its class (or of the
    class it extends)."""
    for cls in type(conn).__mro__:
        module = cls.__module__
        package = module.partition(".")[0]
        if package == "asyncpg":
            if cls.__name__ == "Pool":
                # A pool's fetch runs on a connection of its choosing, outside
                # any transaction of the caller's.
                raise TypeError("give a connection of the pool, not the pool: "
                                "async with pool.acquire() as conn: ...")
            return "asyncpg"
        if package == "psycopg":
            return "psycopg-async" if cls.__name__.startswith("Async") else "psycopg"
        if package == "sqlalchemy":
            if not hasattr(conn, "execute"):
                raise TypeError(f"give a SQLAlchemy Session or Connection, not {cls.__name__}: "
                                "with engine.begin() as conn: ...")
            return "sqlalchemy-async" if module.startswith("sqlalchemy.ext.asyncio") else (
                "sqlalchemy")
    raise TypeError(
        f"{type(conn).__module__}.{type(conn).__qualname__} is not a connection leaseq.sql "
        "knows: give an asyncpg Connection, a psycopg 3 Connection or AsyncConnection, or "
        "a SQLAlchemy Session, AsyncSession, Connection or AsyncConnection"
    )


def _run(
    conn: Any, query: str, params: dict[str, Any], answer: Callable[[Rows], T]
) -> T | Coroutine[Any, Any, T]:
    driver = _driver(conn)
    if driver == "psycopg":
        with _mapped_errors():
            return answer(_on_psycopg(conn, query, params))
    if driver == "sqlalchemy":
        with _mapped_errors():
            return answer(_on_sqlalchemy(conn, query, params))
    on_async = {
        "asyncpg": _on_asyncpg,
        "psycopg-async": _on_psycopg_async,
        "sqlalchemy-async": _on_sqlalchemy_async,
    }[driver]

    async def run() -> T:
        with _mapped_errors():
            return answer(await on_async(conn, query, params))

    return run()


async def _on_asyncpg(conn: Any, query: str, params: dict[str, Any]) -> Rows:
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        names.append(match[1])
        return f"${len(names)}"

    rows = await conn.fetch(_PARAMETER.sub(number, query), *(params[n] for n in names))
    return [tuple(row) for row in rows]


def _tuple_rows(cursor: Any) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    # psycopg's row factory for this cursor alone: the caller's connection may
    # make dicts or objects of its rows.
    return tuple


def _on_psycopg(conn: Any, query: str, params: dict[str, Any]) -> Rows:
    with conn.cursor(row_factory=_tuple_rows) as cursor:
        cursor.execute(_PARAMETER.sub(r"%(\1)s", query), params)
        rows: Rows = cursor.fetchall()
    return rows


async def _on_psycopg_async(conn: Any, query: str, params: dict[str, Any]) -> Rows:
    async with conn.cursor(row_factory=_tuple_rows) as cursor:
        await cursor.execute(_PARAMETER.sub(r"%(\1)s", query), params)
        rows: Rows = await cursor.fetchall()
    return rows


def _text(query: str) -> Any:
    # The caller's SQLAlchemy, loaded since one of its objects was given to us:
    # the client itself depends on no database library.
    return sys.modules["sqlalchemy"].text(_PARAMETER.sub(r":\1", query))


def _on_sqlalchemy(conn: Any, query: str, params: dict[str, Any]) -> Rows:
    return [tuple(row) for row in conn.execute(_text(query), params).all()]


async def _on_sqlalchemy_async(conn: Any, query: str, params: dict[str, Any]) -> Rows:
    result = await conn.execute(_text(query), params)
    return [tuple(row) for row in result.all()]


# -- the errors -----------------------------------------------------------------

_ERRORS: dict[str, tuple[int, str]] = {
    "LQ001": (404, "queue_not_found"),
    "LQ002": (422, "validation_error"),
    "LQ003": (413, "message_too_large"),
    "LQ004": (400, "invalid_receipt_handle"),
    "LQ005": (409, "lease_lost"),
    "42501": (403, "forbidden"),
}
"""SQLSTATE -> what the REST door answers in the same case (status, problem code);
`api_error` makes the client's exception of it, as for a REST answer."""


@contextmanager
def _mapped_errors() -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        error = _api_error(exc)
        if error is None:
            raise
        raise error from exc


def _api_error(exc: BaseException) -> ApiError | None:
    """The client's error for a driver's exception raised by the SQL API, or None
    when it is not one of the API's."""
    found = _postgres_error(exc)
    if found is None:
        return None
    state, source = found
    mapped = _ERRORS.get(state)
    if mapped is None:
        return None
    status, code = mapped
    diagnostics = getattr(source, "diag", None)  # psycopg's
    message = getattr(diagnostics, "message_primary", None) or getattr(source, "message", None)
    hint = getattr(diagnostics, "message_hint", None) or getattr(source, "hint", None)
    detail = str(message or source)
    if hint:
        detail = f"{detail} (hint: {hint})"
    return api_error(status, code, detail)


def _postgres_error(exc: BaseException) -> tuple[str, BaseException] | None:
    """The SQLSTATE of a PostgreSQL error and the driver's exception that holds its
    message: the exception itself (asyncpg, psycopg), or what SQLAlchemy wraps
    (`orig`, and with asyncpg the asyncpg exception behind that)."""
    orig = getattr(exc, "orig", None)
    candidates = [exc]
    if isinstance(orig, BaseException):
        candidates += [orig]
        if orig.__cause__ is not None:
            candidates += [orig.__cause__]
    found = None
    for candidate in candidates:
        state = getattr(candidate, "sqlstate", None) or getattr(candidate, "pgcode", None)
        if isinstance(state, str):
            found = state, candidate  # the innermost holds the message as PostgreSQL wrote it
    return found
