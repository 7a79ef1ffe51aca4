"""The HTTP API on the dashboard's port: an aiohttp application that app.py mounts at /v1.

Every path under it goes to site.py's ``HttpApi.respond``, as the API's own port's
requests do (wire.py); here aiohttp reads the request. Its body is read within the
bounds: at most --max-message bytes (413 past it, the rest unread) within
--message-timeout (408, and the connection closed).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from aiohttp import web

from delaywheel.httpapi.messages import ApiRequest, Reply, first_values
from delaywheel.httpapi.problems import problem

if TYPE_CHECKING:
    from delaywheel.httpapi.site import HttpApi


class _TooLarge(Exception):
    pass


def mounted(api: HttpApi) -> web.Application:
    async def handle(request: web.Request) -> web.StreamResponse:
        return await _handle(api, request)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


async def _handle(api: HttpApi, request: web.Request) -> web.StreamResponse:
    settings = api.settings
    limit, timeout_s = settings.max_message_bytes, settings.message_timeout_s
    path = request.raw_path.partition("?")[0]
    body = None
    if request.body_exists:
        try:
            body = await asyncio.wait_for(_read(request, limit), timeout_s)
        except _TooLarge:
            detail = f"the body is over the {limit}-byte limit (--max-message)"
            response = _response(problem(413, "too_large", detail, request.path))
            response.force_close()  # what is left of the body is not read
            return response
        except asyncio.TimeoutError:
            detail = f"no complete body for {timeout_s:g} s"
            response = _response(problem(408, "bad_request", detail, request.path))
            # Sent now, then the connection closed: aiohttp would otherwise keep
            # reading what is left of the body for its lingering time.
            await response.prepare(request)
            await response.write_eof()
            request.protocol.force_close()
            return response
    headers = first_values((name.lower(), value) for name, value in request.headers.items())
    query = first_values(request.query.items())
    reply = await api.respond(
        ApiRequest(request.method, path, query, headers, body, request.remote)
    )
    return _response(reply)


async def _read(request: web.Request, limit: int) -> bytes:
    length = request.content_length
    if length is not None and length > limit:
        raise _TooLarge
    chunks, size = [], 0
    async for chunk in request.content.iter_any():
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def _response(reply: Reply) -> web.Response:
    return web.Response(
        status=reply.status,
        body=reply.body or None,
        content_type=reply.content_type,
        headers=dict(reply.headers),
    )
