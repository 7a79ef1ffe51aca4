"""The dashboard's aiohttp site: routes, headers, sign-in, and the pages' handlers.

Every response gets the same headers (``_headers``, on every prepared
response: pages, 404s, static files, the event stream): a strict CSP with
nothing inline allowed, ``nosniff``, ``no-referrer``, and ``no-store`` on
everything but static files. At most ``MAX_REQUESTS`` page and API
requests run at once; the rest wait their turn.

Who may do what: with ``--token``, a session from the sign-in form (admin,
or viewer with ``--web-viewer-token``); ``/api`` takes ``Authorization:
Bearer``. Without a token, every loopback peer is the admin, and others are
refused unless ``--web-insecure``. Every POST but sign-in needs an admin, the
session's CSRF token and the browser's same-origin word (``auth.same_origin``).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode, urlsplit

import jinja2
from aiohttp import web

from delaywheel import __version__
from delaywheel.engine.task import STATES
from delaywheel.errors import RequestError
from delaywheel.logs import shown_settings
from delaywheel.net.tls import server_context
from delaywheel.web import actions, views
from delaywheel.web.auth import ADMIN, VIEWER, LoginLimit, Session, Sessions, role_of, same_origin
from delaywheel.web.live import (
    HEARTBEAT,
    HEARTBEAT_S,
    PREAMBLE,
    RING_SAMPLES,
    Producer,
    chart_points,
    frame,
)

if TYPE_CHECKING:
    from delaywheel.net.server import Server

log = logging.getLogger("delaywheel.web")

HERE = Path(__file__).resolve().parent
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
MAX_REQUESTS = 8
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# Set by the guard on every request it lets through: who is asking.
# None: no session (the sign-in routes).
SESSION: web.RequestKey[Session | None] = web.RequestKey("session")
ROLE = web.RequestKey("role", str)  # /api: the bearer token's role


def _is_loopback(address: str | None) -> bool:
    try:
        return address is not None and ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


class Dashboard:
    def __init__(self, server: Server) -> None:
        self.server = server
        self.settings = settings = server.settings
        self.base = settings.web_base_path
        self.tls = settings.tls_cert is not None
        self.cookie = "__Host-delaywheel" if self.tls else "delaywheel"
        self.sessions = Sessions()
        self.logins = LoginLimit()
        self.producer = Producer(server)
        self.jobs = actions.Jobs(server)
        self.started_s = time.time()
        self._limit = asyncio.Semaphore(MAX_REQUESTS)
        self._runner: web.AppRunner | None = None
        self.templates = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True,  # every template, whatever its name
            undefined=jinja2.StrictUndefined,
        )
        self.templates.filters["visible"] = views.visible
        self.templates.filters["field"] = views.to_field
        self.templates.filters["q"] = lambda value: quote(str(value), safe="")
        self.templates.filters["when"] = _when
        self.templates.filters["ago"] = _ago
        self.app = self._build()

    # -- the app ---------------------------------------------------------------

    def _build(self) -> web.Application:
        app = web.Application(middlewares=[self._guard], client_max_size=256 * 1024)
        app.on_response_prepare.append(_headers)
        b = self.base
        pages: list[tuple[str, Handler]] = [
            ("/", self.home),
            ("/topics", self.topics),
            ("/tasks", self.tasks),
            ("/tasks/{id}", self.task),
            ("/dead", self.dead),
            ("/deliveries", self.deliveries),
            ("/server", self.server_page),
            ("/jobs/{number}", self.job),
            ("/api/stats", self.api_stats),
            ("/api/topics", self.api_topics),
            ("/api/tasks", self.api_tasks),
            ("/api/tasks/{id}", self.api_task),
            ("/api/dead", self.api_dead),
        ]
        for path, handler in pages:
            app.router.add_get(b + path, handler)
        app.router.add_get(b + "/login", self.login_form)
        app.router.add_post(b + "/login", self.login)
        app.router.add_post(b + "/logout", self.logout)
        app.router.add_get(b + "/events", self.events)
        # The mutating routes: admin only, with the CSRF token (``_guard``).
        for name in ("delete", "kick", "run", "reschedule"):
            app.router.add_post(b + "/tasks/{id}/" + name, self.task_action)
        app.router.add_post(b + "/dead/kick", self.bulk)
        app.router.add_post(b + "/dead/delete", self.bulk)
        app.router.add_static(b + "/static", HERE / "static", append_version=False)
        if b:
            app.router.add_get(b, self._to_home)
        return app

    async def _to_home(self, request: web.Request) -> web.StreamResponse:
        return self._redirect("/")

    async def start(self, host: str, port: int) -> tuple[str, int]:
        tls = None
        if self.settings.tls_cert is not None and self.settings.tls_key is not None:
            tls = server_context(self.settings.tls_cert, self.settings.tls_key, None)
        self._runner = runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await runner.setup()
        try:
            site = web.TCPSite(runner, host, port, reuse_address=True, ssl_context=tls)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self.producer.start()
        address = runner.addresses[0]
        return address[0], address[1]

    async def stop(self) -> None:
        await self.producer.stop()
        await self.jobs.stop()
        if self._runner is not None:
            await self._runner.cleanup()

    # -- who is asking ---------------------------------------------------------

    @property
    def open_mode(self) -> bool:
        """No token: no sign-in; loopback peers (or anyone, --web-insecure) are the admin."""
        return self.settings.token is None

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path[len(self.base) :] if self.base else request.path
        if path.startswith("/static/"):
            return await handler(request)
        if self.open_mode and not self.settings.web_insecure and not _is_loopback(request.remote):
            return self._error(request, 403, "This dashboard serves this machine only.")
        if path.startswith("/api/"):
            return await self._api(request, handler)
        session = self._session(request)
        request[SESSION] = session
        if (path in ("/login", "/logout") and request.method == "POST") or path == "/login":
            return await handler(request)
        if session is None:
            if self.open_mode:
                session = self.sessions.create(ADMIN)
                request[SESSION] = session
                response = await self._limited(request, handler)
                self._set_cookie(response, session)
                return response
            if request.method == "POST":
                return self._expired(request)
            return self._redirect("/login")
        if request.method == "POST":
            if session.role != ADMIN:
                return self._error(request, 403, "Viewers cannot change tasks.")
            if not await self._csrf_ok(request, session):
                return self._expired(request)
        if path == "/events":
            return await handler(request)
        return await self._limited(request, handler)

    async def _limited(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        async with self._limit:
            return await handler(request)

    async def _api(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not self.open_mode:
            scheme, _, given = request.headers.get("Authorization", "").partition(" ")
            role = role_of(given, self.settings.token, self.settings.web_viewer_token)
            if scheme.lower() != "bearer" or role is None:
                return web.json_response(
                    {"error": "unauthorized", "message": "send Authorization: Bearer TOKEN"},
                    status=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
            request[ROLE] = role
        else:
            request[ROLE] = ADMIN
        return await self._limited(request, handler)

    def _session(self, request: web.Request) -> Session | None:
        return self.sessions.get(request.cookies.get(self.cookie))

    async def _csrf_ok(self, request: web.Request, session: Session) -> bool:
        if not _same_origin(request):
            return False
        form = await request.post()
        given = form.get("csrf")
        return isinstance(given, str) and actions_compare(given, session.csrf)

    def _set_cookie(self, response: web.StreamResponse, session: Session) -> None:
        response.set_cookie(
            self.cookie,
            session.sid,
            path="/",
            httponly=True,
            samesite="Strict",
            secure=self.tls,
            max_age=12 * 3600,
        )

    # -- rendering -------------------------------------------------------------

    def render(
        self, request: web.Request, name: str, status: int = 200, **context: Any
    ) -> web.Response:
        session: Session | None = request.get(SESSION)
        flash = []
        if session is not None:
            flash, session.flash = session.flash, []
        html = self.templates.get_template(name).render(
            base=self.base,
            session=session,
            admin=session is not None and session.role == ADMIN,
            signed_in=session is not None and not self.open_mode,
            flash=flash,
            version=__version__,
            path=request.path,
            **context,
        )
        return web.Response(text=html, status=status, content_type="text/html")

    def _redirect(self, to: str) -> web.Response:
        return web.Response(status=303, headers={"Location": self.base + to})

    def _error(self, request: web.Request, status: int, message: str) -> web.Response:
        return self.render(request, "error.html", status=status, title=str(status), message=message)

    def _expired(self, request: web.Request) -> web.Response:
        return self.render(request, "expired.html", status=403, title="Session expired")

    def _back(self, form: Any, fallback: str) -> str:
        """Where a form asked to go back to: a path of ours, never another site."""
        back = form.get("back")
        if isinstance(back, str) and back.startswith("/") and not back.startswith("//"):
            return back
        return fallback

    # -- sign-in ---------------------------------------------------------------

    async def login_form(self, request: web.Request) -> web.StreamResponse:
        if self.open_mode:
            return self._redirect("/")
        return self.render(request, "login.html", title="Sign in", failed=False)

    async def login(self, request: web.Request) -> web.StreamResponse:
        if self.open_mode:
            return self._redirect("/")
        address = request.remote or "?"
        if not _same_origin(request):
            return self._expired(request)
        if self.logins.blocked(address):
            return self.render(
                request, "login.html", status=429, title="Sign in", failed=True, blocked=True
            )
        form = await request.post()
        given = form.get("token")
        role = (
            role_of(given, self.settings.token, self.settings.web_viewer_token)
            if isinstance(given, str)
            else None
        )
        if role is None:
            self.logins.failed(address)
            log.warning("web sign-in failed from %s", address, extra={"address": address})
            return self.render(request, "login.html", status=401, title="Sign in", failed=True)
        session = self.sessions.create(role)
        log.info("web %s: signed in from %s", session.who, address, extra={"who": session.who})
        response = self._redirect("/")
        self._set_cookie(response, session)
        return response

    async def logout(self, request: web.Request) -> web.StreamResponse:
        session = self._session(request)
        if session is not None:
            if not await self._csrf_ok(request, session):
                return self._expired(request)
            self.sessions.revoke(session.sid)
            log.info("web %s: signed out", session.who, extra={"who": session.who})
        response = self._redirect("/login" if not self.open_mode else "/")
        response.del_cookie(self.cookie, path="/")
        return response

    # -- pages -----------------------------------------------------------------

    def _chart(self, name: str) -> str:
        return chart_points(self.producer.ring.series(name, last=300))

    async def home(self, request: web.Request) -> web.StreamResponse:
        snap = self.producer.latest or self.producer.sample()
        engine = self.server.engine.snapshot()
        return self.render(
            request,
            "home.html",
            title="Overview",
            snap=snap,
            states=STATES,
            wheel=engine.wheel,
            slots=engine.slots,
            tick_s=engine.tick_s,
            charts={name: self._chart(name) for name in ("ready", "added", "fired", "p99")},
            ring_samples=RING_SAMPLES,
            started_s=self.server.engine.started_s,
        )

    async def topics(self, request: web.Request) -> web.StreamResponse:
        name_filter = request.query.get("filter", "")
        rows = await views.topics(self.server.engine, name_filter)
        return self.render(
            request, "topics.html", title="Topics", rows=rows, states=STATES, filter=name_filter
        )

    def _list_args(self, request: web.Request) -> tuple[str | None, str | None, int, int]:
        query = request.query
        topic = query.get("topic") or None
        state = query.get("state") or None
        if state is not None and state not in STATES:
            raise RequestError(
                "bad_request", f"state must be one of {', '.join(STATES)}, got {state!r}"
            )
        try:
            cursor = int(query.get("cursor") or 0)
            limit = int(query.get("limit") or views.PAGE_ROWS)
        except ValueError:
            raise RequestError("bad_request", "cursor and limit must be whole numbers") from None
        if cursor < 0 or not 1 <= limit <= views.MAX_PAGE_ROWS:
            raise RequestError(
                "bad_request", f"limit must be 1 to {views.MAX_PAGE_ROWS} and cursor >= 0"
            )
        return topic, state, cursor, limit

    async def tasks(self, request: web.Request) -> web.StreamResponse:
        wanted = request.query.get("id")
        if wanted:
            return self._redirect("/tasks/" + quote(wanted, safe=""))
        try:
            topic, state, cursor, limit = self._list_args(request)
            page = views.list_page(self.server.engine, topic, state, cursor, limit)
        except RequestError as exc:
            return self._error(request, 400, exc.message)
        params = {k: v for k, v in (("topic", topic), ("state", state)) if v}
        if limit != views.PAGE_ROWS:
            params["limit"] = str(limit)
        next_url = None
        if page.next is not None:
            next_url = "/tasks?" + urlencode({**params, "cursor": page.next})
        return self.render(
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
            hide_bodies=self._hide_bodies(request),
        )

    def _hide_bodies(self, request: web.Request) -> bool:
        session: Session | None = request.get(SESSION)
        role = request.get(ROLE) or (session.role if session else ADMIN)
        return role == VIEWER and self.settings.web_hide_bodies

    async def task(self, request: web.Request) -> web.StreamResponse:
        task_id = request.match_info["id"]
        try:
            task = self.server.engine.get(task_id)
        except RequestError as exc:
            return self._error(request, 400, exc.message)
        if task is None:
            return self._error(request, 404, f"No task with id {views.visible(task_id)}.")
        return self.render(
            request,
            "task.html",
            title="Task",
            task=task,
            body=views.body_views(task["body"]),
            hide_bodies=self._hide_bodies(request),
            view=request.query.get("view", "text"),
        )

    async def dead(self, request: web.Request) -> web.StreamResponse:
        engine = self.server.engine
        topic = request.query.get("topic")
        key = request.query.get("group")
        if topic:
            try:
                ids = await views.dead_ids(engine, topic, key)
            except ValueError as exc:
                return self._error(request, 400, str(exc))
            shown = [engine.get(task_id) for task_id in ids[: views.MAX_PAGE_ROWS]]
            return self.render(
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
        return self.render(
            request, "dead.html", title="Dead tasks", groups=groups, no_error=views.NO_ERROR
        )

    async def deliveries(self, request: web.Request) -> web.StreamResponse:
        deliveries = self.server.deliveries
        stats = {} if deliveries is None else deliveries.stats()
        return self.render(request, "deliveries.html", title="Deliveries", stats=stats)

    async def server_page(self, request: web.Request) -> web.StreamResponse:
        return self.render(
            request,
            "server.html",
            title="Server",
            settings=shown_settings(self.settings),
            streams=self.producer.streams,
            sessions=len(self.sessions),
        )

    async def job(self, request: web.Request) -> web.StreamResponse:
        try:
            job = self.jobs.by_number[int(request.match_info["number"])]
        except (KeyError, ValueError):
            return self._error(request, 404, "No such job (jobs are kept while the server runs).")
        return self.render(request, "job.html", title="Bulk action", job=job)

    # -- actions ---------------------------------------------------------------

    async def task_action(self, request: web.Request) -> web.StreamResponse:
        session = request[SESSION]
        assert session is not None  # the guard lets no POST through without one
        task_id = request.match_info["id"]
        what = request.path.rsplit("/", 1)[1]
        form = await request.post()
        back = self._back(form, "/tasks/" + quote(task_id, safe=""))
        engine = self.server.engine
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
            verb = actions.verbs(self.server)[what]

            def call() -> Any:
                return verb(task_id)

        try:
            result = await actions.one(self.server, session.who, f"{what} {task_id!r}", call)
        except RequestError as exc:
            session.flash.append(exc.message)
        else:
            if what == "delete" and result is False:
                session.flash.append(f"No task with id {task_id!r}.")
            else:
                session.flash.append(
                    {
                        "delete": "Deleted",
                        "kick": "Kicked",
                        "run": "Due now:",
                        "reschedule": "Rescheduled",
                    }[what]
                    + f" {task_id!r}."
                )
            if what == "delete" and back.startswith(self.base + "/tasks/"):
                back = self.base + "/tasks"
        return web.Response(status=303, headers={"Location": back})

    async def bulk(self, request: web.Request) -> web.StreamResponse:
        session = request[SESSION]
        assert session is not None  # the guard lets no POST through without one
        what = request.path.rsplit("/", 1)[1]
        form = await request.post()
        engine = self.server.engine
        try:
            selected = [views.from_field(v) for v in form.getall("ids", []) if isinstance(v, str)]
            topic = _field(form.get("topic"))
            key = _field(form.get("group")) or None
        except ValueError as exc:
            return self._error(request, 400, str(exc))
        if selected:
            ids = selected
            description = f"{len(ids)} selected"
        elif isinstance(topic, str) and topic:
            try:
                ids = await views.dead_ids(engine, topic, key if isinstance(key, str) else None)
            except ValueError as exc:
                return self._error(request, 400, str(exc))
            description = f"dead of {topic!r}" + (
                "" if key is None else f" with error {str(key)[1:]!r}"
            )
        else:
            return self._error(request, 400, "Choose tasks, a group or a topic.")
        confirm = form.get("confirm")
        needs_topic = len(ids) > actions.CONFIRM_TOPIC_OVER and not selected
        typed_ok = not needs_topic or form.get("confirm_topic") == topic  # typed, not a field
        if confirm != str(len(ids)) or not typed_ok:
            return self.render(
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
        job = self.jobs.start(session.who, what, description, ids)
        return self._redirect(f"/jobs/{job.number}")

    # -- the event stream -------------------------------------------------------

    async def events(self, request: web.Request) -> web.StreamResponse:
        subscriber = self.producer.subscribe()
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

    # -- the API ---------------------------------------------------------------

    async def api_stats(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(self.server.stats(time.time()) | {"live": self.producer.latest})

    async def api_topics(self, request: web.Request) -> web.StreamResponse:
        rows = await views.topics(self.server.engine, request.query.get("filter", ""))
        return web.json_response([vars(row) for row in rows])

    async def api_tasks(self, request: web.Request) -> web.StreamResponse:
        try:
            topic, state, cursor, limit = self._list_args(request)
            page = views.list_page(self.server.engine, topic, state, cursor, limit)
        except RequestError as exc:
            return web.json_response({"error": exc.code, "message": exc.message}, status=400)
        return web.json_response(
            {
                "tasks": [_api_task(t, self._hide_bodies(request)) for t in page.tasks],
                "next": page.next,
            }
        )

    async def api_task(self, request: web.Request) -> web.StreamResponse:
        try:
            task = self.server.engine.get(request.match_info["id"])
        except RequestError as exc:
            return web.json_response({"error": exc.code, "message": exc.message}, status=400)
        if task is None:
            return web.json_response({"error": "not_found"}, status=404)
        return web.json_response(_api_task(task, self._hide_bodies(request)))

    async def api_dead(self, request: web.Request) -> web.StreamResponse:
        groups = await views.dead_groups(self.server.engine)
        return web.json_response(
            [{"topic": g.topic, "error": g.error, "count": g.count, "ids": g.ids} for g in groups]
        )


def _same_origin(request: web.Request) -> bool:
    origin = request.headers.get("Origin")
    if origin is not None and origin != "null":
        origin = urlsplit(origin).netloc
    return same_origin(origin, request.headers.get("Sec-Fetch-Site"), request.host)


def _field(value: object) -> str | None:
    return views.from_field(value) if isinstance(value, str) else None


def actions_compare(given: str, expected: str) -> bool:
    import hmac

    return hmac.compare_digest(given.encode(), expected.encode())


def _api_task(task: dict[str, Any], hide_body: bool) -> dict[str, Any]:
    shown = dict(task)
    body = shown.pop("body")
    if not hide_body:
        shown["body"] = body.hex() if isinstance(body, bytes) else body
        shown["body_is_bytes"] = isinstance(body, bytes)
    return shown


async def _headers(request: web.Request, response: web.StreamResponse) -> None:
    headers = response.headers
    headers["Content-Security-Policy"] = CSP
    headers["X-Content-Type-Options"] = "nosniff"
    headers["Referrer-Policy"] = "no-referrer"
    headers["X-Frame-Options"] = "DENY"
    if "/static/" not in request.path:
        headers["Cache-Control"] = "no-store"


def _when(at_s: float | None) -> str:
    if at_s is None:
        return "—"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(at_s)) + " UTC"


def _ago(seconds: float | None) -> str:
    if seconds is None or seconds != seconds:
        return "—"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
