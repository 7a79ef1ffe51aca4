"""The dashboard's aiohttp site: the routes, the guard in front of them, the headers.

Every response gets the same headers (``_headers``, on every prepared
response: pages, 404s, static files, the event stream): a strict CSP with
nothing inline allowed, ``nosniff``, ``no-referrer``, and ``no-store`` on
everything but static files. At most ``MAX_REQUESTS`` page and API
requests run at once; the rest wait their turn.

Who may do what (``_guard``): with ``--token``, a session from the sign-in
form (admin, or viewer with ``--web-viewer-token``); ``/api`` takes
``Authorization: Bearer``. Without a token, every loopback peer is the
admin, and others are refused unless ``--web-insecure``. Every POST but
sign-in needs an admin, the session's CSRF token and the browser's
same-origin word (``auth.same_origin``).

The handlers live by kind: ``pages`` (GET), ``forms`` (sign-in and the
actions' POSTs), ``api`` (JSON); ``context`` is what they share.
"""

from __future__ import annotations

import asyncio
import ipaddress
import math
from typing import TYPE_CHECKING

from aiohttp import web

from delaywheel.net.httpsite import BoundedSite
from delaywheel.net.limits import WEB_CONNECTIONS
from delaywheel.net.tls import server_context
from delaywheel.web.api import Api
from delaywheel.web.auth import ADMIN, role_of
from delaywheel.web.context import HERE, ROLE, SESSION, Context, Handler
from delaywheel.web.forms import Forms
from delaywheel.web.pages import Pages

if TYPE_CHECKING:
    from delaywheel.net.server import Server

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
MAX_REQUESTS = 8
# A path segment holding a task's or a schedule's id: anything but a slash
# (aiohttp's default also refuses { and }, which ids may hold). A slash in an
# id arrives as %2F, which aiohttp matches undecoded.
ID = "{id:[^/]+}"


def _is_loopback(address: str | None) -> bool:
    try:
        return address is not None and ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


