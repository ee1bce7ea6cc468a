"""FIFO receive request attempts (SQS's ReceiveRequestAttemptId): a receive
retried with the same id within five minutes answers what its first try
claimed, while those claims still hold, with the same receipt handles and
their leases set from now again. Remembered in `receive_attempts`; the
retention sweep forgets them."""

from __future__ import annotations

from app.db.connector import Connector
from app.queue.claimed import claimed
from app.queue.models import Queue, ReceivedMessage
from app.queue.receipts import ReceiptSigner
from app.queue.sql import Q


class ReceiveAttempts:
    def __init__(self, db: Connector, signer: ReceiptSigner) -> None:
        self._db = db
        self._signer = signer

    async def replay(self, queue: Queue, attempt_id: str) -> list[ReceivedMessage]:
        """What the attempt's first try claimed and still holds, in group order
        (none: the attempt is new, or its claims are gone)."""
        rows = await self._db.fetch(
            Q.replay_receive_attempt, {"queue_id": queue.id, "attempt_id": attempt_id}
        )
        rows.sort(key=lambda row: row["sequence_number"])
        return [claimed(queue, row, row["visibility_timeout"], self._signer) for row in rows]

    async def record(
        self, queue: Queue, attempt_id: str, received: list[ReceivedMessage]
    ) -> None:
        if not received:
            return
        await self._db.fetch(Q.record_receive_attempt, {
            "queue_id": queue.id,
            "attempt_id": attempt_id,
            "message_rows": [m.claim.message_row for m in received],
            "claim_tokens": [m.claim.claim_token for m in received],
            "visibility_timeout": received[0].visibility_timeout,
        })
