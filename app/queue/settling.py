"""What settling claims answers: a worker's acknowledgements and extensions,
each entry's own result, in request order."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from app.errors import InvalidParameter, InvalidReceiptHandle, LeaseLost
from app.queue.grouped import Deleted
from app.queue.models import EntryError, Lease, ReceivedMessage
from app.queue.receipts import Receipt


class Settled(NamedTuple):
    """A worker's receive: the messages it claimed, and one result per
    acknowledgement and per extension, in request order (the client's Settled
    has the same fields)."""

    messages: list[ReceivedMessage]
    deleted: list[EntryError | None]
    extended: list[Lease | EntryError]


def check_settling(delete: Sequence[str], extend: Sequence[tuple[str, int]]) -> None:
    if delete and extend and set(delete) & {handle for handle, _ in extend}:
        raise InvalidParameter(
            "A receipt handle is either deleted or extended by one request, not both."
        )


def acknowledged(
    receipts: list[Receipt | InvalidReceiptHandle], deleted: Deleted
) -> list[EntryError | None]:
    """Each acknowledgement's result: its message deleted (once: a handle given
    twice fails the second time), else lease_lost, or its handle's error."""
    results: list[EntryError | None] = []
    seen: set[int] = set()
    for receipt in receipts:
        if isinstance(receipt, InvalidReceiptHandle):
            results.append(EntryError(receipt))
        elif receipt.message_row in deleted and receipt.message_row not in seen:
            seen.add(receipt.message_row)
            results.append(None)
        else:
            results.append(EntryError(LeaseLost()))
    return results
