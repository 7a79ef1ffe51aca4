"""What the dashboard's pages say and how (issue 34): words that wrap only at
separators, units people read, a task's whole target and its last attempts,
the charts' ranges and numbers, confirmations in English, "delete all of
topic". The layout itself is checked in a real browser
(tests/test_web_browser.py)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable

import pytest
from aiohttp import ClientSession, CookieJar
from conftest import free_port
from delaywheel_client import Client
from serverproc import ServerProcess
from waiting import wait_until
from webkit import Dash, dash, dashboard_url

from delaywheel.config import Settings
from delaywheel.delivery.attempt_log import ERROR_CHARS, AttemptLog
from delaywheel.web import charts, present
from delaywheel.web.live import Ring


def run(scenario: Callable[[Dash], Awaitable[None]], **settings: object) -> None:
    async def main() -> None:
        async with dash(**settings) as d:
            await scenario(d)

    asyncio.run(main())


def text_of(html: str) -> str:
    """The page's text as read: no <wbr>, the entities the checks use undone."""
    return html.replace("<wbr>", "").replace("&#39;", "'").replace("&amp;", "&")


# -- words, units, times ---------------------------------------------------------------------


def test_long_text_may_break_after_separators_only_and_stays_escaped() -> None:
    assert present.breakable("webhooks") == "webhooks"
    assert present.breakable("America/New_York") == "America/<wbr>New_<wbr>York"
    assert present.breakable("a&b/<c>") == "a&amp;<wbr>b/<wbr>&lt;c&gt;"  # no <wbr> in an entity
    assert present.breakable("rtl\u202e") == "rtl\\u202e"  # hiding characters spelled out


def test_durations_sizes_and_settings_read_as_people_write_them() -> None:
    cases = {
        0.25: "250 ms",
        1.5: "1.5 s",
        300: "5 min",
        12_000: "3 h 20 min",
        315_360_000: "10 years",
    }
    assert {s: present.duration(s) for s in cases} == cases
    assert [present.size(n) for n in (512, 1 << 20)] == ["512 bytes", "1 MiB"]
    assert present.relative(1000.0, now_s=700.0) == "in 5 min"
    assert present.relative(700.0, now_s=703.0) == "3 s ago"
    assert present.lateness(700.0, now_s=703.0) == "3 s late"
    values: dict[str, object] = {
        "lease_s": None,
        "web_insecure": False,
        "brokers": [],
        "max_delay_s": 315360000.0,
    }
    shown = {f: present.setting_value(f, v) for f, v in values.items()}
    assert shown == {"lease_s": "none", "web_insecure": "no", "brokers": "none"} | {
        "max_delay_s": "10 years"
    }


def test_every_setting_names_the_serve_option_that_sets_it() -> None:
    import dataclasses

    from delaywheel.cli.serve import serve

    options = {opt for param in serve.params for opt in param.opts}
    for field in dataclasses.fields(Settings):
        option = present.option_of(field.name)
        assert option in options or (option == "" and field.name == "max_delay_s"), field.name


def test_a_targets_secret_headers_are_redacted_and_the_rest_shown() -> None:
    target = {"type": "http", "url": "https://h.example/x?y=1", "method": "PUT", "timeout": 10}
    target["headers"] = {"Authorization": "Bearer s3", "X-Api-Key": "k", "X-Source": "dash"}
    rows = dict(present.target_rows(target))
    assert rows["url"] == "https://h.example/x?y=1" and rows["method"] == "PUT"
    assert (rows["header Authorization"], rows["header X-Api-Key"]) == ("***", "***")
    assert (rows["header X-Source"], rows["timeout"]) == ("dash", "10 s")
    amqp = {"type": "amqp", "broker": "rabbit", "exchange": "", "routing_key": "jobs"}
    assert dict(present.target_rows(amqp))["exchange"] == "the default exchange"


def test_the_task_page_shows_its_whole_target_and_badge() -> None:
    async def scenario(d: Dash) -> None:
        url = "https://hooks.example.com/delaywheel/webhook?x=1"
        target = {"type": "http", "url": url, "headers": {"Authorization": "Bearer s3cret"}}
        d.add(id="hooked", delay=60, target=target)
        await d.login()
        html = await (await d.client.get("/tasks/hooked")).text()
        shown = text_of(html)
        assert url in shown and "<th>method</th><td>POST</td>" in shown
        assert "header Authorization</th><td>***" in shown and "Bearer s3cret" not in html
        assert 'id="task-state" class="badge state-delayed">delayed<' in html
        assert "No attempt seen by this server since it started" in html

    run(scenario)


def test_counts_link_to_the_filtered_list() -> None:
    async def scenario(d: Dash) -> None:
        d.add(topic="mail")
        d.dead("mail", 2)
        await d.login()
        home = await (await d.client.get("/")).text()
        assert 'href="/tasks?state=dead"' in home and 'href="/tasks?state=ready"' in home
        topics = await (await d.client.get("/topics")).text()
        assert 'href="/tasks?topic=mail&amp;state=dead"' in topics
        dead = await (await d.client.get("/dead")).text()
        assert 'href="/dead?topic=mail&amp;group=-"' in dead

    run(scenario)


# -- the charts ------------------------------------------------------------------------------


def test_the_charts_ranges_group_samples_into_points_and_refuse_others() -> None:
    async def scenario(d: Dash) -> None:
        await d.login()
        for name, step in (("5m", 1), ("1h", 12)):
            html = await (await d.client.get("/", params={"range": name})).text()
            assert html.count(f'data-step="{step}"') == len(charts.SPECS), name
            assert "Lateness of fired tasks" in html and "<summary>The numbers</summary>" in html
        every = await (await d.client.get("/", params={"range": "all"})).text()
        assert 'aria-current="page">all kept<' in every
        bad = await d.client.get("/", params={"range": "1y"})
        assert bad.status == 400 and "range must be one of 5m, 1h, all" in await bad.text()

    run(scenario)


