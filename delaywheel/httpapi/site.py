"""The HTTP API: a request to its reply (auth, the route, the bound on requests in
flight, the call, the problem), served on its own port and mounted on the dashboard's.

``HttpApi.start`` listens on the API's own port (``--api-port``) with wire.py (HTTP/1.1
over httptools); ``app()`` is the aiohttp application app.py mounts at /v1 on the dashboard's
port when that is on too (mount.py). Both read a request into an ``ApiRequest``
(messages.py) and write the ``Reply`` made here: ``begin`` (auth, the route, the
document), then ``answer`` (the call), or for a long poll on a node that holds every
partition ``long_poll``, which holds it as a connection holds a blocked ``reserve``: a
place in the engine's line, a timer, the callback that writes the reply; no task, no
coroutine frame, nothing of the request kept (net/calls.py).

Every request but the document's needs ``Authorization: Bearer TOKEN`` on a server with
a token; failed tokens count against the address on the same rule as every other door
(net/signins.py, the ``api`` door). Bounds: at most ``--api-max-requests`` requests run
at once (a long poll that waits is not counted: it holds what a blocked ``reserve``
holds, and its connection); past that, 503 with ``Retry-After``. A body is at most
``--max-message`` bytes (413 past it) and must arrive within ``--message-timeout`` (408
and the connection closed), as a protocol message must; the headers and a keep-alive
connection's idle time have the same bound, and at most ``API_CONNECTIONS`` connections
are open (wire.py; net/httpsite.py on the dashboard's port).
"""

from __future__ import annotations

import hmac
import json
import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from delaywheel.errors import RequestError
from delaywheel.httpapi import openapi
from delaywheel.httpapi.forward import ELSEWHERE, Calls
from delaywheel.httpapi.messages import JSON, ApiRequest, Reply, json_reply
from delaywheel.httpapi.operation import Inputs, Operation
from delaywheel.httpapi.operations import OPERATIONS
from delaywheel.httpapi.problems import from_error, problem
from delaywheel.httpapi.routes import DOCUMENT_PATH, Router
from delaywheel.httpapi.values import BadInput
from delaywheel.httpapi.wire import Listener

if TYPE_CHECKING:
    import ssl

    from aiohttp import web

    from delaywheel.net.server import Server

log = logging.getLogger("delaywheel.http")  # the listeners' logger (net/httpsite.py)

# What a long poll's answer reads: its result alone (``_task_or_no_content``).
_NO_INPUTS = Inputs({}, {})


def _no_constants(text: str) -> Any:
    raise ValueError(f"{text} is not JSON")


def json_body(raw: bytes | None, required: bool = True) -> Any:
    """The body as JSON; None for an empty one that is not ``required``."""
    if raw is None or not raw.strip():
        if not required:
            return None
        raise BadInput("this operation takes a JSON body")
    try:
        return json.loads(raw, parse_constant=_no_constants)
    except (ValueError, RecursionError) as exc:
        raise BadInput(f"the body is not JSON: {exc}") from None


