"""The HTTP API's aiohttp side: the routes from the operations, auth, the bounds, listening.

``HttpApi.app()`` makes the ``/v1`` application: one route per ``Operation``
(operations.py) and ``/openapi.json``; app.py mounts it on the API's own port
(``--api-port``, ``start``) and on the dashboard's when that is on too.

Every request but the document's needs ``Authorization: Bearer TOKEN`` on a server with
a token; failed tokens count against the address on the same rule as every other door
(net/signins.py, the ``api`` door). Bounds: at most ``--api-max-requests`` requests run
at once (a long poll that waits is not counted: it holds what a blocked ``reserve``
holds, and its connection); past that, 503 with ``Retry-After``. A body is at most
``--max-message`` bytes (413 past it) and must arrive within ``--message-timeout`` (408
and the connection closed), as a protocol message must; the headers and a keep-alive
connection's idle time have the same bound (net/httpsite.py), and at most
``API_CONNECTIONS`` connections are open.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
from typing import TYPE_CHECKING, Any

from aiohttp import web

from delaywheel.errors import RequestError
from delaywheel.httpapi import openapi
from delaywheel.httpapi.forward import Calls
from delaywheel.httpapi.operations import OPERATIONS, Inputs, Operation
from delaywheel.httpapi.problems import from_error, problem
from delaywheel.httpapi.values import BadInput
from delaywheel.net.httpsite import BoundedSite
from delaywheel.net.limits import API_CONNECTIONS

if TYPE_CHECKING:
    import ssl

    from delaywheel.net.server import Server

log = logging.getLogger("delaywheel.http")  # the listeners' logger (net/httpsite.py)


# A path segment holding an id or a topic: anything but a slash (aiohttp's default
# refuses { and }, which ids may hold). A slash in an id arrives as %2F.
SEGMENT = "[^/]+"


class _SlowBody(Exception):
    """The body did not arrive within --message-timeout."""


def _route_path(path: str) -> str:
    for name in ("id", "topic"):
        path = path.replace("{" + name + "}", "{" + name + ":" + SEGMENT + "}")
    return path


def _no_constants(text: str) -> Any:
    raise ValueError(f"{text} is not JSON")


class HttpApi:
    def __init__(self, server: Server) -> None:
        self.server = server
        self.settings = server.settings
        self.calls = Calls(server)
        self.in_flight = 0
        self.refused = 0  # requests answered 503 for being over --api-max-requests
        self._runner: web.AppRunner | None = None
        self._site: BoundedSite | None = None
        self._document: bytes | None = None

    def app(self, prefix: str = "") -> web.Application:
        """A new application of the operations under ``prefix``: one per port (the
        dashboard mounts one with none at /v1; the API's own port serves one with
        /v1 as its root, sparing every request a sub-application's lookup)."""
        app = web.Application(middlewares=[self._guard])
        for op in OPERATIONS:
            app.router.add_route(op.http, prefix + _route_path(op.path), self._handler(op))
        app.router.add_get(prefix + "/openapi.json", self._openapi)
        return app

    # -- listening on its own port ------------------------------------------------------

    async def start(self, host: str, port: int, tls: ssl.SSLContext | None) -> tuple[str, int]:
        root = self.app(openapi.PREFIX)
        # handler_cancellation: a client that goes away cancels its handler, so that a
        # long poll leaves the line of waiters instead of reserving a task for no one.
        self._runner = runner = web.AppRunner(
            root, access_log=None, handle_signals=False, handler_cancellation=True
        )
        await runner.setup()
        self._site = site = BoundedSite(
            runner,
            max_connections=API_CONNECTIONS,
            name="HTTP API",
            idle_timeout_s=self.settings.message_timeout_s,
        )
        try:
            return await site.start(host, port, tls)
        except BaseException:
            await runner.cleanup()
            raise

    async def stop(self) -> None:
        """Answer the waiting long polls (204), stop listening, let the requests in
        flight finish, then close the forwarding client."""
        self.calls.reserves.stop()
        if self._site is not None:
            await self._site.stop()
        if self._runner is not None:
            await self._runner.cleanup()
        await self.calls.close()

    # -- every request ------------------------------------------------------------------

    @web.middleware
    async def _guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
        token = self.settings.token
        if token is not None and not request.path.endswith("/openapi.json"):
            refused = self._refused(request, token)
            if refused is not None:
                return refused
        try:
            response: web.StreamResponse = await handler(request)
        except web.HTTPException as exc:  # no such route, or not with this method
            if exc.status < 400:
                raise
            # The protocol's code for a method it does not have.
            code = "no_method" if exc.status in (404, 405) else "bad_request"
            detail = f"no operation {request.method} {request.path}"
            return problem(exc.status, code, detail, request.path)
        return response

    def _refused(self, request: web.Request, token: str) -> web.Response | None:
        signins, address = self.server.signins, request.remote
        wait_s = signins.retry_in_s(address, "api")
        if wait_s:  # the token is not even looked at (net/signins.py)
            return problem(
                429,
                "unauthorized",
                f"too many failed sign-ins from this address: try again in {math.ceil(wait_s)} s",
                request.path,
                headers={"Retry-After": str(math.ceil(wait_s))},
            )
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(), token.encode()):
            if given:  # a token was tried: a guess, as far as we know
                signins.failed(address, "api")
            return problem(
                401,
                "unauthorized",
                "send Authorization: Bearer TOKEN (the server's --token)",
                request.path,
                headers={"WWW-Authenticate": "Bearer"},
            )
        signins.succeeded(address)
        return None

    def _handler(self, op: Operation) -> Any:
        async def handle(request: web.Request) -> web.StreamResponse:
            counted = not op.long_poll
            if counted:
                if self.in_flight >= self.settings.api_max_requests:
                    self.refused += 1
                    limit = self.settings.api_max_requests
                    return problem(
                        503,
                        "unavailable",
                        f"too many requests in flight (limit {limit}, --api-max-requests)",
                        request.path,
                    )
                self.in_flight += 1
            try:
                return await self._answer(op, request)
            finally:
                if counted:
                    self.in_flight -= 1

        return handle

    async def _answer(self, op: Operation, request: web.Request) -> web.StreamResponse:
        try:
            body = await self._json(request, op.body_required) if op.body is not None else None
            inputs = Inputs(request.match_info, request.query, body, request.headers)
            method, params = op.build(inputs)
            result = await self.calls.run(method, params)
            status, payload = op.answer(result, inputs)
        except _SlowBody:
            timeout_s = self.settings.message_timeout_s
            response = problem(
                408, "bad_request", f"no complete body for {timeout_s:g} s", request.path
            )
            # Sent now, then the connection closed: aiohttp would otherwise keep
            # reading what is left of the body for its lingering time.
            await response.prepare(request)
            await response.write_eof()
            request.protocol.force_close()
            return response
        except RequestError as exc:
            response = from_error(exc, request.path)
            if exc.code == "too_large" and op.body is not None:
                response.force_close()  # what is left of the body is not read
            return response
        except Exception as exc:  # a bug: logged, answered as the protocol's internal
            log.exception("internal error in %s %s", request.method, op.path, exc_info=exc)
            detail = f"internal error in {op.op_id}: {exc!r}"
            return problem(500, "internal", detail, request.path)
        if payload is None:
            return web.Response(status=status)
        return web.Response(
            status=status, body=json.dumps(payload).encode(), content_type="application/json"
        )

    async def _json(self, request: web.Request, required: bool = True) -> Any:
        """The body as JSON, read within the bounds (see the module docstring);
        None for an empty one that is not ``required``."""
        limit = self.settings.max_message_bytes
        length = request.content_length
        if length is not None and length > limit:
            raise RequestError(
                "too_large",
                f"the body is {length} bytes, over the {limit}-byte limit (--max-message)",
            )
        if request.content.is_eof():
            # All of it has arrived (a small body mostly comes with the head): no timer.
            raw = await _read(request, limit)
        else:
            try:
                raw = await asyncio.wait_for(_read(request, limit), self.settings.message_timeout_s)
            except asyncio.TimeoutError:
                raise _SlowBody from None
        if not raw.strip():
            if not required:
                return None
            raise BadInput("this operation takes a JSON body")
        try:
            return json.loads(raw, parse_constant=_no_constants)
        except (ValueError, RecursionError) as exc:
            raise BadInput(f"the body is not JSON: {exc}") from None

    async def _openapi(self, request: web.Request) -> web.StreamResponse:
        if self._document is None:
            self._document = json.dumps(openapi.document()).encode()
        return web.Response(body=self._document, content_type="application/json")


async def _read(request: web.Request, limit: int) -> bytes:
    chunks, size = [], 0
    async for chunk in request.content.iter_any():
        size += len(chunk)
        if size > limit:
            raise RequestError(
                "too_large", f"the body is over the {limit}-byte limit (--max-message)"
            )
        chunks.append(chunk)
    return b"".join(chunks)
