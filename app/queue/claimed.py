"""A claimed row as the message its receiver gets: attributes read (typed when
they were sent typed), the receipt handle signed, FIFO's fields on a FIFO queue."""

from __future__ import annotations

import json

from app.queue import typed
from app.queue.models import Queue, ReceivedMessage
from app.queue.receipts import Receipt, ReceiptSigner
from app.queue.rows import MessageColumns


def claimed(
    queue: Queue, row: MessageColumns, visibility_timeout: int, signer: ReceiptSigner
) -> ReceivedMessage:
    """The message a claim's row is, its receipt handle signed by `signer`."""
    text = row["attributes"]
    types = row["attribute_types"]
    checkpoint = row["checkpoint"]
    # Most messages carry no attributes: no JSON to read, nothing to type.
    flat = {} if text == "{}" else json.loads(text)
    claim = Receipt(queue_id=queue.id, message_row=row["id"], claim_token=row["claim_token"])
    return ReceivedMessage(
        message_id=str(row["message_id"]),
        body=row["body"],
        attributes=flat,
        typed_attributes=(
            typed.join(flat, None if types is None else json.loads(types))
            if flat or types is not None else {}
        ),
        sender_id=row["sender_id"],
        trace_header=row["trace_header"],
        dead_letter_source_id=row["dead_letter_source_id"],
        receipt_handle=signer.encode(claim),
        claim=claim,
        receive_count=row["receive_count"],
        fencing_token=row["fencing_token"],
        visibility_timeout=visibility_timeout,
        lease_expires_at=row["lease_expires_at"],
        sent_at=row["sent_at"],
        first_received_at=row["first_received_at"],
        checkpoint=None if checkpoint is None else json.loads(checkpoint),
        **queue.kind.received_fields(row),
    )