class HttpApi:
    def __init__(self, server: Server) -> None:
        self.server = server
        self.settings = server.settings
        self.calls = Calls(server)
        self.router = Router(OPERATIONS)
        self.in_flight = 0
        self.refused = 0  # requests answered 503 for being over --api-max-requests
        self._listener: Listener | None = None
        self._document: bytes | None = None

    def app(self) -> web.Application:
        """The API as an aiohttp application, for the dashboard's port to mount at /v1."""
        from delaywheel.httpapi.mount import mounted

        return mounted(self)

    # -- listening on its own port ------------------------------------------------------

    async def start(self, host: str, port: int, tls: ssl.SSLContext | None) -> tuple[str, int]:
        self._listener = Listener(self)
        return await self._listener.start(host, port, tls)

    async def stop(self) -> None:
        """Answer the waiting long polls (204), stop listening, let the requests in
        flight finish, then close the forwarding client."""
        if self._listener is not None:
            self._listener.stopping = True  # the long polls' answers close their connections
        self.calls.reserves.stop()
        if self._listener is not None:
            await self._listener.stop()
        await self.calls.close()

    # -- a request ------------------------------------------------------------------------

    async def respond(self, request: ApiRequest) -> Reply:
        """``request``'s reply, whatever it is."""
        begun = self.begin(request)
        if isinstance(begun, Reply):
            return begun
        return await self.answer(*begun, request)

    def begin(self, request: ApiRequest) -> Reply | tuple[Operation, dict[str, str]]:
        """Auth and the route: the operation and its path params, or the reply now
        (refused, no such operation, the document)."""
        is_document = request.path == DOCUMENT_PATH
        token = self.settings.token
        if token is not None and not is_document:
            refused = self._refused(request, token)
            if refused is not None:
                return refused
        if is_document and request.method == "GET":
            return self._openapi()
        found = self.router.match(request.method, request.path)
        if isinstance(found, int):
            path = unquote(request.path)
            detail = f"no operation {request.method} {path}"
            return problem(found, "no_method", detail, path)
        return found

    def holds_long_polls(self) -> bool:
        """Whether ``long_poll`` may hold one here: this node holds every partition
        (on several, a long poll collects from them all or follows its task)."""
        return self.server.engine.ownership.owns_all

    def long_poll(
        self,
        op: Operation,
        params: dict[str, str],
        request: ApiRequest,
        done: Callable[[Reply], None],
    ) -> Callable[[], None] | None:
        """Start a long poll (``op.long_poll``; ``holds_long_polls``): ``done`` gets its
        reply, now or once answered. Returns how to leave the line (the client went
        away), or None when ``done`` has been called or is about to be."""
        path = unquote(request.path)
        try:
            method, call = op.build(Inputs(params, request.query, None, request.headers))
            held = _LongPoll(op, path, done)
            reserves = self.calls.reserves
            start = reserves.reserve_then if method == "reserve" else reserves.wait_then
            return start(call, held.reply)
        except RequestError as exc:
            done(from_error(exc, path))
        except Exception as exc:  # a bug: logged, answered as the protocol's internal
            log.exception("internal error in %s %s", request.method, op.path, exc_info=exc)
            done(problem(500, "internal", f"internal error in {op.op_id}: {exc!r}", path))
        return None

    async def answer(self, op: Operation, params: dict[str, str], request: ApiRequest) -> Reply:
        """Call ``op`` for ``request`` within the bound on requests in flight."""
        if op.long_poll:  # not counted: it waits as a blocked reserve does
            return await self._call(op, params, request)
        busy = self.take_slot(request.path)
        if busy is not None:
            return busy
        try:
            return await self._call(op, params, request)
        finally:
            self.in_flight -= 1

    def take_slot(self, path: str) -> Reply | None:
        """Count a request in flight; 503 when ``--api-max-requests`` already are.
        The caller takes 1 off ``in_flight`` when it is done."""
        limit = self.settings.api_max_requests
        if self.in_flight >= limit:
            self.refused += 1
            detail = f"too many requests in flight (limit {limit}, --api-max-requests)"
            return problem(503, "unavailable", detail, unquote(path))
        self.in_flight += 1
        return None

    async def _call(self, op: Operation, params: dict[str, str], request: ApiRequest) -> Reply:
        path = unquote(request.path)
        try:
            body = json_body(request.body, op.body_required) if op.body is not None else None
            inputs = Inputs(params, request.query, body, request.headers)
            method, call = op.build(inputs)
            result = await self.calls.run(method, call)
            status, payload = op.answer(result, inputs)
        except RequestError as exc:
            return from_error(exc, path)
        except Exception as exc:  # a bug: logged, answered as the protocol's internal
            log.exception("internal error in %s %s", request.method, op.path, exc_info=exc)
            return problem(500, "internal", f"internal error in {op.op_id}: {exc!r}", path)
        return json_reply(status, payload)

    def _refused(self, request: ApiRequest, token: str) -> Reply | None:
        signins, address = self.server.signins, request.remote
        path = unquote(request.path)
        wait_s = signins.retry_in_s(address, "api")
        if wait_s:  # the token is not even looked at (net/signins.py)
            return problem(
                429,
                "unauthorized",
                f"too many failed sign-ins from this address: try again in {math.ceil(wait_s)} s",
                path,
                headers={"Retry-After": str(math.ceil(wait_s))},
            )
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(), token.encode()):
            if given:  # a token was tried: a guess, as far as we know
                signins.failed(address, "api")
            return problem(
                401,
                "unauthorized",
                "send Authorization: Bearer TOKEN (the server's --token)",
                path,
                headers={"WWW-Authenticate": "Bearer"},
            )
        signins.succeeded(address)
        return None

    def _openapi(self) -> Reply:
        if self._document is None:
            self._document = json.dumps(openapi.document()).encode()
        return Reply(200, self._document, JSON)


class _LongPoll:
    """What a held long poll keeps besides its place in the line: how to answer."""

    __slots__ = ("done", "op", "path")

    def __init__(self, op: Operation, path: str, done: Callable[[Reply], None]) -> None:
        self.op, self.path, self.done = op, path, done

    def reply(self, result: Any, error: RequestError | None) -> None:
        """Called from the engine's delivery or the store's answer: it must not raise."""
        try:
            if error is None:
                self.done(json_reply(*self.op.answer(result, _NO_INPUTS)))
                return
            if error.code in ELSEWHERE:  # its task's partition left while it waited
                error = RequestError("unavailable", f"{error.message}: send it again")
            self.done(from_error(error, self.path))
        except Exception:
            log.exception("the answer to a long poll on %s failed", self.path)
