"""The message cycle's handlers: send, receive (and receive-and-settle),
visibility, release, checkpoint, delete. Each is the one implementation of a
route declared in app/api/routes/messages.py, served on the lean path
(app/asgi/lean.py)."""

from __future__ import annotations

from typing import Any

from pydantic_core import to_json

from app.api.decoding import AnswerOf, BodyOf, QueryOf, answering_problems
from app.api.deps import check_batch
from app.api.message_schemas import (
    BatchResults,
    CheckpointIn,
    DeleteBatchIn,
    LeaseOut,
    MessageBatchIn,
    ReceiveIn,
    ReceiveQuery,
    ReleasedOut,
    ReleaseIn,
    SendIn,
    SentOut,
    VisibilityBatchIn,
    VisibilityIn,
)
from app.api.problems import entry_error
from app.asgi.disconnect import client_gone
from app.asgi.lean import Answer, Call
from app.config import Settings
from app.errors import InvalidParameter
from app.queue import limits
from app.queue.models import EntryError, Lease, OutgoingMessage, ReceivedMessage
from app.queue.service import QueueService
from app.queue.settling import Settled
from app.queue.tracecontext import TRACEPARENT, to_traceparent


def _service(call: Call) -> QueueService:
    service: QueueService = call.state.service
    return service


def _settings(call: Call) -> Settings:
    settings: Settings = call.state.settings
    return settings

_send_body = BodyOf(SendIn, batch=True)
_sent = AnswerOf(SentOut, status=201, exclude_none=True)  # sequence_number: FIFO only
_batch = AnswerOf(BatchResults)


@answering_problems
async def send(call: Call) -> Answer:
    body = _send_body.decode(call)
    batch = isinstance(body, MessageBatchIn)
    entries = body.messages if batch else [body]
    check_batch(len(entries), _settings(call))
    results = await _service(call).send(
        call.params["queue"],
        [
            OutgoingMessage(
                body=e.body, attributes=e.attributes, delay=e.delay, not_before=e.not_before,
                group_id=e.group, deduplication_id=e.deduplication_id,
            )
            for e in entries
        ],
    )
    if not batch:
        (result,) = results
        if isinstance(result, EntryError):
            raise result.error
        return _sent(SentOut(message_id=result.message_id, sent_at=result.sent_at,
                             sequence_number=result.sequence_number))
    return _batch(BatchResults.of([
        entry_error(r.error) if isinstance(r, EntryError)
        else {"ok": True, "message_id": r.message_id, "sent_at": r.sent_at}
        if r.sequence_number is None
        else {"ok": True, "message_id": r.message_id, "sent_at": r.sent_at,
              "sequence_number": r.sequence_number}
        for r in results
    ]))


_receive_query = QueryOf(ReceiveQuery)


def _attempt_id(queue: str, attempt_id: str | None) -> str | None:
    """A receive request attempt id, checked, for a FIFO queue (only a FIFO
    queue's name ends in .fifo); a standard queue ignores it, as SQS does."""
    if attempt_id is None or not queue.endswith(limits.FIFO_SUFFIX):
        return None
    if not limits.FIFO_ID.fullmatch(attempt_id):
        raise InvalidParameter("attempt_id is 1-128 letters, digits and ASCII punctuation.")
    return attempt_id


@answering_problems
async def receive(call: Call) -> Answer:
    query: ReceiveQuery = _receive_query.decode(call)
    queue = call.params["queue"]
    attempt_id = _attempt_id(queue, query.attempt_id)
    async with client_gone(call.receive) as gone:
        received = await _service(call).receive(
            queue, max_messages=query.max,
            visibility_timeout=query.visibility_timeout, wait=query.wait, gone=gone,
            attempt_id=attempt_id,
        )
    return Answer(200, to_json({"messages": [_received(m) for m in received]}))


_receive_body = BodyOf(ReceiveIn, batch=True)


@answering_problems
async def receive_and_settle(call: Call) -> Answer:
    body: ReceiveIn = _receive_body.decode(call)
    check_batch(len(body.delete), _settings(call))
    check_batch(len(body.extend), _settings(call))
    queue = call.params["queue"]
    attempt_id = _attempt_id(queue, body.attempt_id)  # refused before anything is settled
    service = _service(call)
    extend = [(e.receipt_handle, e.timeout) for e in body.extend]
    async with client_gone(call.receive) as gone:
        if attempt_id is None:
            settled = await service.settle_and_receive(
                queue, body.delete, extend, max_messages=body.max,
                visibility_timeout=body.visibility_timeout, wait=body.wait, gone=gone,
            )
        else:
            # settle_and_receive's path for a FIFO queue, the receive with its attempt id.
            deleted, extended = await service.settle(queue, body.delete, extend)
            settled = Settled(await service.receive(
                queue, max_messages=body.max, visibility_timeout=body.visibility_timeout,
                wait=body.wait, gone=gone, attempt_id=attempt_id,
            ), deleted, extended)
    return Answer(200, to_json({
        "messages": [_received(m) for m in settled.messages],
        "deleted": _deleted(settled.deleted),
        "extended": _extended(settled.extended),
    }))


