"""What every handler of the dashboard shares: the server, the templates, the
sessions, the live producer, the bulk jobs, and how a page is rendered.

``site.Dashboard`` is a ``Context`` that also builds the app and guards it;
the handlers (``pages``, ``forms``, ``api``) get the context, so none of
them imports the site (tests/test_layers.py refuses a cycle).
"""

from __future__ import annotations

import hmac
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

import jinja2
from aiohttp import web

from delaywheel import __version__
from delaywheel.engine.task import STATES
from delaywheel.errors import RequestError
from delaywheel.web import actions, present, views
from delaywheel.web.auth import ADMIN, VIEWER, Session, Sessions, same_origin
from delaywheel.web.live import Producer

if TYPE_CHECKING:
    from delaywheel.net.server import Server

HERE = Path(__file__).resolve().parent
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# Set by the guard on every request it lets through: who is asking.
# None: no session (the sign-in routes).
SESSION: web.RequestKey[Session | None] = web.RequestKey("session")
ROLE = web.RequestKey("role", str)  # /api: the bearer token's role


class Context:
    def __init__(self, server: Server) -> None:
        self.server = server
        self.settings = settings = server.settings
        self.base = settings.web_base_path
        self.tls = settings.tls_cert is not None
        self.cookie = "__Host-delaywheel" if self.tls else "delaywheel"
        self.sessions = Sessions()
        self.signins = server.signins  # failed sign-ins: one rule for every door
        self.producer = Producer(server)
        self.jobs = actions.Jobs(server)
        self.started_s = time.time()
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
        for name in ("breakable", "duration", "relative", "lateness", "iso", "size", "count"):
            self.templates.filters[name] = getattr(present, name)

    @property
    def open_mode(self) -> bool:
        """No token: no sign-in; loopback peers (or anyone, --web-insecure) are the admin."""
        return self.settings.token is None

    # -- sessions ----------------------------------------------------------------

    def session_of(self, request: web.Request) -> Session | None:
        return self.sessions.get(request.cookies.get(self.cookie))

    async def csrf_ok(self, request: web.Request, session: Session) -> bool:
        if not same_origin_of(request):
            return False
        form = await request.post()
        given = form.get("csrf")
        return isinstance(given, str) and hmac.compare_digest(given.encode(), session.csrf.encode())

    def set_cookie(self, response: web.StreamResponse, session: Session) -> None:
        response.set_cookie(
            self.cookie,
            session.sid,
            path="/",
            httponly=True,
            samesite="Strict",
            secure=self.tls,
            max_age=12 * 3600,
        )

    def hide_bodies(self, request: web.Request) -> bool:
        session: Session | None = request.get(SESSION)
        role = request.get(ROLE) or (session.role if session else ADMIN)
        return role == VIEWER and self.settings.web_hide_bodies

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

    def redirect(self, to: str) -> web.Response:
        """303 to ``to``, a path of ours (the base path goes in front)."""
        return web.Response(status=303, headers={"Location": self.base + to})

    def error(self, request: web.Request, status: int, message: str) -> web.Response:
        return self.render(request, "error.html", status=status, title=str(status), message=message)

    def expired(self, request: web.Request) -> web.Response:
        return self.render(request, "expired.html", status=403, title="Session expired")

    def chart_until(self) -> str:
        """The time of the last sample the charts were drawn with (0: none yet)."""
        last = self.producer.ring.series("t", last=1)
        # repr: the exact double, as the stream's JSON writes it (a rounded
        # one could be below the same sample's t, which would then be drawn twice).
        return repr(last[0]) if last else "0"


def list_args(request: web.Request) -> tuple[str | None, str | None, int | str, int]:
    """``/tasks``' and ``/api/tasks``' query: topic, state, cursor, limit, checked
    (a cursor ``f...``: a page past the horizon, engine/horizon.py)."""
    query = request.query
    topic = query.get("topic") or None
    state = query.get("state") or None
    if state is not None and state not in STATES:
        raise RequestError(
            "bad_request", f"state must be one of {', '.join(STATES)}, got {state!r}"
        )
    given = query.get("cursor") or "0"
    try:
        cursor: int | str = given if given.startswith("f") else int(given)
        limit = int(query.get("limit") or views.PAGE_ROWS)
    except ValueError:
        raise RequestError("bad_request", "cursor and limit must be whole numbers") from None
    if (type(cursor) is int and cursor < 0) or not 1 <= limit <= views.MAX_PAGE_ROWS:
        raise RequestError(
            "bad_request", f"limit must be 1 to {views.MAX_PAGE_ROWS} and cursor >= 0"
        )
    return topic, state, cursor, limit


# A path: printable ASCII but the backslash, not starting with two slashes.
_OWN_PATH = re.compile(r"/(?!/)[\x21-\x5b\x5d-\x7e]*")


def back_of(form: Any, fallback: str) -> str:
    """Where a form asked to go back to: a path of ours, never another site.

    Browsers read ``\\`` as ``/`` and drop tabs and newlines from a URL, so
    ``/\\evil.example`` and ``/<TAB>/evil.example`` are ``//evil.example``,
    another site: a path here is printable ASCII without a backslash (a
    page's link is percent-encoded) and its second character is not a slash."""
    back = form.get("back")
    if isinstance(back, str) and _OWN_PATH.fullmatch(back):
        return back
    return fallback


def same_origin_of(request: web.Request) -> bool:
    origin = request.headers.get("Origin")
    if origin is not None and origin != "null":
        origin = urlsplit(origin).netloc
    return same_origin(origin, request.headers.get("Sec-Fetch-Site"), request.host)


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