def test_a_chart_has_axes_units_and_its_numbers() -> None:
    ring = Ring()
    for n in range(600):  # 10 minutes, 10 ready more each second, nothing fired
        ring.append({"t": float(n), "ready": float(10 * n), "added": 10.0})
    states = charts.build(ring, charts.SPECS[0], "5m")
    assert [t.label for t in states.y_ticks] == ["0", "5000", "10k"]
    assert [t.label for t in states.x_ticks] == [
        "\u22125 min",
        *(f"\u2212{m} min" for m in (4, 3, 2, 1)),
        "now",
    ]
    assert states.rows[0].values[0] == "5990" and len(states.rows) == charts.TABLE_ROWS
    lateness = charts.build(ring, charts.SPECS[3], "1h")
    assert lateness.step == 12 and all(line.path == "" for line in lateness.lines)  # gaps, not 0
    assert charts.bucketed([1.0, 2.0, 3.0, 4.0, 5.0], 2, "mean") == [1.0, 2.5, 4.5]
    assert charts.nice_top(0.3) == 0.5 and charts.number(0.25, "s") == "250 ms"


# -- actions ---------------------------------------------------------------------------------


def test_one_selected_task_asks_kick_this_task_without_typing_a_count() -> None:
    async def scenario(d: Dash) -> None:
        [task_id] = d.dead("t", 1)
        await d.login()
        csrf = await d.csrf()
        ask = await d.post("/dead/kick", [("csrf", csrf), ("ids", task_id)])
        html = await ask.text()
        assert "<h1>Kick this task?</h1>" in html and ">Kick it</button>" in html
        assert 'name="confirm" value="1"' in html and "Type the count" not in html

    run(scenario)


def test_delete_all_of_a_topic_deletes_its_dead_only() -> None:
    async def scenario(d: Dash) -> None:
        doomed = d.dead("mail", 3, error="timeout") + d.dead("mail", 2, prefix="e")
        kept = [*d.dead("sms", 2, prefix="s"), d.add(topic="mail", id="alive")]
        await d.login()
        page = await (await d.client.get("/dead")).text()
        assert page.count('data-action="delete-topic"') == 2  # one a topic
        csrf = await d.csrf("/dead")
        form = {"csrf": csrf, "topic": "mail"}
        ask = await d.post("/dead/delete", form)
        assert "Delete these 5 tasks?" in await ask.text()
        go = await d.post("/dead/delete", {**form, "confirm": "5"})
        assert go.status == 303
        for _ in range(100):
            job = await (await d.client.get(go.headers["Location"])).text()
            if 'data-finished="yes"' in job:
                break
            await asyncio.sleep(0.02)
        assert "5 of 5 done" in job
        assert [d.engine.get(i) for i in doomed] == [None] * 5
        assert all(d.engine.get(i) is not None for i in kept)

    run(scenario)


# -- attempts and deliveries ------------------------------------------------------------------


def test_the_attempt_log_is_bounded_by_tasks_and_attempts() -> None:
    log = AttemptLog(tasks=2, per_task=3)
    for n in range(1, 6):
        log.note("a", n, 100.0 + n, 0.01, None if n == 5 else "x" * 1000)
    log.note("b", 1, 0.0, 0.1, None)
    log.note("c", 1, 0.0, 0.1, None)  # the third task: "a", noted longest ago, goes
    assert len(log) == 2 and log.of("a") == []
    log.note("b", 2, 0.0, 0.1, "refused")
    assert [a.number for a in log.of("b")] == [2, 1]  # newest first
    big = AttemptLog()
    big.note("t", 1, 0.0, 0.0, "e" * 5000)
    assert len(big.of("t")[0].error or "") == ERROR_CHARS


@pytest.mark.process
def test_a_tasks_page_shows_its_failed_attempts_and_deliveries_say_none() -> None:
    closed = free_port()  # nothing listens: each attempt is refused
    proc = ServerProcess(
        "--token", "tok", "--web-port", "0", "--http-allow", "127.0.0.1", "--retry-base", "0.05"
    )
    hook = f"http://127.0.0.1:{closed}/hook"

    async def main() -> None:
        url = dashboard_url(proc)
        async with ClientSession(cookie_jar=CookieJar(unsafe=True)) as http:
            await http.post(f"{url}login", data={"token": "tok"})
            page = await (await http.get(f"{url}tasks/doomed")).text()
            attempts = page[
                page.index('id="task-attempts"') : page.index(
                    "</table>", page.index('id="task-attempts"')
                )
            ]
            assert attempts.count('<span class="badge bad">failed</span>') == 2, attempts
            assert re.search(r'<td class="num">2</td>.*<td class="num">1</td>', attempts, re.S)
            deliveries = await (await http.get(f"{url}deliveries")).text()
            assert '<th>brokers</th><td><span class="none">none</span></td>' in deliveries

    try:
        with Client(*proc.address, token="tok") as dw:
            dw.add("hooks", "x", id="doomed", max_attempts=2, target={"type": "http", "url": hook})
            wait_until(lambda: (dw.get("doomed") or {}).get("state") == "dead", 15, "dead")
        asyncio.run(main())
    finally:
        assert proc.stop() == 0


def test_every_page_names_a_favicon_that_is_served() -> None:
    async def scenario(d: Dash) -> None:
        await d.login()
        html = await (await d.client.get("/")).text()
        assert '<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">' in html
        icon = await d.client.get("/static/favicon.svg")
        assert (icon.status, icon.content_type) == (200, "image/svg+xml")

    run(scenario)
