"""Listening for an aiohttp app (the dashboard, the metrics endpoint) with bounds of our own.

aiohttp's ``TCPSite`` serves as many connections as arrive, keeps one whose
request headers never finish, or that sits idle between requests, for its
keep-alive default of 3,630 s, answers a malformed request with a 400 built
outside the app (so without the app's security headers), and logs that
request's parse error at ERROR with the offending header block, a bearer
token included. Each of its sockets is an open file counted against the same
limit as the protocol's connections (net/limits.py).

So ``BoundedSite`` listens itself, with a protocol factory that makes
aiohttp's own ``RequestHandler`` (``_Handler``) for the runner's server, and:

- at most ``max_connections`` at once: past it a connection is answered 503
  and closed, before any of its bytes are read;
- ``IDLE_TIMEOUT_S`` (``idle_timeout_s``: the HTTP API's is --message-timeout)
  for a request's headers to arrive (from the connection, or from the previous
  response) and for a keep-alive connection's idle time:
  aiohttp's keep-alive timer covers both;
- a malformed request's 400 carries ``error_headers`` (the app's security
  headers), and its log line is one WARNING per ``LOG_EVERY_S`` at most, with
  the peer and the error's kind, never its text (which quotes the headers).

It relies on ``RequestHandler``'s constructor, ``handle_error`` and
``log_exception``, which aiohttp documents as the low-level server's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

if TYPE_CHECKING:
    import ssl

    from aiohttp.web_request import BaseRequest

log = logging.getLogger("delaywheel.http")  # pinned: its name is documented

# Seconds for a request's headers to arrive and for a keep-alive connection to
# sit idle: a browser reuses its connection within a second or two; a peer
# that keeps one open longer without asking is holding a slot.
IDLE_TIMEOUT_S = 15.0
# At most one line about malformed requests this often (the rest are counted).
LOG_EVERY_S = 10.0


class BoundedSite:
    """Listen on ``host:port`` for ``runner`` (already set up), within the bounds above."""

    def __init__(
        self,
        runner: web.AppRunner,
        *,
        max_connections: int,
        error_headers: Callable[[str], Mapping[str, str]] = lambda path: {},
        name: str = "HTTP",
        idle_timeout_s: float = IDLE_TIMEOUT_S,
    ) -> None:
        self.runner = runner
        self.idle_timeout_s = idle_timeout_s
        self.max_connections = max_connections
        self.error_headers = error_headers
        self.open = 0  # connections being served
        self.refused = 0  # connections answered 503 for being over max_connections
        self.malformed = MalformedLog(name)
        self._server: asyncio.Server | None = None

    async def start(
        self, host: str, port: int, tls: ssl.SSLContext | None = None
    ) -> tuple[str, int]:
        loop = asyncio.get_running_loop()
        manager = self.runner.server
        assert manager is not None, "runner.setup() first"

        def factory() -> _Handler:
            return _Handler(
                self, manager, loop=loop, keepalive_timeout=self.idle_timeout_s, access_log=None
            )

        self._server = await loop.create_server(factory, host, port, ssl=tls, reuse_address=True)
        address = self._server.sockets[0].getsockname()
        return address[0], address[1]

    async def stop(self) -> None:
        """Stop listening; the runner's cleanup closes the connections."""
        if self._server is not None:
            self._server.close()
            self._server = None


def refuse_connection(transport: asyncio.Transport, headers: Mapping[str, str]) -> None:
    """A connection over the cap: 503 and closed, before any of its bytes are read."""
    body = b"too many connections\n"
    head = [
        "HTTP/1.1 503 Service Unavailable",
        "Content-Type: text/plain; charset=utf-8",
        f"Content-Length: {len(body)}",
        "Connection: close",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    transport.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
    transport.close()


class MalformedLog:
    """Requests that could not be parsed, counted; logged at most one line per
    ``LOG_EVERY_S``, with the peer and the error's kind, never its text (which
    quotes the headers, a token among them)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.count = 0
        self._unlogged = 0
        self._logged_s = float("-inf")

    def log(self, peer: str | None, exc: BaseException, status: int | None = None) -> None:
        self.count += 1
        now_s = time.monotonic()
        if now_s - self._logged_s < LOG_EVERY_S:
            self._unlogged += 1
            return
        if status is None:
            status = getattr(exc, "code", 400)
        more = f" ({self._unlogged} more since the last line)" if self._unlogged else ""
        log.warning(
            "%s: malformed request from %s answered %s (%s)%s",
            *(self.name, peer or "unknown", status, type(exc).__name__, more),
            extra={"peer": peer, "status": status, "more": self._unlogged},
        )
        self._logged_s, self._unlogged = now_s, 0


class _Handler(RequestHandler):
    """aiohttp's connection handler, counted against the site's cap."""

    def __init__(self, site: BoundedSite, manager: Any, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._site = site
        self._counted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        site = self._site
        if site.open >= site.max_connections:
            site.refused += 1
            # Written here: aiohttp never sees this connection.
            refuse_connection(cast(asyncio.Transport, transport), site.error_headers(""))
            return
        site.open += 1
        self._counted = True
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._counted:
            self._counted = False
            self._site.open -= 1
        super().connection_lost(exc)

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        response = super().handle_error(request, status, exc, message)
        try:
            path = request.path
        except Exception:  # a target aiohttp could not make sense of
            path = ""
        response.headers.update(self._site.error_headers(path))
        return response

    def log_exception(self, *args: Any, **kw: Any) -> None:
        exc = kw.get("exc_info")
        if isinstance(exc, HttpProcessingError):  # the peer's bytes, not our bug
            peer = args[1] if len(args) > 1 else None
            self._site.malformed.log(peer, exc)
            return
        super().log_exception(*args, **kw)
