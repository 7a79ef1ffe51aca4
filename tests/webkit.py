"""A dashboard over a real in-process server, for tests: ``Dash`` and ``dash``.

The server is the real one (engine, memory or SQLite store, ticker) without
its TCP listener; the dashboard is its aiohttp app behind aiohttp's test
server, on a free loopback port, spoken to over real HTTP.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient, TestServer
from serverproc import ServerProcess

from delaywheel.config import Settings
from delaywheel.engine.engine import Engine
from delaywheel.net.server import Server
from delaywheel.store.memory import MemoryStore
from delaywheel.web.site import Dashboard

TOKEN = "admin-token-for-tests"
VIEWER_TOKEN = "viewer-token-for-tests"
# Ids, topics, bodies and errors that would run a script if shown raw.
HOSTILE_TEXTS = [
    '<img src=x onerror="window.__xss=1">',
    '"><script>window.__xss=1</script>',
    "javascript:window.__xss=1",
    "nul\x00byte",
    "rtl\u202egnp.exe",
]
CSRF_FIELD = re.compile(r'name="csrf" value="([^"]+)"')
DASHBOARD_LINE = re.compile(r"dashboard on (https?://\S+/)")


def dashboard_url(proc: ServerProcess) -> str:
    """The dashboard's URL, from the line a real server logs at start."""
    for line in proc.log:
        if match := DASHBOARD_LINE.search(line):
            return match.group(1)
    raise AssertionError("no 'dashboard on' line:\n" + proc.log_text())


class Dash:
    def __init__(self, client: TestClient[Any, Any], dashboard: Dashboard) -> None:
        self.client = client
        self.dashboard = dashboard
        self.engine: Engine = dashboard.server.engine
        self.base = dashboard.base
        self.origin = f"http://{client.host}:{client.port}"

    async def login(self, token: str = TOKEN) -> ClientResponse:
        return await self.client.post(
            self.base + "/login", data={"token": token}, allow_redirects=False
        )

    async def csrf(self, path: str = "/") -> str:
        text = await (await self.client.get(self.base + path)).text()
        match = CSRF_FIELD.search(text)
        assert match is not None, text
        return match.group(1)

    async def post(
        self, path: str, data: dict[str, Any] | list[tuple[str, str]], **headers: str
    ) -> ClientResponse:
        return await self.client.post(
            self.base + path,
            data=data,
            allow_redirects=False,
            headers={  # a header given as "" is left out
                k: v
                for k, v in {
                    "Origin": self.origin,
                    "Sec-Fetch-Site": "same-origin",
                    **headers,
                }.items()
                if v
            },
        )

    def add(self, **fields: Any) -> str:
        fields.setdefault("topic", "t")
        return str(self.engine.add(fields, time.time())["id"])

    def dead(self, topic: str, n: int, error: str | None = None, prefix: str = "d") -> list[str]:
        """``n`` tasks of ``topic`` killed as a last failed attempt kills them."""
        ids = []
        now_s = time.time()
        for i in range(n):
            # Due long ago: the oldest ready of its topic, the one reserve takes.
            task_id = self.add(topic=topic, id=f"{prefix}{i}", max_attempts=1, at=now_s - 1e6)
            reserved = self.engine.try_reserve([topic], now_s)
            assert reserved is not None and reserved["id"] == task_id
            self.engine.release(task_id, 0, now_s)
            if error is not None:
                self.engine.table.index.get(task_id).last_error = error  # type: ignore[union-attr]
            ids.append(task_id)
        return ids


@asynccontextmanager
async def dash(**settings: Any) -> AsyncIterator[Dash]:
    settings.setdefault("token", TOKEN)
    config = Settings(port=0, store_url="memory://", web_port=0, **settings)
    store = MemoryStore("memory://")
    await store.open()
    engine = Engine(store, now_s=time.time(), tick_s=0.05, limits=config.limits)
    server = Server(config, engine)
    server.ticker.start()
    dashboard = Dashboard(server)
    dashboard.producer.start()
    client = TestClient(TestServer(dashboard.app, host="127.0.0.1"))
    await client.start_server()
    try:
        yield Dash(client, dashboard)
    finally:
        await client.close()
        await dashboard.stop()
        server.ticker.stop()
        await engine.journal.drain()
        await store.close()
