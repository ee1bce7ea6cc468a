"""A finished message's acknowledgement, and the three routes it can leave by.

1. Riding on the next receive (`POST .../receive` with `delete`): a busy worker
   acknowledges and claims in one request. The receiver asks `receive_carrying`
   for such a receive while acknowledgements are queued.
2. In a batch of its own (`POST .../messages/delete`), once it has waited
   ACK_RIDE_SECONDS for a receive (a receive loop parked in a long poll takes
   none), or at once when the next message of its FIFO group waits for it.
3. Alone (`DELETE`), with retries, when the request that carried it failed (it
   may or may not have been applied) or its entry was refused for a reason other
   than a lost lease.

An acknowledgement is a conditional delete: one the service rejects because the
claim is gone is never retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging

from leaseq.batching import MAX_BATCH
from leaseq.client import AsyncClient
from leaseq.errors import ApiError, LeaseLost, Unreachable
from leaseq.job import Job
from leaseq.models import Message

log = logging.getLogger("leaseq.worker")

ACK_BATCH = MAX_BATCH
"""Most acknowledgements one request carries: the service's default batch limit."""
ACK_RIDE_SECONDS = 0.05
"""How long a finished message's acknowledgement waits for the next receive to
carry it (`POST .../receive` with `delete`) before it is sent on its own: a
receive loop waiting in a long poll takes none."""

Ack = tuple[str, "asyncio.Future[ApiError | None]"]
"""A queued acknowledgement: the receipt handle, and its own result to come."""


class Acked(enum.Enum):
    """How an acknowledgement ended."""

    ACKNOWLEDGED = "acknowledged"
    REJECTED = "rejected"
    """The lease was lost: another receive claimed the message meanwhile."""
    UNCONFIRMED = "unconfirmed"
    """The request carrying it failed and the claim is gone now: it was applied
    then, or the lease lapsed."""
    FAILED = "failed"
    """Not delivered after retries: the message will be redelivered."""


class _AckUnknown(Exception):
    """The request carrying an acknowledgement failed: whether it was applied is
    not known."""


class AckBatcher:
    """The acknowledgements of one serve of the worker: queued, then sent by
    whichever route comes first."""

    def __init__(self, queue: str, control: AsyncClient) -> None:
        self.queue = queue
        self._control = control
        self._queued: list[Ack] = []
        self._carry = True  # False against a service without POST .../receive

    @property
    def to_carry(self) -> bool:
        """Acknowledgements are waiting for the next receive to carry them."""
        return bool(self._queued) and self._carry

    async def acknowledge(self, job: Job, *, ride: float) -> Acked:
        """Queued for the next receive to carry within `ride` seconds, else sent in
        a batch of its own; sent alone, with retries, if that request fails."""
        result: asyncio.Future[ApiError | None] = asyncio.get_running_loop().create_future()
        self._queued.append((job.message.receipt_handle, result))
        try:
            answer = await self._result(result, ride)
        except _AckUnknown:
            return await self._alone(job, unconfirmed=True)
        if isinstance(answer, LeaseLost):
            return Acked.REJECTED
        if answer is not None:
            log.warning("%s: acknowledgement refused (%r); trying again alone", job, answer)
            return await self._alone(job)
        return Acked.ACKNOWLEDGED

    async def receive_carrying(
        self, poller: AsyncClient, count: int, lease_seconds: int | None
    ) -> list[Message]:
        """One request on the receiver's connection: up to ACK_BATCH queued
        acknowledgements, then a receive of up to `count` messages. It does not
        wait for messages (their results would wait with it); an empty answer
        sends the receiver to its usual long poll."""
        acks, self._queued = self._queued[:ACK_BATCH], self._queued[ACK_BATCH:]
        try:
            settled = await poller.receive_settling(
                self.queue, delete=[handle for handle, _ in acks], max=count,
                visibility_timeout=lease_seconds, wait=0,
            )
            _resolve(acks, settled.deleted)
        except BaseException as exc:
            _unknown(acks, exc)
            if isinstance(exc, ApiError) and exc.status in (405, 422):
                # A service without the route (405), or one whose batch limit is
                # below ACK_BATCH (422): acknowledgements go on their own.
                log.info("the service does not take acknowledgements on a receive (%s); "
                         "sending them on their own", exc.code)
                self._carry = False
                return []
            raise
        return settled.messages

    async def _result(
        self, result: asyncio.Future[ApiError | None], ride: float
    ) -> ApiError | None:
        """The result of a queued acknowledgement: carried by a receive within
        `ride` seconds, else sent in a batch of its own now."""
        if ride > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(ride):
                    return await asyncio.shield(result)
        with contextlib.suppress(Exception):
            await self._send_batches()  # ours too, unless a receive took it
        return await result

    async def _send_batches(self) -> None:
        """The queued acknowledgements, in batches of their own."""
        while self._queued:
            acks, self._queued = self._queued[:ACK_BATCH], self._queued[ACK_BATCH:]
            try:
                results = await self._control.delete_batch(self.queue, [h for h, _ in acks])
                _resolve(acks, results)
            except BaseException as exc:
                _unknown(acks, exc)
                raise

    async def _alone(self, job: Job, *, unconfirmed: bool = False) -> Acked:
        attempt = 0
        while True:
            try:
                await self._control.delete(self.queue, job.message.receipt_handle)
            except LeaseLost:
                return Acked.UNCONFIRMED if unconfirmed else Acked.REJECTED
            except (Unreachable, ApiError) as exc:
                transient = isinstance(exc, Unreachable) or exc.transient
                attempt += 1
                if transient and attempt < 5 and not job.lease.expired():
                    await asyncio.sleep(min(job.lease.period / 2, 0.2 * 2**attempt))
                    continue
                log.error("%s: acknowledgement failed (%r); it will be redelivered", job, exc)
                return Acked.FAILED
            return Acked.ACKNOWLEDGED


def _resolve(acks: list[Ack], results: list[ApiError | None]) -> None:
    """Each acknowledgement's own result, in order (a short answer: unknown)."""
    for (_, result), deleted in zip(acks, results, strict=False):
        if not result.done():
            result.set_result(deleted)
    _unknown(acks, ValueError("the service answered fewer results than acknowledgements"))


def _unknown(acks: list[Ack], exc: BaseException) -> None:
    for _, result in acks:
        if not result.done():
            result.set_exception(_AckUnknown(repr(exc)))
