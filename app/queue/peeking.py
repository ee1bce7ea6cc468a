"""The operators' view of a queue's messages: a page of them by state, bodies cut
to a length, nothing claimed (GET /v1/queues/{queue}/messages, the dashboard)."""

from __future__ import annotations

import json

from app.db.connector import Connector
from app.errors import InvalidParameter
from app.queue.catalog import QueueCatalog, check_range
from app.queue.models import PeekedMessage
from app.queue.sql import Q

PEEK_MAX_CHARS = 10 * 1024 * 1024
"""Most body characters one peek may return (limit * body_chars): a page of
operators' browsing, not a way to make the service build a gigabyte answer."""

PEEK_BODY_CHARS = 1024
"""Body characters a peek shows of each message unless it asks for more."""


async def peek(
    db: Connector,
    queues: QueueCatalog,
    name: str,
    *,
    state: str | None = None,
    limit: int = 100,
    after: str | None = None,
    body_chars: int = PEEK_BODY_CHARS,
) -> list[PeekedMessage]:
    """Messages of a queue as an operator sees them, without claiming any."""
    if state not in (None, "visible", "in_flight", "delayed"):
        raise InvalidParameter("state must be visible, in_flight or delayed")
    check_range("limit", limit, (1, 1000))
    if limit * body_chars > PEEK_MAX_CHARS:
        raise InvalidParameter(
            f"limit * body_chars must be at most {PEEK_MAX_CHARS} characters, got "
            f"{limit} * {body_chars} = {limit * body_chars}: ask for fewer messages "
            f"per page or shorter bodies."
        )
    try:
        after_id = 0 if not after else int(after)
    except ValueError:
        after_id = -1
    if not 0 <= after_id < 2**63:
        raise InvalidParameter("after must be the cursor of a previous page")
    async with db.transaction() as session:
        queue = await queues.lookup(session, name)
        rows = await session.fetch(
            Q.peek_messages,
            {
                "queue_id": queue.id,
                "retention": queue.attributes.message_retention,
                "state": state,
                "after": after_id,
                "limit": limit,
                "body_chars": body_chars,
            },
        )
    return [
        PeekedMessage(
            message_id=str(row["message_id"]),
            body=row["body"],
            truncated=row["truncated"],
            attributes=json.loads(row["attributes"]),
            state=row["state"],
            receive_count=row["receive_count"],
            sent_at=row["sent_at"],
            first_received_at=row["first_received_at"],
            visible_at=row["visible_at"],
            checkpoint=None if row["checkpoint"] is None else json.loads(row["checkpoint"]),
            dead_letter_source=row["dead_letter_source"],
            fencing_token=row["fencing_token"] if row["state"] == "in_flight" else None,
            lease_remaining_seconds=(
                None if row["lease_remaining"] is None else float(row["lease_remaining"])
            ),
            cursor=str(row["id"]),
            group=row["group"],
        )
        for row in rows
    ]
