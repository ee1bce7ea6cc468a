from __future__ import annotations

from typing import Any

import httpx
from support import make_queue, receive, send


async def test_send_receive_delete_cycle(client: httpx.AsyncClient) -> None:
    queue = await make_queue(client)
    message_id = await send(client, queue, "hello", attributes={"k": "v"})
    (message,) = await receive(client, queue)
    assert message["message_id"] == message_id
    assert message["body"] == "hello"
    assert message["attributes"] == {"k": "v"}
    assert message["receive_count"] == 1
    response = await client.delete(f"/v1/queues/{queue}/messages/{message['receipt_handle']}")
    assert response.status_code == 204
    assert await receive(client, queue) == []


async def test_fastapi_telemetry_is_off_unless_asked_for(app_factory: Any) -> None:
    for asked, expected in ((None, False), (True, True)):
        overrides = {} if asked is None else {"telemetry": asked}
        client = await app_factory(**overrides)
        config = client.app._telemetry  # FastAPI's own resolved settings
        assert (config["tracing"], config["metrics"], config["logs"]) == (expected,) * 3
        queue = await make_queue(client, f"t{int(expected)}")
        await send(client, queue)
        assert len(await receive(client, queue)) == 1
