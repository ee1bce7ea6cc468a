"""The dashboard in a real browser: headless Chromium from Debian, driven by
Playwright, against the service behind a real uvicorn server. The pages render,
their numbers are the API's, purge asks first, a redrive's progress bar
reaches 100%, the in-flight countdown moves, and signing in keeps the key
where no script can read it. Each test saves screenshots (test-artifacts/
dashboard, or $LEASEQ_TEST_ARTIFACTS) to look at."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import ServeApp

playwright_api = pytest.importorskip("playwright.async_api")
async_playwright, expect = playwright_api.async_playwright, playwright_api.expect

pytestmark = pytest.mark.e2e

CHROMIUM = os.environ.get("LEASEQ_CHROMIUM") or shutil.which("chromium") or ""
ARTIFACTS = Path(
    os.environ.get("LEASEQ_TEST_ARTIFACTS") or Path(__file__).parents[2] / "test-artifacts"
) / "dashboard"
ADMIN = "LQBOOTSTRAPADMIN0001.admin-secret-0123456789abcdefghij"
WAIT_MS = 15_000


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Any]:
    if not CHROMIUM:
        pytest.skip("no Chromium: `apt-get install chromium` (or set LEASEQ_CHROMIUM)")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    async with async_playwright() as driver:
        chromium = await driver.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--disable-background-networking", "--disable-extensions",
                  "--no-first-run", "--mute-audio"],
        )
        yield chromium
        await chromium.close()


@pytest.fixture
async def page(browser: Any) -> AsyncIterator[Any]:
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    tab = await context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda error: errors.append(str(error)))
    yield tab
    await context.close()
    assert not errors, f"the page's script failed: {errors}"


async def shot(page: Any, name: str) -> None:
    await page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def stat(page: Any, field: str) -> Any:
    return page.locator(f'#stats [data-field="{field}"]')


async def api(base: str, **headers: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=base, headers=headers, timeout=30)


async def stats_of(client: httpx.AsyncClient, queue: str) -> dict[str, Any]:
    response = await client.get(f"/v1/queues/{queue}")
    assert response.status_code == 200, response.text
    stats: dict[str, Any] = response.json()["stats"]
    return stats


async def test_the_queue_list_shows_the_apis_numbers_and_a_moving_sparkline(
    serve_factory: ServeApp, page: Any
) -> None:
    base, _ = await serve_factory()
    async with await api(base) as client:
        await client.post("/v1/queues", json={"name": "orders-dlq"})
        await client.post("/v1/queues", json={
            "name": "orders", "dead_letter_queue": "orders-dlq", "max_receive_count": 3,
            "visibility_timeout": 600})
        await client.post("/v1/queues", json={"name": "billing"})
        await client.post("/v1/queues/orders/messages",
                          json={"messages": [{"body": f"m{i}"} for i in range(7)]})
        await client.post("/v1/queues/orders/messages", json={"body": "later", "delay": 600})
        await client.get("/v1/queues/orders/receive", params={"max": 2})

        await page.goto(f"{base}/ui")
        row = page.locator('tr[data-queue="orders"]')
        stats = await stats_of(client, "orders")
        assert (stats["visible"], stats["in_flight"], stats["delayed"]) == (5, 2, 1)
        for field in ("visible", "in_flight", "delayed"):
            await expect(row.locator(f'[data-field="{field}"]')).to_have_text(
                str(stats[field]), timeout=WAIT_MS)
        billing = page.locator('tr[data-queue="billing"] [data-field="visible"]')
        await expect(billing).to_have_text("0")
        await expect(row.locator("td").nth(5)).to_have_text("orders-dlq")

        # Work flowing: the sparkline's last point rises above zero.
        stop = asyncio.Event()

        async def load() -> None:
            while not stop.is_set():
                got = (await client.get("/v1/queues/orders/receive", params={"max": 5})).json()
                handles = [m["receipt_handle"] for m in got["messages"]]
                if handles:
                    await client.post("/v1/queues/orders/messages/delete",
                                      json={"receipt_handles": handles})
                await client.post("/v1/queues/orders/messages",
                                  json={"messages": [{"body": "more"}] * 5})

        worker = asyncio.create_task(load())
        try:
            await page.wait_for_function(
                """() => {
                  const spark = document.querySelector('tr[data-queue="orders"] svg.spark');
                  return spark && Number(spark.dataset.lastDeleted) > 0
                    && Number(spark.dataset.lastSent) > 0;
                }""", timeout=WAIT_MS,
            )
        finally:
            stop.set()
            await worker
        assert int(await row.locator("svg.spark").get_attribute("data-points") or 0) >= 1
        await shot(page, "queue-list")


async def test_the_queue_page_peeks_counts_down_edits_sends_and_asks_before_purging(
    serve_factory: ServeApp, page: Any
) -> None:
    base, _ = await serve_factory()
    async with await api(base) as client:
        await client.post("/v1/queues", json={"name": "jobs", "visibility_timeout": 120})
        for i in range(3):
            await client.post("/v1/queues/jobs/messages",
                              json={"body": f"job {i} <b>not bold</b>"})
        got = await client.get("/v1/queues/jobs/receive", params={"max": 1})
        (held,) = got.json()["messages"]

        await page.goto(f"{base}/ui/queues/jobs")
        await expect(stat(page, "visible")).to_have_text("2", timeout=WAIT_MS)
        await expect(page.locator('#stats [data-field="in_flight"]')).to_have_text("1")
        # Bodies are text, never markup.
        await expect(page.locator("td.body b")).to_have_count(0)

        # The in-flight message: its receive count, fencing token, and a lease counting down.
        await page.click('button[data-state="in_flight"]')
        in_flight = page.locator(f'tr[data-message="{held["message_id"]}"]')
        await expect(in_flight.locator('[data-field="fencing_token"]')).to_have_text(
            str(held["fencing_token"]), timeout=WAIT_MS)
        await expect(in_flight.locator('[data-field="receive_count"]')).to_have_text("1")
        countdown = in_flight.locator('[data-field="lease_left"]')
        await expect(countdown).to_have_text(re.compile(r"^\d+\.\d s$"), timeout=WAIT_MS)
        first = _seconds(await countdown.inner_text())
        assert 100 < first <= 120
        await page.wait_for_function(
            "([el, start]) => parseFloat(el.textContent) <= start - 1.0",
            arg=[await countdown.element_handle(), first], timeout=WAIT_MS,
        )
        await shot(page, "queue-page")

        # Edit an attribute.
        await page.fill('#attributes input[name="visibility_timeout"]', "45")
        await page.click("#save-attributes")
        await expect(page.locator("#flash")).to_contain_text("Saved", timeout=WAIT_MS)
        attributes = (await client.get("/v1/queues/jobs")).json()["attributes"]
        assert attributes["visibility_timeout"] == 45

        # Send a test message.
        await page.fill("#test-body", "sent from the browser")
        await page.click("#send-test")
        await expect(page.locator("#flash")).to_contain_text("Sent message", timeout=WAIT_MS)
        assert (await stats_of(client, "jobs"))["visible"] == 3

        # Purge asks first; cancelling purges nothing.
        await page.click("#purge")
        dialog = page.locator("#purge-dialog")
        await expect(dialog).to_be_visible()
        await expect(page.locator("#purge-question")).to_contain_text("all 4 messages of jobs")
        await shot(page, "purge-confirmation")
        await page.click("#purge-cancel")
        await expect(dialog).to_be_hidden()
        stats = await stats_of(client, "jobs")
        assert stats["visible"] + stats["in_flight"] == 4
        await page.click("#purge")
        await page.click("#purge-confirm")
        await expect(page.locator("#flash")).to_contain_text("Purged 4 messages", timeout=WAIT_MS)
        stats = await stats_of(client, "jobs")
        assert stats["visible"] + stats["in_flight"] + stats["delayed"] == 0
        await expect(stat(page, "visible")).to_have_text("0", timeout=WAIT_MS)


async def test_a_fair_queues_page_shows_its_tenants_and_each_messages_group(
    serve_factory: ServeApp, page: Any
) -> None:
    base, _ = await serve_factory()
    async with await api(base) as client:
        await client.post("/v1/queues", json={"name": "shared"})
        burst = [{"body": f"big {n}", "group": "big-customer"} for n in range(50)]
        response = await client.post("/v1/queues/shared/messages", json={"messages": burst})
        assert response.status_code == 200, response.text
        # 40 in flight and 10 waiting: the big customer is noisy, and stays so at
        # the fairness round (a tenant with nothing waiting is judged quiet there).
        for _ in range(4):
            await client.get("/v1/queues/shared/receive",
                             params={"max": 10, "visibility_timeout": 300})
        await client.post("/v1/queues/shared/messages",
                          json={"body": "small", "group": "small-customer"})

        await page.goto(f"{base}/ui/queues/shared")
        tenants = page.locator("#tenants")
        await expect(tenants.locator('[data-field="noisy_tenants"]')).to_have_text(
            "1", timeout=WAIT_MS)
        await expect(tenants.locator('[data-field="quiet_visible"]')).to_have_text("1")
        big = page.locator('#top-tenants tr[data-tenant="big-customer"]')
        await expect(big).to_contain_text("noisy")
        await expect(page.locator("h1 .badge")).to_have_text("Fair")
        # The peek shows each message's group; the test message may name one.
        await expect(page.locator('#peek [data-field="group"]').first).to_have_text(
            "big-customer", timeout=WAIT_MS)
        await page.fill("#test-body", "from the browser")
        await page.fill("#test-group", "browser-tenant")
        await page.click("#send-test")
        await expect(page.locator("#flash")).to_contain_text("Sent message", timeout=WAIT_MS)
        peeked = (await client.get("/v1/queues/shared/messages")).json()["messages"]
        assert ("from the browser", "browser-tenant") in [
            (m["body"], m["group"]) for m in peeked]
        await shot(page, "fair-queue")


def _seconds(text: str) -> float:
    return float(text.split()[0])


async def test_the_dead_letter_page_redrives_with_a_progress_bar_to_100(
    serve_factory: ServeApp, page: Any
) -> None:
    base, _ = await serve_factory(redrive_scan_seconds=0.2)
    async with await api(base) as client:
        await client.post("/v1/queues", json={"name": "work-dlq"})
        await client.post("/v1/queues", json={
            "name": "work", "dead_letter_queue": "work-dlq", "max_receive_count": 1})
        await client.post("/v1/queues/work/messages",
                          json={"messages": [{"body": f"poison {i}"} for i in range(60)]})
        while (await client.get("/v1/queues/work/receive",
                                params={"max": 10, "visibility_timeout": 0})).json()["messages"]:
            pass
        assert (await stats_of(client, "work-dlq"))["visible"] == 60

        await page.goto(f"{base}/ui/dead-letter/work-dlq")
        await expect(stat(page, "messages")).to_have_text("60", timeout=WAIT_MS)
        await expect(page.locator('#sources li[data-source="work"]')).to_contain_text(
            "60 messages", timeout=WAIT_MS)
        await page.fill("#redrive-rate", "20")
        await page.click("#redrive")
        status = page.locator("#redrive-status")
        await expect(status).to_have_attribute("data-status", "running", timeout=WAIT_MS)
        bar = page.locator("#redrive-progress")
        await page.wait_for_function(
            "el => Number(el.dataset.percent) > 0 && Number(el.dataset.percent) < 100",
            arg=await bar.element_handle(), timeout=WAIT_MS,
        )
        await shot(page, "redrive-running")
        await expect(status).to_have_attribute("data-status", "completed", timeout=30_000)
        await expect(bar).to_have_attribute("data-percent", "100")
        await expect(status).to_contain_text("moved 60 of 60")
        await shot(page, "redrive-done")
        assert (await stats_of(client, "work"))["visible"] == 60
        assert (await stats_of(client, "work-dlq"))["visible"] == 0


async def test_signing_in_keeps_the_key_from_scripts_and_scopes_grey_out_actions(
    serve_factory: ServeApp, page: Any
) -> None:
    base, _ = await serve_factory(admin_key=ADMIN)
    admin = {"Authorization": f"Bearer {ADMIN}"}
    async with await api(base, **admin) as client:
        await client.post("/v1/queues", json={"name": "reports"})
        await client.post("/v1/queues/reports/messages", json={"body": "r"})
        created = await client.post("/v1/keys", json={"name": "viewer", "scopes": ["read:*"]})
        viewer = created.json()["token"]

        await page.goto(f"{base}/ui")
        await expect(page.locator("#key")).to_be_visible(timeout=WAIT_MS)
        await page.fill("#key", "LQNOSUCHKEY000000000.wrong-secret")
        await page.click("#sign-in")
        await expect(page.locator("#login-error")).not_to_be_empty(timeout=WAIT_MS)
        await shot(page, "sign-in")

        await page.fill("#key", viewer)
        await page.click("#sign-in")
        await expect(page.locator('tr[data-queue="reports"] [data-field="visible"]')).to_have_text(
            "1", timeout=WAIT_MS)
        await expect(page.locator("#signed-in")).to_contain_text("read:*")
        (cookie,) = [c for c in await page.context.cookies() if c["name"] == "leaseq_session"]
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert viewer.split(".", 1)[0] not in cookie["value"]  # a session, not the key
        assert await page.evaluate("document.cookie") == ""  # no script can read the key

        await page.goto(f"{base}/ui/queues/reports")
        await expect(stat(page, "visible")).to_have_text("1", timeout=WAIT_MS)
        await expect(page.locator("#purge")).to_be_disabled()
        await expect(page.locator("#send-test")).to_be_disabled()
        await shot(page, "read-only-queue")
        # Greyed out or not, the server decides: the key cannot purge.
        status = await page.evaluate(
            """() => fetch('/v1/queues/reports/purge', {method: 'POST',
                 headers: {'x-leaseq-dashboard': '1'}}).then(r => r.status)"""
        )
        assert status == 403
        assert (await stats_of(client, "reports"))["visible"] == 1

        await page.click("#sign-out")
        await expect(page.locator("#key")).to_be_visible(timeout=WAIT_MS)
        assert not [c for c in await page.context.cookies() if c["name"] == "leaseq_session"]