class Dashboard(Context):
    def __init__(self, server: Server, mounts: dict[str, web.Application] | None = None) -> None:
        super().__init__(server)
        # Applications served on this port beside the dashboard, by path prefix (the
        # HTTP API's /v1): each guards itself, so the dashboard's guard lets them by.
        self.mounts = dict(mounts or {})
        self._limit = asyncio.Semaphore(MAX_REQUESTS)
        self._runner: web.AppRunner | None = None
        self._site: BoundedSite | None = None
        self.app = self._build()

    def _build(self) -> web.Application:
        app = web.Application(middlewares=[self._guard], client_max_size=256 * 1024)
        app.on_response_prepare.append(_headers)
        pages, forms, api = Pages(self), Forms(self), Api(self)
        b = self.base
        gets: list[tuple[str, Handler]] = [
            ("/", pages.home),
            ("/topics", pages.topics),
            ("/tasks", pages.tasks),
            ("/tasks/" + ID, pages.task),
            ("/dead", pages.dead),
            ("/deliveries", pages.deliveries),
            ("/server", pages.server),
            ("/schedules", pages.schedules),
            ("/cluster", pages.cluster),
            ("/jobs/{number}", pages.job),
            ("/api/stats", api.stats),
            ("/api/topics", api.topics),
            ("/api/tasks", api.tasks),
            ("/api/tasks/" + ID, api.task),
            ("/api/dead", api.dead),
            ("/api/cluster", api.cluster),
        ]
        for path, handler in gets:
            app.router.add_get(b + path, handler)
        app.router.add_get(b + "/login", forms.login_form)
        app.router.add_post(b + "/login", forms.login)
        app.router.add_post(b + "/logout", forms.logout)
        app.router.add_get(b + "/events", pages.events)
        # The mutating routes: admin only, with the CSRF token (``_guard``).
        for name in ("delete", "kick", "run", "reschedule"):
            app.router.add_post(b + "/tasks/" + ID + "/" + name, forms.task_action)
        for name in ("pause", "resume", "trigger"):
            app.router.add_post(b + "/schedules/" + ID + "/" + name, forms.schedule_action)
        for name in ("pause", "resume"):
            app.router.add_post(b + "/topics/{topic:[^/]+}/" + name, forms.topic_action)
        app.router.add_post(b + "/dead/kick", forms.bulk)
        app.router.add_post(b + "/dead/delete", forms.bulk)
        app.router.add_static(b + "/static", HERE / "static", append_version=False)
        if b:
            app.router.add_get(b, self._to_home)
        for prefix, mounted in self.mounts.items():
            app.add_subapp(prefix, mounted)
        return app

    async def _to_home(self, request: web.Request) -> web.StreamResponse:
        return self.redirect("/")

    async def start(self, host: str, port: int) -> tuple[str, int]:
        tls = None
        if self.settings.tls_cert is not None and self.settings.tls_key is not None:
            tls = server_context(self.settings.tls_cert, self.settings.tls_key, None)
        # A mounted app's long polls leave their waiting line when their client goes.
        cancel = bool(self.mounts)
        self._runner = runner = web.AppRunner(
            self.app, access_log=None, handle_signals=False, handler_cancellation=cancel
        )
        await runner.setup()
        self._site = site = BoundedSite(
            runner, max_connections=WEB_CONNECTIONS, error_headers=security_headers,
            name="dashboard",
        )  # fmt: skip
        try:
            address = await site.start(host, port, tls)
        except BaseException:
            await runner.cleanup()
            raise
        self.producer.start()
        return address

    async def stop(self) -> None:
        await self.producer.stop()
        await self.jobs.stop()
        if self._site is not None:
            await self._site.stop()
        if self._runner is not None:
            await self._runner.cleanup()

    # -- who is asking ---------------------------------------------------------

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if any(request.path.startswith(prefix + "/") for prefix in self.mounts):
            return await handler(request)
        path = request.path[len(self.base) :] if self.base else request.path
        if path.startswith("/static/"):
            return await handler(request)
        if self.open_mode and not self.settings.web_insecure and not _is_loopback(request.remote):
            return self.error(request, 403, "This dashboard serves this machine only.")
        if path.startswith("/api/"):
            return await self._api(request, handler)
        session = self.session_of(request)
        request[SESSION] = session
        if (path in ("/login", "/logout") and request.method == "POST") or path == "/login":
            return await handler(request)
        if session is None:
            if self.open_mode:
                session = self.sessions.create(ADMIN)
                request[SESSION] = session
                response = await self._limited(request, handler)
                self.set_cookie(response, session)
                return response
            if request.method == "POST":
                return self.expired(request)
            return self.redirect("/login")
        if request.method == "POST":
            if session.role != ADMIN:
                return self.error(request, 403, "Viewers cannot change tasks.")
            if not await self.csrf_ok(request, session):
                return self.expired(request)
        if path == "/events":
            return await handler(request)
        return await self._limited(request, handler)

    async def _limited(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        async with self._limit:
            return await handler(request)

    async def _api(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not self.open_mode:
            address = request.remote
            wait_s = self.signins.retry_in_s(address, "api")
            if wait_s:  # the token is not even looked at (net/signins.py)
                return web.json_response(
                    {
                        "error": "unauthorized",
                        "message": "too many failed sign-ins from this address: try again later",
                    },
                    status=429,
                    headers={"Retry-After": str(math.ceil(wait_s))},
                )
            scheme, _, given = request.headers.get("Authorization", "").partition(" ")
            role = role_of(given, self.settings.token, self.settings.web_viewer_token)
            if scheme.lower() != "bearer" or role is None:
                if given:  # a token was tried: a guess, as far as we know
                    self.signins.failed(address, "api")
                return web.json_response(
                    {"error": "unauthorized", "message": "send Authorization: Bearer TOKEN"},
                    status=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
            self.signins.succeeded(address)
            request[ROLE] = role
        else:
            request[ROLE] = ADMIN
        return await self._limited(request, handler)


async def _headers(request: web.Request, response: web.StreamResponse) -> None:
    response.headers.update(security_headers(request.path))


def security_headers(path: str) -> dict[str, str]:
    """The headers of every response, the 400 of a request aiohttp could not
    parse and the 503 of a connection over the cap included (net/httpsite.py)."""
    headers = {
        "Content-Security-Policy": CSP,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "X-Frame-Options": "DENY",
    }
    if "/static/" not in path:
        headers["Cache-Control"] = "no-store"
    return headers
