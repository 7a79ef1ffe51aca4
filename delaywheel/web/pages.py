"""The pages' handlers (GET): overview, topics, tasks, one task, dead, deliveries,
server, cluster, a bulk job's progress, and the event stream.

Reads only: every page renders what ``views`` reads from the engine (or the
producer's latest snapshot), escaped by the templates.
"""

from __future__ import annotations

import asyncio
from functools import partial
from urllib.parse import quote, urlencode

from aiohttp import web

from delaywheel.delivery.attempt_log import Attempt
from delaywheel.engine.task import DEAD, STATES
from delaywheel.errors import RequestError
from delaywheel.logs import shown_settings
from delaywheel.web import charts, present, views
from delaywheel.web.context import Context, list_args
from delaywheel.web.live import HEARTBEAT, HEARTBEAT_S, PREAMBLE, RING_SAMPLES, frame


class Pages:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    async def home(self, request: web.Request) -> web.StreamResponse:
        ctx = self.ctx
        chart_range = request.query.get("range", "5m")
        if chart_range not in charts.RANGES:
            return ctx.error(request, 400, f"range must be one of {', '.join(charts.RANGES)}")
        snap = ctx.producer.latest or ctx.producer.sample()
        engine = ctx.server.engine.snapshot()
        return ctx.render(
            request,
            "home.html",
            title="Overview",
            snap=snap,
            states=STATES,
            wheel=engine.wheel,
            slots=engine.slots,
            tick_s=engine.tick_s,
            charts=charts.charts(ctx.producer.ring, chart_range),
            chart_range=chart_range,
            ranges=charts.RANGE_LABELS,
            box=charts.BOX,
            charts_until=ctx.chart_until(),
            ring_samples=RING_SAMPLES,
            started_s=ctx.server.engine.started_s,
        )

    async def topics(self, request: web.Request) -> web.StreamResponse:
        name_filter = request.query.get("filter", "")
        rows = await views.topics(self.ctx.server.engine, name_filter)
        return self.ctx.render(
            request, "topics.html", title="Topics", rows=rows, states=STATES, filter=name_filter
        )

    async def tasks(self, request: web.Request) -> web.StreamResponse:
        ctx = self.ctx
        wanted = request.query.get("id")
        if wanted:
            return ctx.redirect("/tasks/" + quote(wanted, safe=""))
        try:
            topic, state, cursor, limit = list_args(request)
            page = await views.list_page(ctx.server.engine, topic, state, cursor, limit)
        except RequestError as exc:
            return ctx.error(request, 400, exc.message)
        params = {k: v for k, v in (("topic", topic), ("state", state)) if v}
        if limit != views.PAGE_ROWS:
            params["limit"] = str(limit)
        next_url = None
        if page.next is not None:
            next_url = "/tasks?" + urlencode({**params, "cursor": page.next})
        return ctx.render(
            request,
            "tasks.html",
            title="Tasks",
            page=page,
            topic=topic or "",
            state=state or "",
            limit=limit,
            states=STATES,
            first_url="/tasks?" + urlencode(params),
            next_url=next_url,
            at_start=cursor == 0,
            preview=views.preview,
            hide_bodies=ctx.hide_bodies(request),
        )

    async def task(self, request: web.Request) -> web.StreamResponse:
        ctx = self.ctx
        task_id = request.match_info["id"]
        try:
            engine = ctx.server.engine
            task = await engine.through_store(partial(engine.get, task_id))
        except RequestError as exc:
            return ctx.error(request, 400, exc.message)
        if task is None:
            return ctx.error(request, 404, f"No task with id {views.visible(task_id)}.")
        return ctx.render(
            request,
            "task.html",
            title="Task",
            task=task,
            body=views.body_views(task["body"]),
            result=views.result_text(task.get("result")),
            target=present.target_rows(task["target"]),
            attempts=self._attempts(task_id),
            hide_bodies=ctx.hide_bodies(request),
            view=request.query.get("view", "text"),
        )

    def _attempts(self, task_id: str) -> list[Attempt] | None:
        """The task's last delivery attempts (None: this server delivers nothing)."""
        deliveries = self.ctx.server.deliveries
        if deliveries is None or deliveries.dispatcher is None:
            return None
        return deliveries.dispatcher.attempts.of(task_id)

    async def dead(self, request: web.Request) -> web.StreamResponse:
        ctx = self.ctx
        engine = ctx.server.engine
        topic = request.query.get("topic")
        key = request.query.get("group")
        if topic:
            try:
                ids = await views.dead_ids(engine, topic, key)
            except ValueError as exc:
                return ctx.error(request, 400, str(exc))
            shown = [
                await engine.through_store(partial(engine.get, task_id))
                for task_id in ids[: views.MAX_PAGE_ROWS]
            ]
            return ctx.render(
                request,
                "dead_tasks.html",
                title="Dead tasks",
                topic=topic,
                group=key,
                error=None if key is None else views.error_of_key(key),
                total=len(ids),
                tasks=[t for t in shown if t is not None],
            )
        groups = await views.dead_groups(engine)
        by_topic = engine.snapshot().counts.by_topic()
        topics = [
            (name, counts[DEAD]) for name, counts in sorted(by_topic.items()) if counts.get(DEAD)
        ]
        return ctx.render(
            request,
            "dead.html",
            title="Dead tasks",
            groups=groups,
            topics=topics,
            no_error=views.NO_ERROR,
        )

    async def deliveries(self, request: web.Request) -> web.StreamResponse:
        deliveries = self.ctx.server.deliveries
        stats = {} if deliveries is None else deliveries.stats()
        return self.ctx.render(request, "deliveries.html", title="Deliveries", stats=stats)

    async def server(self, request: web.Request) -> web.StreamResponse:
        ctx = self.ctx
        return ctx.render(
            request,
            "server.html",
            title="Server",
            settings=present.settings_rows(shown_settings(ctx.settings)),
            streams=ctx.producer.streams,
            sessions=len(ctx.sessions),
        )

    async def schedules(self, request: web.Request) -> web.StreamResponse:
        ctx = self.ctx
        cursor = request.query.get("cursor") or None
        query: dict[str, object] = {"limit": views.SCHEDULE_ROWS}
        if cursor is not None:
            query["cursor"] = cursor
        try:
            page = ctx.server.engine.schedule_list(query)
        except RequestError as exc:
            return ctx.error(request, 400, exc.message)
        next_url = None
        if page["next"] is not None:
            next_url = "/schedules?" + urlencode({"cursor": page["next"]})
        return ctx.render(
            request,
            "schedules.html",
            title="Schedules",
            rows=page["schedules"],
            next_url=next_url,
            at_start=cursor is None,
        )

    async def cluster(self, request: web.Request) -> web.StreamResponse:
        cluster = views.cluster(self.ctx.server.cluster_map())
        return self.ctx.render(request, "cluster.html", title="Cluster", cluster=cluster)

    async def job(self, request: web.Request) -> web.StreamResponse:
        ctx = self.ctx
        try:
            job = ctx.jobs.by_number[int(request.match_info["number"])]
        except (KeyError, ValueError):
            return ctx.error(request, 404, "No such job (jobs are kept while the server runs).")
        return ctx.render(request, "job.html", title="Bulk action", job=job)

    async def events(self, request: web.Request) -> web.StreamResponse:
        subscriber = self.ctx.producer.subscribe()
        if subscriber is None:
            return web.Response(
                status=503, text="too many event streams", headers={"Retry-After": "5"}
            )
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"}
        )
        try:
            await response.prepare(request)
            await response.write(PREAMBLE)
            while not subscriber.closed:
                data = await subscriber.next(HEARTBEAT_S)
                await response.write(HEARTBEAT if data is None else frame(data))
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            subscriber.close()
        return response
