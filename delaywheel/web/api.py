"""The JSON API under ``/api``, for scripts: the pages' data, read-only.

The guard (``site``) has checked ``Authorization: Bearer`` and set the
token's role; a viewer's view hides bodies when ``--web-hide-bodies``.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

from aiohttp import web

from delaywheel.errors import RequestError
from delaywheel.web import nesting, views
from delaywheel.web.context import Context, list_args


class Api:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    async def stats(self, request: web.Request) -> web.StreamResponse:
        server = self.ctx.server
        return web.json_response(server.stats(time.time()) | {"live": self.ctx.producer.latest})

    async def topics(self, request: web.Request) -> web.StreamResponse:
        rows = await views.topics(self.ctx.server.engine, request.query.get("filter", ""))
        return web.json_response([vars(row) for row in rows])

    async def tasks(self, request: web.Request) -> web.StreamResponse:
        try:
            topic, state, cursor, limit = list_args(request)
            page = await views.list_page(self.ctx.server.engine, topic, state, cursor, limit)
        except RequestError as exc:
            return _error(exc)
        hide = self.ctx.hide_bodies(request)
        return web.json_response({"tasks": [_task(t, hide) for t in page.tasks], "next": page.next})

    async def task(self, request: web.Request) -> web.StreamResponse:
        try:
            engine = self.ctx.server.engine
            task = await engine.through_store(partial(engine.get, request.match_info["id"]))
        except RequestError as exc:
            return _error(exc)
        if task is None:
            return web.json_response({"error": "not_found"}, status=404)
        return web.json_response(_task(task, self.ctx.hide_bodies(request)))

    async def dead(self, request: web.Request) -> web.StreamResponse:
        groups = await views.dead_groups(self.ctx.server.engine)
        return web.json_response(
            [{"topic": g.topic, "error": g.error, "count": g.count, "ids": g.ids} for g in groups]
        )

    async def cluster(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(self.ctx.server.cluster_map())


def _error(exc: RequestError) -> web.Response:
    return web.json_response({"error": exc.code, "message": exc.message}, status=400)


def _task(task: dict[str, Any], hide_body: bool) -> dict[str, Any]:
    shown = dict(task)
    body = shown.pop("body")
    if not hide_body:
        # nesting.shown: any depth the protocol accepts (collapsed past 64 levels).
        shown["body"] = body.hex() if isinstance(body, bytes) else nesting.shown(body)
        shown["body_is_bytes"] = isinstance(body, bytes)
    return shown
