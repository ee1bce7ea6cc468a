"""Receipt keys live in the database: every process signs and verifies with the
same ones; a rotated key signs only once every process knows it; outstanding
handles keep working until their key is retired."""

from __future__ import annotations

import base64

import pytest
from conftest import AppClient
from support import make_queue, receive, send, wait_until

from app.auth import receipt_keys


def key_of(handle: str) -> int:
    raw = base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4))
    return int.from_bytes(raw[1:3], "big")


async def test_rotation_and_retirement_across_processes(
    app_factory: AppClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(receipt_keys, "ACTIVATION_SECONDS", 0.5)
    one = await app_factory()
    two = await app_factory()
    ring_one = one.app.state.keyring  # type: ignore[attr-defined]
    ring_two = two.app.state.keyring  # type: ignore[attr-defined]
    queue = await make_queue(one, "rotating")
    await send(one, queue, "old")
    (old,) = await receive(one, queue)
    assert key_of(old["receipt_handle"]) == 1

    async with one.app.state.db.transaction() as session:  # type: ignore[attr-defined]
        new_key = await receipt_keys.rotate(session)
    assert new_key == 2
    # Both processes verify with key 2 before either signs with it.
    await wait_until(lambda: ring_two.signer.key_ids == [1, 2], seconds=2)
    await wait_until(lambda: ring_one.signer.current == 2 and ring_two.signer.current == 2,
                     seconds=5)

    await send(one, queue, "new")
    (new,) = await receive(two, queue)
    assert key_of(new["receipt_handle"]) == 2
    assert (await one.delete(f"/v1/queues/{queue}/messages/{new['receipt_handle']}")
            ).status_code == 204
    beat = await two.patch(f"/v1/queues/{queue}/messages/{old['receipt_handle']}/visibility",
                           json={"timeout": 30})
    assert beat.status_code == 200  # signed by key 1, which still verifies

    async with one.app.state.db.transaction() as session:  # type: ignore[attr-defined]
        assert not await receipt_keys.retire(session, 2)  # the newest keeps signing
        assert await receipt_keys.retire(session, 1)
    await wait_until(lambda: ring_two.signer.key_ids == [2], seconds=2)
    gone = await two.delete(f"/v1/queues/{queue}/messages/{old['receipt_handle']}")
    assert gone.status_code == 400 and gone.json()["code"] == "invalid_receipt_handle"


async def test_a_new_database_gets_one_key_however_many_start(app_factory: AppClient,
                                                               db: object) -> None:
    for _ in range(3):
        await app_factory()
    assert await db.fetchval("SELECT count(*) FROM leaseq.receipt_keys") == 1  # type: ignore[attr-defined]


async def test_handles_survive_a_redeploy_without_a_configured_secret(
    app_factory: AppClient, tmp_path: object
) -> None:
    # Two processes with different master secrets (two containers that each
    # generated one) still share the receipt keys: the database holds them.
    one = await app_factory(secret=None, data_dir=tmp_path / "a")  # type: ignore[operator]
    two = await app_factory(secret=None, data_dir=tmp_path / "b")  # type: ignore[operator]
    queue = await make_queue(one, "redeploy")
    await send(one, queue)
    (message,) = await receive(one, queue)
    assert (await two.delete(f"/v1/queues/{queue}/messages/{message['receipt_handle']}")
            ).status_code == 204
