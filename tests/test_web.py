"""The dashboard over real HTTP (aiohttp's test client): sign-in, roles, CSRF,
headers, escaping, actions through the engine's verbs, the event stream, paging."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from webkit import HOSTILE_TEXTS, TOKEN, VIEWER_TOKEN, Dash, dash

from delaywheel.config import ConfigError, Settings
from delaywheel.web.live import MAX_STREAMS, RING_SAMPLES, Ring, chart_values
from delaywheel.web.site import CSP

Scenario = Callable[[Dash], Awaitable[None]]


def run(scenario: Scenario, **settings: Any) -> None:
    async def main() -> None:
        async with dash(**settings) as d:
            await scenario(d)

    asyncio.run(main())


PAGES = ["/", "/topics", "/tasks", "/dead", "/deliveries", "/schedules", "/server", "/cluster"]


def mutating_routes(app: web.Application) -> list[str]:
    """Every POST route but sign-in and sign-out, from the router itself."""
    found = []
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("path") or info.get("formatter")
        if route.method == "POST" and path and not path.endswith(("/login", "/logout")):
            found.append(path.replace("{id}", "some-id"))
    return found


# -- sign-in -----------------------------------------------------------------------------


def test_pages_redirect_to_login_and_the_cookie_flags() -> None:
    async def scenario(d: Dash) -> None:
        for page in [*PAGES, "/tasks/x"]:
            reply = await d.client.get(page, allow_redirects=False)
            assert (reply.status, reply.headers["Location"]) == (303, "/login"), page
        form = await d.client.get("/login")
        assert form.status == 200 and 'name="token"' in await form.text()
        bad = await d.login("wrong")
        assert bad.status == 401 and "That token is not right" in await bad.text()
        good = await d.login()
        assert (good.status, good.headers["Location"]) == (303, "/")
        cookie = good.headers["Set-Cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
        assert "Secure" not in cookie  # plain HTTP: a Secure cookie would never come back
        home = await d.client.get("/")
        assert home.status == 200 and "Overview" in await home.text()

    run(scenario)


def test_five_failures_in_a_row_give_429_even_with_the_right_token() -> None:
    async def scenario(d: Dash) -> None:
        for _ in range(5):
            assert (await d.login("nope")).status == 401
        blocked = await d.login()
        assert blocked.status == 429 and "wait a little" in await blocked.text()
        assert blocked.headers["Retry-After"] == "1"

    run(scenario)


def test_logout_revokes_the_session() -> None:
    async def scenario(d: Dash) -> None:
        await d.login()
        sid = next(c.value for c in d.client.session.cookie_jar if c.key == "delaywheel")
        csrf = await d.csrf()
        out = await d.post("/logout", {"csrf": csrf})
        assert (out.status, out.headers["Location"]) == (303, "/login")
        d.client.session.cookie_jar.update_cookies({"delaywheel": sid})  # the old cookie, kept
        again = await d.client.get("/", allow_redirects=False)
        assert (again.status, again.headers["Location"]) == (303, "/login")

    run(scenario)


def test_sessions_expire_when_idle() -> None:
    async def scenario(d: Dash) -> None:
        await d.login()
        clock = [time.monotonic()]
        d.dashboard.sessions._clock = lambda: clock[0]
        assert (await d.client.get("/", allow_redirects=False)).status == 200
        clock[0] += 3601
        assert (await d.client.get("/", allow_redirects=False)).status == 303

    run(scenario)


# -- roles and CSRF --------------------------------------------------------------------------


def test_a_viewer_gets_403_on_every_mutating_route_and_sees_no_buttons() -> None:
    async def scenario(d: Dash) -> None:
        task_id = d.add(id="some-id")
        d.dead("t", 1)
        assert (await d.login(VIEWER_TOKEN)).status == 303
        csrf = await d.csrf()
        routes = mutating_routes(d.dashboard.app)
        # four task actions, two bulk ones, three of schedules, two of topics
        assert len(routes) == 11
        for path in routes:
            reply = await d.post(path, {"csrf": csrf, "topic": "t", "confirm": "1"})
            assert reply.status == 403, path
            assert "Viewers cannot change tasks" in await reply.text()
        for path in [*PAGES, f"/tasks/{task_id}"]:
            reply = await d.client.get(path)
            assert reply.status == 200 and "data-action" not in await reply.text(), path
        assert (
            d.engine.get(task_id) is not None and d.engine.snapshot().counts.by_state()["dead"] == 1
        )

    run(scenario, web_viewer_token=VIEWER_TOKEN)


def test_viewers_may_be_kept_from_bodies() -> None:
    async def scenario(d: Dash) -> None:
        task_id = d.add(body="secret-body-text")
        await d.login(VIEWER_TOKEN)
        page = await (await d.client.get(f"/tasks/{task_id}")).text()
        listing = await (await d.client.get("/tasks")).text()
        assert "secret-body-text" not in page + listing and "hidden from viewers" in page

    run(scenario, web_viewer_token=VIEWER_TOKEN, web_hide_bodies=True)


def test_csrf_refused_without_the_token_and_from_a_foreign_origin() -> None:
    async def scenario(d: Dash) -> None:
        task_id = d.add()
        await d.login()
        csrf = await d.csrf()
        path = f"/tasks/{task_id}/delete"
        for data, headers in (
            ({}, {}),
            ({"csrf": "forged"}, {}),
            ({"csrf": csrf}, {"Origin": "http://evil.example"}),
            ({"csrf": csrf}, {"Sec-Fetch-Site": "cross-site"}),
            ({"csrf": csrf}, {"Origin": "null", "Sec-Fetch-Site": ""}),
        ):
            reply = await d.post(path, data, **headers)
            assert reply.status == 403, (data, headers)
            assert "Session expired" in await reply.text()
        assert d.engine.get(task_id) is not None
        # Chromium's own form under no-referrer: Origin null, same-origin fetch.
        done = await d.post(path, {"csrf": csrf}, Origin="null")
        assert done.status == 303 and d.engine.get(task_id) is None

    run(scenario)


def test_without_a_token_loopback_is_the_admin_with_csrf_still_checked() -> None:
    async def scenario(d: Dash) -> None:
        task_id = d.add()
        assert (await d.client.get("/", allow_redirects=False)).status == 200
        assert (await d.client.get("/login", allow_redirects=False)).status == 303
        csrf = await d.csrf(f"/tasks/{task_id}")
        assert (await d.post(f"/tasks/{task_id}/delete", {})).status == 403
        assert (await d.post(f"/tasks/{task_id}/delete", {"csrf": csrf})).status == 303
        assert d.engine.get(task_id) is None

    run(scenario, token=None)


def test_settings_refuse_an_open_dashboard_beyond_loopback() -> None:
    with pytest.raises(ConfigError, match="--web-insecure"):
        Settings(web_port=0, web_host="0.0.0.0")
    Settings(web_port=0, web_host="0.0.0.0", web_insecure=True)
    Settings(web_port=0, web_host="0.0.0.0", token="t")
    with pytest.raises(ConfigError, match="needs --token"):
        Settings(web_viewer_token="v")
    with pytest.raises(ConfigError, match="differ"):
        Settings(token="same", web_viewer_token="same")
    for bad in ("dash", "/dash/", "/a b", "//x"):
        with pytest.raises(ConfigError, match="base path"):
            Settings(web_base_path=bad)


# -- headers ---------------------------------------------------------------------------------


def test_every_response_carries_the_csp_404s_and_static_files_too() -> None:
    async def scenario(d: Dash) -> None:
        replies = [
            await d.client.get(path, allow_redirects=False)
            for path in ("/login", "/", "/nowhere", "/static/dash.css", "/static/dash.js",
                         "/static/missing.js", "/api/stats")
        ]  # fmt: skip
        await d.login()
        replies += [await d.client.get(p) for p in ("/cluster", "/api/cluster")]
        replies += [await d.client.get(p) for p in ("/", "/nowhere", "/tasks/none")]
        for reply in replies:
            headers = reply.headers
            assert headers["Content-Security-Policy"] == CSP, reply.url
            assert headers["X-Content-Type-Options"] == "nosniff"
            assert headers["Referrer-Policy"] == "no-referrer"
        assert {r.status for r in replies} >= {200, 303, 401, 404}
        page = replies[-3]
        assert page.headers["Cache-Control"] == "no-store"
        assert "no-store" not in replies[3].headers.get("Cache-Control", "")

    run(scenario)


def test_no_inline_script_or_style_on_any_page() -> None:
    async def scenario(d: Dash) -> None:
        task_id = d.add()
        d.dead("t", 2, error="boom")
        await d.login()
        pages = [*PAGES, f"/tasks/{task_id}", "/dead?topic=t&group=%2Bboom", "/login"]
        for page in pages:
            html = await (await d.client.get(page)).text()
            assert not re.search(r"<script(?![^>]*\bsrc=)", html), page
            assert not re.search(r"\s(style|on\w+)=", html), page
            assert "<style" not in html, page

    run(scenario)


# -- hostile data ----------------------------------------------------------------------------

HOSTILE = HOSTILE_TEXTS


def test_hostile_ids_topics_bodies_and_errors_never_appear_raw() -> None:
    async def scenario(d: Dash) -> None:
        ids = []
        for n, text in enumerate(HOSTILE):
            ids.append(d.add(id=text, topic=text, body=text))
            d.dead(text, 1, error=text, prefix=f"dead{n}-{text}")
            d.engine.schedule_add({"id": text, "cron": "0 3 * * *", "topic": text}, time.time())
        d.engine.schedule_pause(HOSTILE[1], HOSTILE[0])  # the note shown too
        await d.login()
        pages = list(PAGES)
        pages += [f"/tasks/{quote(i)}" + v for i in ids for v in ("", "?view=json", "?view=hex")]
        pages += [f"/dead?topic={quote(t)}&group={quote('+' + t)}" for t in HOSTILE]
        pages += [f"/tasks?topic={quote(t)}" for t in HOSTILE]
        for page in pages:
            reply = await d.client.get(page)
            html = await reply.text()
            assert reply.status == 200, (page, html)
            for text in HOSTILE:
                for raw in (text, "<img src=x", "<script>window", "\x00", "\u202e"):
                    assert raw not in html or raw == text == HOSTILE[2], (page, raw)
            assert 'href="javascript:' not in html
        detail = await (await d.client.get(f"/tasks/{quote(HOSTILE[4])}")).text()
        assert "rtl\\u202egnp.exe" in detail  # the mark is spelled out, not obeyed
        assert "&lt;img src=x onerror" in await (await d.client.get("/topics")).text()

    run(scenario)


def quote(text: str) -> str:
    from urllib.parse import quote as q

    return q(text, safe="")


# -- schedules -------------------------------------------------------------------------------


def test_the_schedules_page_lists_them_and_its_actions_go_through_the_engine() -> None:
    async def scenario(d: Dash) -> None:
        now_s = time.time()
        d.engine.schedule_add(
            {"id": "nightly", "cron": "0 3 * * *", "tz": "Europe/Paris", "topic": "reports"}, now_s
        )
        d.engine.schedule_add({"id": "tick", "every": 3600, "topic": "t"}, now_s)
        await d.login()
        html = await (await d.client.get("/schedules")).text()
        assert 'href="/schedules"' in html  # in the nav
        nightly = html[html.index('data-schedule="nightly"') : html.index('data-schedule="tick"')]
        assert "0 3 * * *" in nightly and "Europe/Paris" in nightly and " UTC" in nightly
        assert '<span class="badge ok">active</span>' in nightly
        assert "<code>every 1 h</code>" in html  # in human units
        csrf = await d.csrf("/schedules")
        paused = await d.post("/schedules/nightly/pause", {"csrf": csrf})
        assert (paused.status, paused.headers["Location"]) == (303, "/schedules")
        state = d.engine.schedule_get("nightly")
        assert state is not None and state["paused"] and state["next"] is None
        assert d.engine.journal.pending() is None  # answered once durable
        html = await (await d.client.get("/schedules")).text()
        assert "Paused &#39;nightly&#39;." in html and 'data-action="resume"' in html
        await d.post("/schedules/nightly/resume", {"csrf": csrf})
        state = d.engine.schedule_get("nightly")
        assert state is not None and not state["paused"] and state["next"] > now_s
        triggered = await d.post("/schedules/tick/trigger", {"csrf": csrf})
        assert triggered.status == 303
        html = await (await d.client.get("/schedules")).text()
        [task_id] = re.findall(r"Triggered &#39;tick&#39;: task &#39;([^&]+)&#39;", html)
        task = d.engine.get(task_id)
        assert task is not None and task["topic"] == "t"
        missing = await d.post("/schedules/nope/pause", {"csrf": csrf})
        assert missing.status == 303
        html = await (await d.client.get("/schedules")).text()
        assert "nope" in html and "Paused" not in html  # the engine's not_found, said

    run(scenario)


def test_the_topics_page_shows_settings_and_pauses_and_resumes_a_topic() -> None:
    async def scenario(d: Dash) -> None:
        now_s = time.time()
        d.engine.add({"topic": "mail", "body": "x"}, now_s)
        d.engine.topic_set("hooks", {"rate": 50, "burst": 10, "concurrency": 8}, now_s)
        await d.login()
        html = await (await d.client.get("/topics")).text()
        hooks = html[html.index(">hooks<") :]
        assert "50.0/s (burst 10)" in hooks and "8 at once" in hooks  # settings, no task
        csrf = await d.csrf("/topics")
        paused = await d.post("/topics/mail/pause", {"csrf": csrf})
        assert (paused.status, paused.headers["Location"]) == (303, "/topics")
        assert d.engine.topic_get("mail", now_s)["paused"]
        assert d.engine.journal.pending() is None  # answered once durable
        html = await (await d.client.get("/topics")).text()
        assert "Paused topic &#39;mail&#39;." in html and 'data-action="resume"' in html
        assert d.engine.try_reserve("mail", time.time()) is None
        await d.post("/topics/mail/resume", {"csrf": csrf})
        assert not d.engine.topic_get("mail", time.time())["paused"]
        assert d.engine.try_reserve("mail", time.time())["body"] == "x"
        # A task's priority on its page and in the list.
        urgent = d.engine.add({"topic": "urgent", "priority": 3}, now_s)["id"]
        html = await (await d.client.get(f"/tasks/{urgent}")).text()
        assert '<td id="task-priority">3</td>' in html
        html = await (await d.client.get("/tasks?topic=urgent")).text()
        assert '<th class="num">priority</th>' in html and '<td class="num">3</td>' in html

    run(scenario)


def test_schedules_page_in_pages_of_100_by_cursor() -> None:
    async def scenario(d: Dash) -> None:
        for n in range(105):
            d.engine.schedule_add({"id": f"s{n:03}", "every": 60, "topic": "t"}, time.time())
        await d.login()
        first = await (await d.client.get("/schedules")).text()
        assert first.count("data-schedule=") == 100
        [next_url] = re.findall(r'href="(/schedules\?cursor=[^"]+)" rel="next"', first)
        second = await (await d.client.get(next_url.replace("&amp;", "&"))).text()
        ids = re.findall(r'data-schedule="([^"]+)"', first + second)
        assert ids == [f"s{n:03}" for n in range(105)] and 'rel="next"' not in second

    run(scenario)


# -- the cluster map -------------------------------------------------------------------------


def test_the_cluster_page_on_a_single_node_is_one_partition_it_owns() -> None:
    async def scenario(d: Dash) -> None:
        await d.login()
        html = await (await d.client.get("/cluster")).text()
        assert 'href="/cluster"' in html  # in the nav
        rows = re.findall(r'<tr class="mine" data-partition="(\d+)">', html)
        assert rows == ["0"] and html.count("data-partition=") == 1
        assert '<span id="cluster-mine">1</span> of <span id="cluster-partitions">1</span>' in html
        assert "single-node store" in html and "(this node)" in html
        api = await d.client.get("/api/cluster", headers={"Authorization": f"Bearer {TOKEN}"})
        assert await api.json() == d.dashboard.server.cluster_map()

    run(scenario)


def test_the_cluster_map_of_a_shared_keyspace_marks_this_nodes_partitions_escaped() -> None:
    from delaywheel.ha.sharing import Owner, Sharing

    async def scenario(d: Dash) -> None:
        here, other = HOSTILE[0], HOSTILE[1]
        sharing = Sharing(node=here, address="10.0.0.1:7711", partitions=4, lease_s=5.0)
        sharing.owners = {
            0: Owner(here, "10.0.0.1:7711", 3),
            1: Owner(other, HOSTILE[2], 9),
            2: Owner(here, "10.0.0.1:7711", 4),
        }  # partition 3: no owner just now
        d.engine.ownership = sharing  # read by the page only: no request goes through it
        await d.login()
        html = await (await d.client.get("/cluster")).text()
        assert re.findall(r'<tr class="mine" data-partition="(\d+)">', html) == ["0", "2"]
        assert re.findall(r'<tr data-partition="(\d+)">', html) == ["1", "3"]
        assert '<span id="cluster-mine">2</span> of <span id="cluster-partitions">4</span>' in html
        assert "1 without an owner just now" in html and "leases last 5.0 s" in html
        for raw in ("<img src=x", "<script>window"):
            assert raw not in html
        assert "&lt;img src=x onerror" in html and "&#34;&gt;&lt;script&gt;" in html

    run(scenario)


# -- actions ---------------------------------------------------------------------------------


def test_task_actions_go_through_the_engine_and_are_durable() -> None:
    async def scenario(d: Dash) -> None:
        await d.login()
        csrf = await d.csrf()
        later = d.add(delay=3600)
        [dead] = d.dead("t", 1)
        run_now = await d.post(f"/tasks/{later}/run", {"csrf": csrf})
        assert run_now.status == 303 and d.engine.get(later)["state"] == "ready"  # type: ignore[index]
        await d.post(f"/tasks/{later}/reschedule", {"csrf": csrf, "delay": "120"})
        moved = d.engine.get(later)
        assert moved is not None and moved["state"] == "delayed" and moved["at"] > time.time() + 100
        bad = await d.post(f"/tasks/{later}/reschedule", {"csrf": csrf, "delay": "soon"})
        assert bad.status == 303
        page = await (await d.client.get(bad.headers["Location"])).text()
        assert "delay must be a number of seconds" in page
        assert (await d.post(f"/tasks/{dead}/kick", {"csrf": csrf})).status == 303
        assert d.engine.get(dead)["state"] == "ready"  # type: ignore[index]
        again = await d.post(f"/tasks/{dead}/kick", {"csrf": csrf})
        assert "not dead" in await (await d.client.get(again.headers["Location"])).text()
        assert (await d.post(f"/tasks/{later}/delete", {"csrf": csrf})).status == 303
        assert d.engine.get(later) is None
        # Replies came after the store had each change: nothing is pending.
        assert d.engine.journal.pending() is None
        stored = {i async for batch in d.engine.store.load() for i, _ in batch}
        assert dead in stored and later not in stored

    run(scenario)


def test_every_action_is_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(d: Dash) -> None:
        await d.login()
        csrf = await d.csrf()
        task_id = d.add()
        with caplog.at_level(logging.INFO, logger="delaywheel.web"):
            await d.post(f"/tasks/{task_id}/delete", {"csrf": csrf})
        # The dashboard's own lines (aiohttp's access log, when another test
        # left it at INFO, is not the dashboard's).
        [line] = [
            r.getMessage()
            for r in caplog.records
            if r.name == "delaywheel.web" and "delete" in r.getMessage()
        ]
        assert re.fullmatch(rf"web admin:\S+: delete '{task_id}', 1 task", line)

    run(scenario)


async def _finish(d: Dash, location: str) -> str:
    for _ in range(200):
        page = await (await d.client.get(location)).text()
        if 'data-finished="yes"' in page:
            return page
        await asyncio.sleep(0.05)
    raise AssertionError("the job did not finish")


def test_bulk_kick_of_a_group_confirms_the_count_and_past_1000_the_topic() -> None:
    async def scenario(d: Dash) -> None:
        d.dead("big", 1200, error="timeout")
        d.dead("big", 3, error="refused", prefix="r")
        await d.login()
        csrf = await d.csrf()
        groups = await (await d.client.get("/dead")).text()
        assert "timeout" in groups and "1200" in groups and "refused" in groups
        form = {"csrf": csrf, "topic": "big", "group": "+timeout"}
        ask = await d.post("/dead/kick", form)
        text = await ask.text()
        assert ask.status == 200 and "1200" in text and 'name="confirm_topic"' in text
        wrong = await d.post("/dead/kick", {**form, "confirm": "1200", "confirm_topic": "bi"})
        assert "did not match" in await wrong.text()
        assert d.engine.snapshot().counts.by_state()["dead"] == 1203
        go = await d.post("/dead/kick", {**form, "confirm": "1200", "confirm_topic": "big"})
        assert go.status == 303 and "/jobs/" in go.headers["Location"]
        page = await _finish(d, go.headers["Location"])
        assert "1200 of 1200 done" in page
        states = d.engine.snapshot().counts.by_state()
        assert (states["dead"], states["ready"]) == (3, 1200)
        assert d.engine.journal.pending() is None

    run(scenario)


def test_bulk_delete_of_a_selection() -> None:
    async def scenario(d: Dash) -> None:
        ids = d.dead("t", 5)
        await d.login()
        csrf = await d.csrf()
        picked = [("csrf", csrf), ("ids", ids[0]), ("ids", ids[3])]
        ask = await d.post("/dead/delete", picked)
        assert "Delete these 2 tasks?" in await ask.text()
        go = await d.post("/dead/delete", [*picked, ("confirm", "2")])
        assert "2 of 2 done" in await _finish(d, go.headers["Location"])
        assert [d.engine.get(i) is None for i in ids] == [True, False, False, True, False]

    run(scenario)


# -- pages and the API -----------------------------------------------------------------------


def test_the_id_box_jumps_to_a_task_and_pages_show_it() -> None:
    async def scenario(d: Dash) -> None:
        task_id = d.add(id="a/b?c#d", body={"n": 1})
        await d.login()
        reply = await d.client.get("/tasks", params={"id": task_id})
        html = (await reply.text()).replace("<wbr>", "")  # line breaks after separators
        assert reply.status == 200 and "a/b?c#d" in html and "Run now" in html
        as_json = await (await d.client.get("/tasks/a%2Fb%3Fc%23d?view=json")).text()
        assert "&#34;n&#34;: 1" in as_json
        missing = await d.client.get("/tasks/nope")
        assert missing.status == 404 and "No task with id nope" in await missing.text()
        topics = await (await d.client.get("/topics", params={"filter": "T"})).text()
        assert ">t</a>" in topics

    run(scenario)


def test_the_api_takes_a_bearer_token() -> None:
    async def scenario(d: Dash) -> None:
        task_id = d.add(body=b"\x00\x01")
        assert (await d.client.get("/api/stats")).status == 401
        for token in (TOKEN, VIEWER_TOKEN):
            auth = {"Authorization": f"Bearer {token}"}
            stats = await (await d.client.get("/api/stats", headers=auth)).json()
            assert stats["states"]["ready"] == 1
            task = await (await d.client.get(f"/api/tasks/{task_id}", headers=auth)).json()
            assert (task["body"], task["body_is_bytes"]) == ("0001", True)
            page = await (await d.client.get("/api/tasks", headers=auth)).json()
            assert [t["id"] for t in page["tasks"]] == [task_id] and page["next"] is None

    run(scenario, web_viewer_token=VIEWER_TOKEN)


def test_a_base_path_prefixes_every_route_and_link() -> None:
    async def scenario(d: Dash) -> None:
        task_id = d.add()
        assert (await d.client.get("/dash/", allow_redirects=False)).headers[
            "Location"
        ] == "/dash/login"
        await d.login()
        html = await (await d.client.get(f"/dash/tasks/{task_id}")).text()
        assert f'action="/dash/tasks/{task_id}/delete"' in html
        assert 'href="/dash/static/dash.css"' in html
        assert (await d.client.get("/dash/static/dash.js")).status == 200

    run(scenario, web_base_path="/dash")


# -- paging ----------------------------------------------------------------------------------

ROW_ID = re.compile(r'class="task-id" href="[^"]*">([^<]+)</a>')
NEXT = re.compile(r'href="([^"]+)" rel="next"')


async def _all_pages(
    d: Dash, url: str, between: Callable[[], None] | None = None
) -> list[list[str]]:
    pages = []
    next_url: str | None = url
    while next_url is not None:
        html = await (await d.client.get(next_url.replace("&amp;", "&"))).text()
        pages.append(ROW_ID.findall(html))
        match = NEXT.search(html)
        next_url = match.group(1) if match else None
        if between is not None:
            between()
    return pages


def test_paging_1234_tasks_at_100_a_page() -> None:
    async def scenario(d: Dash) -> None:
        ids = [d.add(id=f"p{n:04}") for n in range(1234)]
        await d.login()
        pages = await _all_pages(d, "/tasks?limit=100")
        assert [len(p) for p in pages] == [100] * 12 + [34]
        assert [i for p in pages for i in p] == ids

    run(scenario)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(20, 120),
    st.lists(
        st.tuples(st.sampled_from(["add", "delete", "update"]), st.integers(0, 200)), max_size=60
    ),
    st.integers(5, 30),
)
def test_paging_during_changes_shows_each_survivor_once(
    start: int, changes: list[tuple[str, int]], limit: int
) -> None:
    async def scenario(d: Dash) -> None:
        initial = [d.add(id=f"s{n}") for n in range(start)]
        todo = list(changes)
        removed: set[str] = set()

        def change() -> None:
            for _ in range(3):
                if not todo:
                    return
                what, n = todo.pop()
                task_id = f"s{n % start}"
                if what == "add":
                    d.add(id=f"new{len(todo)}-{n}")
                elif what == "delete" and d.engine.delete(task_id):
                    removed.add(task_id)
                elif what == "update" and d.engine.get(task_id) is not None:
                    d.engine.update(task_id, {"body": "changed"}, time.time())

        await d.login()
        seen = [i for p in await _all_pages(d, f"/tasks?limit={limit}", change) for i in p]
        assert len(seen) == len(set(seen))  # nobody twice
        survivors = [i for i in initial if i not in removed]
        assert set(survivors) <= set(seen)  # every task there from start to end, once

    run(scenario)


# -- live numbers ----------------------------------------------------------------------------


def test_the_event_stream_frames_snapshots() -> None:
    async def scenario(d: Dash) -> None:
        await d.login()
        reply = await d.client.get("/events")
        assert reply.headers["Content-Type"] == "text/event-stream"
        assert reply.headers["Content-Security-Policy"] == CSP
        assert await reply.content.readline() == b"retry: 3000\n"
        assert await reply.content.readline() == b"\n"
        d.add()
        events = []
        while len(events) < 2:
            lines = [await reply.content.readline() for _ in range(3)]
            assert lines[0] == b"event: snapshot\n" and lines[2] == b"\n"
            assert lines[1].startswith(b"data: {") and lines[1].endswith(b"}\n")
            events.append(json.loads(lines[1][6:]))
        assert events[-1]["states"]["ready"] == 1
        assert set(events[-1]["rates"]) == {"added", "fired", "delivered", "failed", "acked"}
        assert {"p50", "p99"} == set(events[-1]["lateness"])
        reply.close()

    run(scenario)


def test_streams_are_capped_and_need_a_session() -> None:
    async def scenario(d: Dash) -> None:
        assert (await d.client.get("/events", allow_redirects=False)).status == 303
        await d.login()
        streams = [await d.client.get("/events") for _ in range(MAX_STREAMS)]
        assert all(s.status == 200 for s in streams)
        refused = await d.client.get("/events")
        assert refused.status == 503
        for s in streams:
            s.close()
        await asyncio.sleep(0.1)

    run(scenario)


def test_one_producer_whatever_the_viewers() -> None:
    async def scenario(d: Dash) -> None:
        await d.login()
        producer = d.dashboard.producer
        before = producer.samples
        streams = [await d.client.get("/events") for _ in range(10)]
        await asyncio.sleep(2.5)
        # One snapshot a second (give or take the boundary), not one per viewer.
        assert 1 <= producer.samples - before <= 4
        for s in streams:
            s.close()

    run(scenario)


def test_the_ring_holds_an_hour_in_under_a_megabyte() -> None:
    ring = Ring()
    for n in range(RING_SAMPLES + 10):
        ring.append({"t": float(n), "ready": float(n)})
    assert ring.nbytes() < 1_000_000
    assert ring.count == RING_SAMPLES
    assert ring.series("t", last=3) == [RING_SAMPLES + 7.0, RING_SAMPLES + 8.0, RING_SAMPLES + 9.0]


def test_charts_start_at_the_servers_start_with_gaps_not_zeros() -> None:
    async def scenario(d: Dash) -> None:
        await d.login()
        producer = d.dashboard.producer
        samples = producer.ring.count  # since this server started: no padding before it
        html = await (await d.client.get("/")).text()
        values = dict(re.findall(r'data-series="(\w+)" data-values="([^"]*)"', html))
        assert set(values) == {
            "ready",
            "delayed",
            "dead",
            "added",
            "fired",
            "acked",
            "delivered",
        } | {"failed", "p50", "p99"}
        assert len(values["ready"].split(",")) == samples >= 1  # 5 min: a point a second
        assert set(values["p99"].split(",")) == {""}  # nothing fired: no lateness, not 0
        [until] = re.findall(r'class="charts" data-until="([\d.]+)"', html)
        assert float(until) == producer.ring.series("t")[-1]  # exactly: the stream's t

    run(scenario)
    assert chart_values([1.0, float("nan"), 0.25]) == "1,,0.25"


# -- load ----------------------------------------------------------------------------------


def test_a_body_over_64_kib_is_cut_on_its_page() -> None:
    async def scenario(d: Dash) -> None:
        task_id = d.add(body="x" * 200_000)
        await d.login()
        html = await (await d.client.get(f"/tasks/{task_id}")).text()
        assert "195.3 KiB, cut at 64 KiB." in html
        assert html.count("x" * 1000) < 3 * 66  # text, JSON and hex views, each cut
        assert "x" * (64 * 1024 + 1) not in html

    run(scenario)


def test_at_most_eight_dashboard_requests_run_at_once() -> None:
    async def scenario(d: Dash) -> None:
        await d.login()
        limit = d.dashboard._limit  # the gate every page and API request goes through
        for _ in range(8):  # eight requests in progress
            await limit.acquire()
        waiting = asyncio.ensure_future(d.client.get("/topics"))
        await asyncio.sleep(0.3)  # time passing is the test: it must still wait
        assert not waiting.done()
        static = await d.client.get("/static/dash.css")  # static files are not gated
        assert static.status == 200
        limit.release()
        response = await asyncio.wait_for(waiting, 5)
        assert response.status == 200
        for _ in range(7):
            limit.release()

    run(scenario)


def test_a_quiet_stream_gets_a_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no snapshot for HEARTBEAT_S (15 s; 0.3 s here), the stream sends an
    SSE comment, so proxies and the browser see it alive."""
    from delaywheel.web import pages

    monkeypatch.setattr(pages, "HEARTBEAT_S", 0.3)

    async def scenario(d: Dash) -> None:
        await d.login()
        await d.dashboard.producer.stop()  # no more snapshots: only heartbeats
        reply = await d.client.get("/events")
        assert await reply.content.readline() == b"retry: 3000\n"
        assert await reply.content.readline() == b"\n"
        lines = [await reply.content.readline() for _ in range(3)]
        assert lines[0] == b"event: snapshot\n"  # the latest, at once
        heartbeat = [await reply.content.readline() for _ in range(2)]
        assert heartbeat == [b": heartbeat\n", b"\n"]
        reply.close()

    run(scenario)


def test_the_server_page_shows_settings_with_secrets_redacted() -> None:
    async def scenario(d: Dash) -> None:
        await d.login()
        html = await (await d.client.get("/server")).text()
        assert "--web-<wbr>viewer-<wbr>token" in html and "***" in html
        assert TOKEN not in html and VIEWER_TOKEN not in html
        # Labelled, in human units: no Python reprs.
        for repr_ in (">None<", ">False<", ">True<", ">[]<", "315360000.0"):
            assert repr_ not in html, repr_
        assert ">10 years<" in html  # --max-delay's default (315360000 s)

    run(scenario, web_viewer_token=VIEWER_TOKEN)
