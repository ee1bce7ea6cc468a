"""The Python client's opt-in send buffering: concurrent sends coalesced into batch
requests, each caller keeping its own answer or error."""

from __future__ import annotations

import asyncio

from support import wait_until

from leaseq import AsyncClient, MessageTooLarge, QueueNotFound, Sent


async def test_concurrent_sends_go_in_batches_of_ten(api: AsyncClient) -> None:
    await api.create_queue("buffered")
    async with api.batcher(max_wait=0.2) as batcher:
        sent = await asyncio.gather(*(batcher.send("buffered", f"m{i}") for i in range(25)))
    assert all(isinstance(s, Sent) for s in sent)
    assert len({s.message_id for s in sent}) == 25
    assert batcher.requests == 3 and batcher.sent == 25  # 10, 10, and 5 after max_wait
    assert (await api.get_queue("buffered")).stats.visible == 25


async def test_a_lone_send_goes_after_max_wait(api: AsyncClient) -> None:
    await api.create_queue("lone")
    batcher = api.batcher(max_wait=0.01)
    sent = await asyncio.wait_for(batcher.send("lone", "only", attributes={"k": "v"}), 10)
    assert isinstance(sent, Sent) and batcher.requests == 1
    (message,) = await api.receive("lone")
    assert message.body == "only" and message.attributes == {"k": "v"}


async def test_each_caller_gets_its_own_error(api: AsyncClient) -> None:
    await api.create_queue("small", max_message_bytes=1024)
    async with api.batcher(max_wait=0.2) as batcher:
        results = await asyncio.gather(
            batcher.send("small", "fits"), batcher.send("small", "x" * 2000),
            batcher.send("small", "fits too"), return_exceptions=True,
        )
    assert isinstance(results[0], Sent) and isinstance(results[2], Sent)
    assert isinstance(results[1], MessageTooLarge)
    assert batcher.requests == 1


async def test_a_failed_request_fails_every_send_in_it(api: AsyncClient) -> None:
    async with api.batcher(max_wait=0.05) as batcher:
        results = await asyncio.gather(
            *(batcher.send("no-such-queue", "x") for _ in range(3)), return_exceptions=True
        )
    assert all(isinstance(r, QueueNotFound) for r in results)


async def test_closing_sends_what_is_buffered(api: AsyncClient) -> None:
    await api.create_queue("closing")
    batcher = api.batcher(max_wait=60)
    waiting = asyncio.create_task(batcher.send("closing", "late"))
    await wait_until(lambda: batcher.buffered == 1)  # its timer a minute away
    await batcher.close()
    assert isinstance(await asyncio.wait_for(waiting, 10), Sent)


async def test_a_send_whose_caller_stopped_waiting_is_not_sent(api: AsyncClient) -> None:
    await api.create_queue("cancelled")
    async with api.batcher(max_wait=0.2) as batcher:
        gone = asyncio.create_task(batcher.send("cancelled", "never"))
        await wait_until(lambda: batcher.buffered == 1)
        gone.cancel()
        kept = await batcher.send("cancelled", "kept")
    assert isinstance(kept, Sent) and batcher.requests == 1 and batcher.sent == 1
    assert [m.body for m in await api.receive("cancelled", max=10)] == ["kept"]
