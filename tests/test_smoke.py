from __future__ import annotations

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