def _attributes(m: ReceivedMessage) -> dict[str, str]:
    """A message's attributes; one sent through the SQS door with an AWSTraceHeader
    shows its trace as the `traceparent` a REST worker continues."""
    if m.trace_header is None or TRACEPARENT in m.attributes:
        return m.attributes
    traceparent = to_traceparent(m.trace_header)
    return m.attributes if traceparent is None else {**m.attributes, TRACEPARENT: traceparent}


def _received(m: ReceivedMessage) -> dict[str, Any]:
    # ReceivedOut's fields, in its order (app/api/message_schemas.py); FIFO's only on FIFO.
    out = {
        "message_id": m.message_id, "body": m.body, "attributes": _attributes(m),
        "receipt_handle": m.receipt_handle, "receive_count": m.receive_count,
        "fencing_token": m.fencing_token, "lease_seconds": m.visibility_timeout,
        "lease_expires_at": m.lease_expires_at, "sent_at": m.sent_at,
        "first_received_at": m.first_received_at, "checkpoint": m.checkpoint,
    }
    if m.group_id is not None:
        out["group"] = m.group_id
        out["sequence_number"] = m.sequence_number
        out["deduplication_id"] = m.deduplication_id
    return out


def _deleted(results: list[EntryError | None]) -> list[dict[str, Any]]:
    return [entry_error(r.error) if isinstance(r, EntryError) else {"ok": True} for r in results]


def _extended(results: list[Lease | EntryError]) -> list[dict[str, Any]]:
    return [
        entry_error(r.error) if isinstance(r, EntryError) else {
            "ok": True, "lease_seconds": r.visibility_timeout,
            "lease_expires_at": r.lease_expires_at,
        }
        for r in results
    ]


_visibility_body = BodyOf(VisibilityIn)
_lease = AnswerOf(LeaseOut)


def _lease_or_raise(result: Lease | EntryError) -> Answer:
    if isinstance(result, EntryError):
        raise result.error
    return _lease(LeaseOut.of(result))


@answering_problems
async def change_visibility(call: Call) -> Answer:
    body: VisibilityIn = _visibility_body.decode(call)
    (result,) = await _service(call).change_visibility(
        call.params["queue"], [(call.params["receipt_handle"], body.timeout)]
    )
    return _lease_or_raise(result)


_visibility_batch_body = BodyOf(VisibilityBatchIn, batch=True)


@answering_problems
async def change_visibility_batch(call: Call) -> Answer:
    body: VisibilityBatchIn = _visibility_batch_body.decode(call)
    check_batch(len(body.entries), _settings(call))
    results = await _service(call).change_visibility(
        call.params["queue"], [(e.receipt_handle, e.timeout) for e in body.entries]
    )
    return _batch(BatchResults.of(_extended(results)))


@answering_problems
async def delete(call: Call) -> Answer:
    (result,) = await _service(call).delete(call.params["queue"], [call.params["receipt_handle"]])
    if isinstance(result, EntryError):
        raise result.error
    return Answer(204)


_delete_batch_body = BodyOf(DeleteBatchIn, batch=True)


@answering_problems
async def delete_batch(call: Call) -> Answer:
    body: DeleteBatchIn = _delete_batch_body.decode(call)
    check_batch(len(body.receipt_handles), _settings(call))
    results = await _service(call).delete(call.params["queue"], body.receipt_handles)
    return _batch(BatchResults.of(_deleted(results)))


_release_body = BodyOf(ReleaseIn | None, optional=True)
_released = AnswerOf(ReleasedOut)


@answering_problems
async def release(call: Call) -> Answer:
    body: ReleaseIn | None = _release_body.decode(call)
    released = await _service(call).release(
        call.params["queue"], call.params["receipt_handle"], None if body is None else body.delay
    )
    return _released(ReleasedOut(delay_seconds=released.delay_seconds,
                                  visible_at=released.visible_at))


_checkpoint_body = BodyOf(CheckpointIn)


@answering_problems
async def checkpoint(call: Call) -> Answer:
    body: CheckpointIn = _checkpoint_body.decode(call)
    lease = await _service(call).checkpoint(
        call.params["queue"], call.params["receipt_handle"], body.cursor, body.timeout
    )
    return _lease(LeaseOut.of(lease))
