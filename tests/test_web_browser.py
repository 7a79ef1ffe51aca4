"""The dashboard in a real Chromium: Playwright for Python driving Debian's
/usr/bin/chromium (no browser download; --no-sandbox since CI runs as root).

Each test runs the in-process dashboard (tests/webkit.py) and the browser in
one event loop. Screenshots go under tests/artifacts/ (ignored by git).
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from conftest import free_port
from delaywheel_client import Client
from serverproc import ServerProcess
from waiting import wait_until, wait_until_async
from webkit import HOSTILE_TEXTS, TOKEN, VIEWER_TOKEN, Dash, dash, dashboard_url

playwright_api = pytest.importorskip("playwright.async_api")

pytestmark = [pytest.mark.browser, pytest.mark.slow]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
# Counts CSP violations and marks any script of the hostile data that ran.
WATCH = """
window.__violations = 0;
document.addEventListener('securitypolicyviolation', () => { window.__violations += 1; });
"""

Scenario = Callable[[Dash, Any], Awaitable[None]]


def run(scenario: Scenario, **settings: Any) -> None:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no chromium at {CHROMIUM}: apt-get install -y chromium (.ci/run does)")

    async def main() -> None:
        async with dash(**settings) as d, playwright_api.async_playwright() as pw:
            browser = await launch(pw)
            try:
                await scenario(d, browser)
            finally:
                await browser.close()

    asyncio.run(main())


async def launch(pw: Any) -> Any:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no chromium at {CHROMIUM}: apt-get install -y chromium (.ci/run does)")
    return await pw.chromium.launch(
        executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"]
    )


async def signed_in(d: Dash, browser: Any, token: str = TOKEN, **options: Any) -> Any:
    context = await browser.new_context(timezone_id="UTC", **options)
    await context.add_init_script(WATCH)
    page = await context.new_page()
    await page.goto(f"{d.origin}/login")
    await page.get_by_label("Token").fill(token)
    await page.get_by_role("button", name="Sign in").click()
    await page.wait_for_url(f"{d.origin}/")
    return page


def test_login_is_required_a_bad_token_says_so_and_the_cookie_flags() -> None:
    async def scenario(d: Dash, browser: Any) -> None:
        context = await browser.new_context()
        page = await context.new_page()
        await page.goto(f"{d.origin}/tasks")
        assert page.url == f"{d.origin}/login"
        await page.get_by_label("Token").fill("wrong")
        await page.get_by_role("button", name="Sign in").click()
        assert await page.get_by_role("alert").inner_text() == "That token is not right."
        await page.get_by_label("Token").fill(TOKEN)
        await page.get_by_role("button", name="Sign in").click()
        await page.wait_for_url(f"{d.origin}/")
        [cookie] = await context.cookies()
        assert (cookie["httpOnly"], cookie["sameSite"]) == (True, "Strict")

    run(scenario)


def test_tasks_added_show_up_live_without_a_reload() -> None:
    async def scenario(d: Dash, browser: Any) -> None:
        page = await signed_in(d, browser)
        assert await page.locator("#count-ready").inner_text() == "0"
        for n in range(50):
            d.add(id=f"live{n}")
        started = time.monotonic()
        # expect() polls from outside the page (a string predicate would be an eval,
        # which the CSP refuses).
        await playwright_api.expect(page.locator("#count-ready")).to_have_text("50", timeout=5000)
        assert time.monotonic() - started < 5
        assert await page.locator("#banner").is_hidden()

    run(scenario)


def test_hostile_data_runs_no_script_and_breaks_no_policy() -> None:
    async def scenario(d: Dash, browser: Any) -> None:
        ids = []
        for n, text in enumerate(HOSTILE_TEXTS):
            ids.append(d.add(id=text, topic=text, body=text))
            d.dead(text, 1, error=text, prefix=f"x{n}")
            d.engine.schedule_add({"id": text, "cron": "0 3 * * *", "topic": text}, time.time())
        page = await signed_in(d, browser)
        from urllib.parse import quote

        paths = ["/", "/topics", "/tasks", "/dead", "/deliveries", "/schedules", "/server"]
        paths += ["/cluster"]
        paths += [f"/tasks/{quote(i, safe='')}" for i in ids]
        for path in paths:
            await page.goto(d.origin + path)
            assert await page.evaluate("window.__xss") is None, path
            assert await page.evaluate("window.__violations") == 0, path

    run(scenario)


def test_a_viewer_sees_no_action_buttons() -> None:
    async def scenario(d: Dash, browser: Any) -> None:
        task_id = d.add()
        d.dead("t", 1)
        page = await signed_in(d, browser, VIEWER_TOKEN)
        for path in (f"/tasks/{task_id}", "/dead"):
            await page.goto(d.origin + path)
            assert await page.locator("button[data-action]").count() == 0
        # A forged POST from the viewer's own signed-in page, with its CSRF
        # token: the role is enforced on the server, not by hiding buttons.
        csrf = await page.locator('input[name="csrf"]').first.get_attribute("value")
        status = await page.evaluate(
            """([path, csrf]) => fetch(path, {method: "POST",
                   body: new URLSearchParams({csrf: csrf})}).then(r => r.status)""",
            [f"/tasks/{task_id}/delete", csrf],
        )
        assert status == 403
        assert d.engine.get(task_id) is not None

    run(scenario, web_viewer_token=VIEWER_TOKEN)


def test_paging_1234_tasks_at_100_a_page_visits_each_once() -> None:
    async def scenario(d: Dash, browser: Any) -> None:
        ids = [d.add(id=f"p{n:04}") for n in range(1234)]
        page = await signed_in(d, browser)
        await page.goto(f"{d.origin}/tasks?limit=100")
        sizes, seen = [], []
        while True:
            shown = await page.locator("a.task-id").all_inner_texts()
            sizes.append(len(shown))
            seen.extend(shown)
            if await page.locator("#next").count() == 0:
                break
            await page.locator("#next").click()
            await page.wait_for_load_state()
        assert sizes == [100] * 12 + [34]
        assert seen == ids

    run(scenario)


def test_with_javascript_off_list_detail_and_kick_work() -> None:
    async def scenario(d: Dash, browser: Any) -> None:
        [dead] = d.dead("t", 1)
        page = await signed_in(d, browser, java_script_enabled=False)
        await page.goto(f"{d.origin}/tasks?state=dead")
        await page.get_by_role("link", name=dead).click()
        assert await page.locator("#task-state").inner_text() == "dead"
        await page.get_by_role("button", name="Kick").click()
        assert await page.locator("#task-state").inner_text() == "ready"
        assert d.engine.get(dead)["state"] == "ready"  # type: ignore[index]

    run(scenario)


# The layout checks, run in the page: elements that stick out of their
# container (outside a box that scrolls), and text nodes whose lines break
# between two letters of a word (a break may follow a space or a separator
# only: the templates put <wbr> there, dash.css forbids the rest).
LAYOUT = (Path(__file__).resolve().parent / "layout.js").read_text()


async def layout_problems(page: Any) -> dict[str, list[str]]:
    found: dict[str, list[str]] = await page.evaluate(LAYOUT)
    found["page"] = [str(await page.evaluate("document.documentElement.scrollWidth - innerWidth"))]
    return found


def fill_for_screenshots(d: Dash) -> str:
    """Tasks, dead groups and schedules with the long names that used to break mid-word."""
    task_id = d.add(
        id="shot-1",
        body={"order": 42, "note": "a body shown as JSON"},
        target={"type": "http", "url": "https://hooks.example.com/delaywheel/webhook/orders?x=1",
                "headers": {"Authorization": "Bearer s3cret", "X-Request-Source": "dashboard"}},
    )  # fmt: skip
    for n in range(8):
        d.add(id=f"shot-more-{n}", topic=f"topic-{n % 3}", delay=60 * n)
    d.dead("webhooks", 3, error="HTTP 503 from https://example.com/hook/webhooks")
    d.dead("mail", 2, error="timeout after 10 s", prefix="m")
    d.engine.schedule_add(
        {
            "id": "nightly-report",
            "cron": "30 1 * * *",
            "tz": "America/New_York",
            "topic": "reports",
        },
        time.time(),
    )
    d.engine.schedule_add({"id": "london-digest", "cron": "0 7 * * 1-5", "tz": "Europe/London",
                           "topic": "digests"}, time.time())  # fmt: skip
    d.engine.schedule_add({"id": "heartbeat", "every": 30, "topic": "pings"}, time.time())
    return task_id


def watch_failures(page: Any) -> list[str]:
    """What goes wrong on ``page`` from now on: responses of 400 and up, console errors."""
    failed: list[str] = []

    def response(reply: Any) -> None:
        if reply.status >= 400:
            failed.append(f"{reply.status} {reply.url}")

    def console(message: Any) -> None:
        if message.type == "error":
            failed.append(message.text)

    page.on("response", response)
    page.on("console", console)
    return failed


def test_screenshots_of_every_page_with_no_overflow_and_no_word_broken() -> None:
    async def scenario(d: Dash, browser: Any) -> None:
        task_id = fill_for_screenshots(d)
        ARTIFACTS.mkdir(exist_ok=True)
        pages = {"home": "/", "topics": "/topics", "tasks": "/tasks", "task": f"/tasks/{task_id}",
                 "dead": "/dead", "dead-group": "/dead?topic=webhooks", "deliveries": "/deliveries",
                 "server": "/server", "cluster": "/cluster", "schedules": "/schedules",
                 "confirm": None}  # fmt: skip
        problems = []
        # The checks themselves find what they look for: a word broken by
        # overflow-wrap: anywhere (the old cells) and a box wider than the page.
        page = await (await browser.new_context(viewport={"width": 390, "height": 600})).new_page()
        await page.set_content(
            '<table><tr><td style="overflow-wrap: anywhere; width: 3em">webhooks</td></tr></table>'
            '<div style="width: 500px">wide</div>'
        )
        found = await layout_problems(page)
        assert found["broken"] and found["overflow"], found
        await page.context.close()
        for width, height in ((1280, 800), (390, 844)):
            for scheme in ("light", "dark"):
                viewport = {"width": width, "height": height}
                page = await signed_in(d, browser, viewport=viewport, color_scheme=scheme)
                # Nothing the pages ask for is missing (the favicon included)
                # and the console stays clean.
                failed = watch_failures(page)
                for name, path in pages.items():
                    if path is None:  # the confirmation of a bulk kick
                        await page.goto(d.origin + "/dead")
                        await page.get_by_role("button", name="Kick all of topic").first.click()
                    else:
                        await page.goto(d.origin + path)
                    await page.screenshot(
                        path=ARTIFACTS / f"{name}-{width}-{scheme}.png", full_page=True
                    )
                    found = await layout_problems(page)
                    if found["overflow"] or found["broken"] or found["page"] != ["0"] or failed:
                        problems.append((name, width, scheme, {**found, "failed": failed}))
                await page.context.close()
        assert problems == [], "\n".join(map(str, problems))

    run(scenario)


AXE = Path(__file__).resolve().parent / "vendor" / "axe.min.js"  # axe-core 4.14.1, from npm


def test_every_page_passes_axe_wcag_aa_in_light_and_dark_and_keyboard_focus_shows() -> None:
    async def scenario(d: Dash, browser: Any) -> None:
        task_id = fill_for_screenshots(d)
        pages = ["/", "/topics", "/tasks", f"/tasks/{task_id}", "/dead", "/dead?topic=webhooks",
                 "/deliveries", "/server", "/cluster", "/schedules", "/?range=1h"]  # fmt: skip
        source = AXE.read_text()
        results: dict[str, Any] = {}
        for scheme in ("light", "dark"):
            page = await signed_in(d, browser, viewport={"width": 1280, "height": 800},
                                   color_scheme=scheme)  # fmt: skip
            for path in pages:
                await page.goto(d.origin + path)
                await page.evaluate(source)  # through the DevTools protocol: not a page script
                found = await page.evaluate(
                    """() => axe.run(document, {runOnly: {type: "tag",
                           values: ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]}})
                         .then(r => ({passes: r.passes.map(p => p.id), violations: r.violations.map(
                           v => ({id: v.id, impact: v.impact, nodes: v.nodes.map(
                             n => n.target.join(" ") + ": " + n.failureSummary)}))}))"""
                )
                results[f"{scheme} {path}"] = found
            # The keyboard: the first Tab lands on "Skip to content", shown with
            # a visible outline; Enter moves to the page's content.
            await page.goto(d.origin + "/")
            await page.keyboard.press("Tab")
            focused = page.locator(":focus")
            assert await focused.inner_text() == "Skip to content"
            outline = await focused.evaluate("el => getComputedStyle(el).outlineWidth")
            assert outline == "3px", outline
            await page.keyboard.press("Enter")
            await page.keyboard.press("Tab")
            assert await page.locator(":focus").count() == 1
            await page.context.close()
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / "axe.json").write_text(json.dumps(results, indent=2))
        violations = {k: v["violations"] for k, v in results.items() if v["violations"]}
        assert violations == {}, json.dumps(violations, indent=2)
        # axe did run, contrast included (an incomplete check would not be a pass).
        assert all("color-contrast" in v["passes"] for v in results.values()), results

    run(scenario)


def test_a_bulk_kick_of_5000_asks_for_the_count_and_leaves_none_dead() -> None:
    async def scenario(d: Dash, browser: Any) -> None:
        d.dead("bulk", 5000, error="refused")
        page = await signed_in(d, browser)
        await page.goto(f"{d.origin}/dead")
        await page.get_by_role("button", name="Kick all of topic").click()
        assert await page.locator("h1").inner_text() == "Kick these 5,000 tasks?"
        assert await page.locator("#confirm-count").inner_text() == "5000"
        await page.get_by_label("type the topic's name").fill("bulk")
        await page.get_by_role("button", name="Kick 5,000 tasks").click()
        status = page.locator("#job-status[data-finished=yes]")
        await playwright_api.expect(status).to_contain_text("5000 of 5000 done", timeout=30000)
        assert d.engine.snapshot().counts.by_state()["dead"] == 0

    run(scenario)


def test_a_form_on_another_origin_is_refused_and_logout_kills_the_cookie() -> None:
    async def scenario(d: Dash, browser: Any) -> None:
        task_id = d.add()
        page = await signed_in(d, browser)
        csrf = await page.locator('input[name="csrf"]').first.get_attribute("value")
        other = web.Application()
        form = (
            f'<form method="post" action="{d.origin}/tasks/{task_id}/delete">'
            f'<input name="csrf" value="{csrf}"><button>go</button></form>'
        )

        async def attacker(_: web.Request) -> web.Response:
            return web.Response(text=form, content_type="text/html")

        other.router.add_get("/", attacker)
        site = TestServer(other, host="127.0.0.1")
        await site.start_server()
        try:
            await page.goto(str(site.make_url("/")))
            await page.get_by_role("button", name="go").click()
            await page.wait_for_load_state()
            assert d.engine.get(task_id) is not None  # SameSite kept the cookie, or CSRF refused
        finally:
            await site.close()
        await page.goto(f"{d.origin}/")
        [cookie] = await page.context.cookies()
        await page.get_by_role("button", name="Sign out").click()
        await page.wait_for_url(f"{d.origin}/login")
        await page.context.add_cookies([cookie])  # the old cookie, put back
        await page.goto(f"{d.origin}/")
        assert page.url == f"{d.origin}/login"

    run(scenario)


async def points(page: Any, series: str) -> int:
    """How many points the page's line of ``series`` has now (its path's M and L)."""
    found = await page.locator(f'path[data-series="{series}"]').get_attribute("d")
    return len(found.split()) if found else 0


def test_charts_go_on_from_the_servers_samples_and_leave_gaps_for_no_value() -> None:
    async def scenario(d: Dash, browser: Any) -> None:
        ring = d.dashboard.producer.ring
        await wait_until_async(_true(lambda: ring.count >= 3), 10, "3 samples in the ring")
        page = await signed_in(d, browser)
        drawn = await points(page, "ready")
        assert drawn >= 3  # the server's samples: every one since its start, no zeros before
        # One more each second, on top of those (not a fresh series of one point).
        await wait_until_async(
            lambda: _more(page, "ready", drawn), 10, "a live point added to the server's"
        )
        assert await points(page, "ready") <= ring.count
        assert await points(page, "p99") == 0  # nothing fired: gaps, never a line at 0
        # Hover: the newest point's values, by name and with units.
        chart = page.locator('figure[data-chart="states"] svg')
        box = await chart.bounding_box()
        await page.mouse.move(box["x"] + box["width"] * 0.97, box["y"] + box["height"] / 2)
        tip = page.locator('figure[data-chart="states"] .tip')
        await playwright_api.expect(tip).to_be_visible()
        assert re.fullmatch(
            r"(now|\S+ s ago): ready \d+, delayed \d+, dead \d+", await tip.inner_text()
        )
        lateness = page.locator('figure[data-chart="lateness"]')
        assert await lateness.locator(".tick-y").all_text_contents() == ["0 s", "500 ms", "1 s"]

    run(scenario)


def _true(check: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def condition() -> bool:
        return check()

    return condition


async def _more(page: Any, series: str, than: int) -> bool:
    return await points(page, series) > than


async def sign_in_at(browser: Any, origin: str) -> Any:
    page = await (await browser.new_context(timezone_id="UTC")).new_page()
    await page.goto(f"{origin}/login")
    await page.get_by_label("Token").fill(TOKEN)
    await page.get_by_role("button", name="Sign in").click()
    await page.wait_for_url(f"{origin}/")
    return page


@pytest.mark.process
def test_a_task_dead_at_a_closed_port_kicked_on_the_page_is_alive_again() -> None:
    closed = free_port()  # nothing listens there: the one attempt fails
    hook = f"http://127.0.0.1:{closed}/hook"
    proc = ServerProcess("--token", TOKEN, "--web-port", "0", "--http-allow", "127.0.0.1")

    async def main() -> None:
        origin = dashboard_url(proc).rstrip("/")
        with Client(*proc.address, token=TOKEN) as dw:
            target = {"type": "http", "url": hook, "timeout": 2}
            dw.add("hooks", "payload", id="doomed", max_attempts=1, target=target)
            wait_until(lambda: (dw.get("doomed") or {}).get("state") == "dead", 15, "dead")
            # The receiver comes up and holds the request while we look: the
            # kicked task is sent again, and is alive until it answers.
            arrived, answer = asyncio.Event(), asyncio.Event()

            async def receive(_: web.Request) -> web.Response:
                arrived.set()
                await answer.wait()
                return web.Response(text="ok")

            app = web.Application()
            app.router.add_post("/hook", receive)
            receiver = web.AppRunner(app)
            await receiver.setup()
            await web.TCPSite(receiver, "127.0.0.1", closed).start()
            try:
                async with playwright_api.async_playwright() as pw:
                    browser = await launch(pw)
                    try:
                        page = await sign_in_at(browser, origin)
                        await page.goto(f"{origin}/tasks/doomed")
                        assert await page.locator("#task-state").inner_text() == "dead"
                        # Its one attempt, failed, with the error; laid out as every page.
                        attempts = page.locator("#task-attempts tbody tr")
                        assert await attempts.count() == 1
                        assert "failed" in await attempts.inner_text()
                        ARTIFACTS.mkdir(exist_ok=True)
                        shot = ARTIFACTS / "task-attempts-1280-light.png"
                        await page.screenshot(path=shot, full_page=True)
                        found = await layout_problems(page)
                        assert (found["overflow"], found["broken"]) == ([], []), found
                        await page.get_by_role("button", name="Kick").click()
                        await page.wait_for_url(f"{origin}/tasks/doomed")
                        shown = await page.locator("#task-state").inner_text()
                        assert shown in ("delayed", "delivering"), shown  # due now, or sent again
                        await asyncio.wait_for(arrived.wait(), 15)
                        task = dw.get("doomed")
                        assert task is not None and task["state"] == "delivering", (
                            task
                        )  # alive: sent again
                        answer.set()
                        await wait_until_async(
                            _true(lambda: dw.get("doomed") is None), 15, "delivered and done"
                        )
                    finally:
                        await browser.close()
            finally:
                answer.set()
                await receiver.cleanup()

    try:
        asyncio.run(main())
    finally:
        assert proc.stop() == 0


@pytest.mark.process
def test_the_stream_shows_the_banner_while_the_server_is_down_and_reconnects(
    tmp_path: Path,
) -> None:
    web_port = free_port()  # fixed across the restart: the page's origin stays the same
    store = f"sqlite:///{tmp_path / 'tasks.db'}"
    proc = ServerProcess("--web-port", str(web_port), store=store)  # no token: loopback admin
    origin = f"http://127.0.0.1:{web_port}"

    async def main() -> None:
        async with playwright_api.async_playwright() as pw:
            browser = await launch(pw)
            try:
                page = await (await browser.new_context(timezone_id="UTC")).new_page()
                await page.goto(f"{origin}/")
                ready, banner = page.locator("#count-ready"), page.locator("#banner")
                with Client(*proc.address) as dw:
                    for n in range(3):
                        dw.add("t", id=f"before{n}")
                await playwright_api.expect(ready).to_have_text("3", timeout=5000)
                assert await banner.is_hidden()
                await asyncio.to_thread(proc.stop)
                await playwright_api.expect(banner).to_be_visible(timeout=10000)
                await asyncio.to_thread(proc.start)  # the same store and web port
                await playwright_api.expect(banner).to_be_hidden(timeout=15000)
                with Client(*proc.address) as dw:
                    dw.add("t", id="after")
                await playwright_api.expect(ready).to_have_text("4", timeout=5000)
            finally:
                await browser.close()

    try:
        asyncio.run(main())
    finally:
        assert proc.stop() == 0


@pytest.mark.process
def test_after_a_restart_with_a_token_the_banner_says_to_sign_in_again() -> None:
    web_port = free_port()
    proc = ServerProcess("--token", TOKEN, "--web-port", str(web_port))
    origin = f"http://127.0.0.1:{web_port}"

    async def main() -> None:
        async with playwright_api.async_playwright() as pw:
            browser = await launch(pw)
            try:
                page = await sign_in_at(browser, origin)
                banner = page.locator("#banner")
                await playwright_api.expect(page.locator("#count-ready")).to_have_text("0")
                await asyncio.to_thread(proc.stop)
                await playwright_api.expect(banner).to_be_visible(timeout=10000)
                await asyncio.to_thread(proc.start)  # its sessions are new: ours is gone
                await playwright_api.expect(banner).to_contain_text("Signed out", timeout=15000)
                await page.reload()
                assert page.url == f"{origin}/login"
            finally:
                await browser.close()

    try:
        asyncio.run(main())
    finally:
        assert proc.stop() == 0
