"""The forms' handlers (POST): sign-in and sign-out, and the actions on tasks.

The guard (``site``) lets an action through only for an admin with the
session's CSRF token and the browser's same-origin word; the change itself
goes through ``actions``: the engine's verbs, answered once durable. Each
handler answers 303 to the page to show next, with a flash line saying what
was done (the pattern works with JavaScript off).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from aiohttp import web

from delaywheel.errors import RequestError
from delaywheel.web import actions, views
from delaywheel.web.auth import role_of
from delaywheel.web.context import SESSION, Context, back_of, same_origin_of

log = logging.getLogger("delaywheel.web")

DONE = {"delete": "Deleted", "kick": "Kicked", "run": "Due now:", "reschedule": "Rescheduled"}
SCHEDULE_DONE = {"pause": "Paused", "resume": "Resumed", "trigger": "Triggered"}


class Forms:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    # -- sign-in ---------------------------------------------------------------

    async def login_form(self, request: web.Request) -> web.StreamResponse:
        if self.ctx.open_mode:
            return self.ctx.redirect("/")
        return self.ctx.render(request, "login.html", title="Sign in", failed=False)

    async def login(self, request: web.Request) -> web.StreamResponse:
        ctx = self.ctx
        if ctx.open_mode:
            return ctx.redirect("/")
        address = request.remote or "?"
        if not same_origin_of(request):
            return ctx.expired(request)
        wait_s = ctx.signins.retry_in_s(address, "sign_in")
        if wait_s:  # the token is not even looked at (net/signins.py)
            response = ctx.render(
                request, "login.html", status=429, title="Sign in", failed=True, blocked=True
            )
            response.headers["Retry-After"] = str(math.ceil(wait_s))
            return response
        form = await request.post()
        given = form.get("token")
        role = (
            role_of(given, ctx.settings.token, ctx.settings.web_viewer_token)
            if isinstance(given, str)
            else None
        )
        if role is None:
            ctx.signins.failed(address, "sign_in")  # logs once per address and burst
            return ctx.render(request, "login.html", status=401, title="Sign in", failed=True)
        ctx.signins.succeeded(address)
        session = ctx.sessions.create(role)
        log.info("web %s: signed in from %s", session.who, address, extra={"who": session.who})
        response = ctx.redirect("/")
        ctx.set_cookie(response, session)
        return response

    async def logout(self, request: web.Request) -> web.StreamResponse:
        ctx = self.ctx
        session = ctx.session_of(request)
        if session is not None:
            if not await ctx.csrf_ok(request, session):
                return ctx.expired(request)
            ctx.sessions.revoke(session.sid)
            log.info("web %s: signed out", session.who, extra={"who": session.who})
        response = ctx.redirect("/login" if not ctx.open_mode else "/")
        response.del_cookie(ctx.cookie, path="/")
        return response

    # -- actions ---------------------------------------------------------------

    async def task_action(self, request: web.Request) -> web.StreamResponse:
        ctx = self.ctx
        session = request[SESSION]
        assert session is not None  # the guard lets no POST through without one
        task_id = request.match_info["id"]
        what = request.path.rsplit("/", 1)[1]
        form = await request.post()
        back = back_of(form, "/tasks/" + quote(task_id, safe=""))
        engine = ctx.server.engine
        call: Callable[[], Any]
        if what == "reschedule":
            raw = form.get("delay", "")
            try:
                delay = float(raw) if isinstance(raw, str) else float("nan")
            except ValueError:
                delay = float("nan")
            if not delay >= 0:
                session.flash.append(f"delay must be a number of seconds >= 0, got {raw!r}")
                return web.Response(status=303, headers={"Location": back})

            def call() -> Any:
                return engine.update(task_id, {"delay": delay}, time.time())
        else:
            verb = actions.verbs(ctx.server)[what]

            def call() -> Any:
                return verb(task_id)

        try:
            result = await actions.one(ctx.server, session.who, f"{what} {task_id!r}", call)
        except RequestError as exc:
            session.flash.append(exc.message)
        else:
            if what == "delete" and result is False:
                session.flash.append(f"No task with id {task_id!r}.")
            else:
                session.flash.append(f"{DONE[what]} {task_id!r}.")
            if what == "delete" and back.startswith(ctx.base + "/tasks/"):
                back = ctx.base + "/tasks"
        return web.Response(status=303, headers={"Location": back})

    async def schedule_action(self, request: web.Request) -> web.StreamResponse:
        return await self._named_action(request, "schedule", "id", actions.schedule_verbs)

    async def topic_action(self, request: web.Request) -> web.StreamResponse:
        return await self._named_action(request, "topic", "topic", actions.topic_verbs)

    async def _named_action(
        self,
        request: web.Request,
        of: str,
        param: str,
        verbs: Callable[[Any], dict[str, Callable[[str], Any]]],
    ) -> web.StreamResponse:
        """A schedule's or a topic's action (the last part of the path), said in
        a flash, then back to their page."""
        ctx = self.ctx
        session = request[SESSION]
        assert session is not None  # the guard lets no POST through without one
        name = request.match_info[param]
        what = request.path.rsplit("/", 1)[1]
        verb = verbs(ctx.server)[what]
        described = f"{what} {of} {name!r}"
        try:
            result = await actions.one(
                ctx.server, session.who, described, lambda: verb(name), of=of
            )
        except RequestError as exc:
            session.flash.append(exc.message)
        else:
            done = SCHEDULE_DONE[what] + ("" if of == "schedule" else f" {of}") + f" {name!r}"
            if what == "trigger":
                done += f": task {result['id']!r}"
            session.flash.append(done + ".")
        return ctx.redirect(f"/{of}s")

    async def bulk(self, request: web.Request) -> web.StreamResponse:
        ctx = self.ctx
        session = request[SESSION]
        assert session is not None  # the guard lets no POST through without one
        what = request.path.rsplit("/", 1)[1]
        form = await request.post()
        engine = ctx.server.engine
        try:
            selected = [views.from_field(v) for v in form.getall("ids", []) if isinstance(v, str)]
            topic = _field(form.get("topic"))
            key = _field(form.get("group")) or None
        except ValueError as exc:
            return ctx.error(request, 400, str(exc))
        if selected:
            ids = selected
            description = f"{len(ids)} selected"
        elif isinstance(topic, str) and topic:
            try:
                ids = await views.dead_ids(engine, topic, key if isinstance(key, str) else None)
            except ValueError as exc:
                return ctx.error(request, 400, str(exc))
            description = f"dead of {topic!r}" + (
                "" if key is None else f" with error {str(key)[1:]!r}"
            )
        else:
            return ctx.error(request, 400, "Choose tasks, a group or a topic.")
        confirm = form.get("confirm")
        needs_topic = len(ids) > actions.CONFIRM_TOPIC_OVER and not selected
        typed_ok = not needs_topic or form.get("confirm_topic") == topic  # typed, not a field
        if confirm != str(len(ids)) or not typed_ok:
            return ctx.render(
                request,
                "confirm.html",
                title="Confirm",
                what=what,
                count=len(ids),
                description=description,
                selected=selected,
                topic=topic if isinstance(topic, str) else "",
                group=key,
                needs_topic=needs_topic,
                retry=confirm is not None,
            )
        job = ctx.jobs.start(session.who, what, description, ids)
        return ctx.redirect(f"/jobs/{job.number}")


def _field(value: object) -> str | None:
    return views.from_field(value) if isinstance(value, str) else None
