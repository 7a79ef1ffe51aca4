"""The dashboard's side of completed tasks: a done task's page shows when it
completed, how and its result (escaped; hidden from viewers with
--web-hide-bodies), offers no action that does not apply, and the task list
filters on ``done``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from webkit import TOKEN, VIEWER_TOKEN, Dash, dash


def run(scenario: Callable[[Dash], Awaitable[None]], **settings: Any) -> None:
    async def main() -> None:
        async with dash(**settings) as d:
            await scenario(d)

    asyncio.run(main())


def _done(d: Dash, result: Any) -> str:
    task_id = d.add(topic="kept", retain=3600)
    now_s = time.time()
    assert d.engine.try_reserve(["kept"], now_s) is not None
    d.engine.ack(task_id, result, now_s)
    return task_id


def test_a_done_tasks_page_shows_its_result_escaped() -> None:
    async def scenario(d: Dash) -> None:
        task_id = _done(d, {"html": "<script>x</script>", "n": 7})
        await d.login(TOKEN)
        page = await (await d.client.get(f"/tasks/{task_id}")).text()
        assert 'class="badge state-done">done</span>' in page
        assert "kept once done" in page and "acked" in page
        assert "&lt;script&gt;" in page and "<script>x" not in page
        assert 'data-action="delete"' in page
        assert 'data-action="run"' not in page and 'data-action="reschedule"' not in page
        listing = await (await d.client.get("/tasks?state=done")).text()
        assert task_id in listing

    run(scenario)


def test_a_result_is_hidden_from_viewers_with_hidden_bodies() -> None:
    async def scenario(d: Dash) -> None:
        task_id = _done(d, "secret-result-text")
        await d.login(VIEWER_TOKEN)
        page = await (await d.client.get(f"/tasks/{task_id}")).text()
        assert "secret-result-text" not in page and "hidden from viewers" in page

    run(scenario, web_viewer_token=VIEWER_TOKEN, web_hide_bodies=True)
