"""The API port's HTTP/1.1: its connections, read with h11 and answered by the server.

aiohttp's server keeps, for each connection, a request handler, its parser, a queue and
a task, and for each request a Request with its headers and URL and a task holding the
frames of the handler's chain: about 9 kB for a long poll that waits before any of ours,
twice what a protocol connection with a blocked ``reserve`` holds. So the API's own port
is an asyncio protocol of ours over h11 (sans-IO HTTP/1.1: it reads and frames the
bytes, holds no task), and the dashboard's port serves /v1 through aiohttp (mount.py).
A connection is an ``ApiConnection``: its transport, its ``h11.Connection``, a timer.
A request is read whole (head, then body), handed to site.py, and its reply written; a
long poll that waits holds the connection, a place in the engine's line and a timer
(net/calls.py), as a blocked ``reserve`` does.

What is read is h11's (RFC 9112): the request line and header fields, at most
``MAX_HEAD_BYTES``; a body by Content-Length or chunked; ``Expect: 100-continue``
answered before the body is read; keep-alive as HTTP/1.1 has it (an HTTP/1.0 request
is answered and its connection closed). What h11 refuses is answered with its status
hint (400, 431 for a head too large, 501 for a transfer coding other than chunked) as a
problem, the connection closed and logged as the dashboard's are (net/httpsite.py).
Refused here besides: an HTTP version other than 1.0 and 1.1 (505), more than
``MAX_FIELDS`` header fields (431), and, as framing a proxy may read otherwise (request
smuggling), Content-Length beside Transfer-Encoding and Transfer-Encoding on HTTP/1.0
(400). A body over --max-message is 413, the connection closed and the rest unread.
Requests on a connection are answered in order, one at a time: what a client sends
meanwhile waits unread (reading paused past ``MAX_HEAD_BYTES`` and --max-message), and
none is read while the client does not read its replies.

Bounds: a request's head must arrive within --message-timeout of the connection or of
the previous reply (else the connection is closed), its body within --message-timeout of
its head (else 408 and closed); at most ``API_CONNECTIONS`` connections (past it 503 and
closed, net/httpsite.py).
"""

from __future__ import annotations

import asyncio
import time
from email.utils import formatdate
from http import HTTPStatus
from typing import TYPE_CHECKING, cast
from urllib.parse import unquote, urlsplit

import h11

from delaywheel.httpapi.messages import ApiRequest, Reply, query_of
from delaywheel.httpapi.problems import problem
from delaywheel.net.httpsite import MalformedLog, refuse_connection
from delaywheel.net.limits import API_CONNECTIONS
from delaywheel.net.listener import BACKLOG

if TYPE_CHECKING:
    import ssl
    from collections.abc import Callable

    from delaywheel.httpapi.site import HttpApi

# A request's line and header fields: at most this many bytes (h11's bound on what it
# holds of an event not yet whole), and fields.
MAX_HEAD_BYTES = 16_384
MAX_FIELDS = 100
# Seconds the requests in flight get to finish when the server stops.
STOP_GRACE_S = 10.0

_VERSIONS = (b"1.1", b"1.0")
_CONTINUE = h11.InformationalResponse(status_code=100, headers=[], reason=b"Continue")
_END = h11.EndOfMessage()
# What a held long poll's h11 connection had read, for ``resumed`` to read again.
_HELD = b"POST / HTTP/1.1\r\nHost: _\r\n\r\n"
_HELD_CLOSING = b"POST / HTTP/1.1\r\nHost: _\r\nConnection: close\r\n\r\n"


def connection() -> h11.Connection:
    return h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)


def resumed(closing: bool) -> h11.Connection:
    """An h11 connection where a held long poll's was let go (``ApiConnection._shed``):
    a request read, its reply due, the connection closed after it when ``closing``."""
    http = connection()
    http.receive_data(_HELD_CLOSING if closing else _HELD)
    http.next_event()  # the request
    http.next_event()  # its end
    return http


def refused(message: str, status: int = 400) -> h11.RemoteProtocolError:
    """A request h11 reads but this server refuses, as h11 reports its own."""
    return h11.RemoteProtocolError(message, error_status_hint=status)


def read_request(event: h11.Request, remote: str | None) -> tuple[ApiRequest, int | None]:
    """h11's request head as site.py's request, and its body's length (None: chunked).
    Raises what the server refuses of it (above)."""
    if event.http_version not in _VERSIONS:
        raise refused("the version is not HTTP/1.1 or HTTP/1.0", 505)
    if len(event.headers) > MAX_FIELDS:
        raise refused(f"more than {MAX_FIELDS} header fields", 431)
    headers: dict[str, str] = {}
    for name, value in event.headers.raw_items():  # a list: cheaper than Headers' own
        headers.setdefault(name.decode("ascii").lower(), value.decode("latin-1"))
    length: int | None = int(headers.get("content-length", "0"))  # checked by h11
    if "transfer-encoding" in headers:  # h11 lets only "chunked" through
        if "content-length" in headers:
            raise refused("both Content-Length and Transfer-Encoding")
        if event.http_version != b"1.1":
            raise refused("Transfer-Encoding on HTTP/1.0")
        length = None
    target = event.target.decode("ascii")
    split = None if target.startswith("/") else urlsplit(target)
    if split is not None and split.scheme in ("http", "https"):  # the absolute form
        target = (split.path or "/") + ("?" + split.query if split.query else "")
    path, _, query = target.partition("?")
    method = event.method.decode("ascii")
    return ApiRequest(method, path, query_of(query), headers, None, remote), length


_date: tuple[int, str] = (0, "")


def _now_date() -> str:
    """The Date field's value, made once a second."""
    global _date
    second = int(time.time())
    if _date[0] != second:
        _date = (second, formatdate(second, usegmt=True))
    return _date[1]


def response(reply: Reply, close: bool) -> h11.Response:
    """``reply``'s status line and header fields (the body is sent after it)."""
    status = reply.status
    headers = [("Date", _now_date())]
    if reply.content_type is not None:
        headers.append(("Content-Type", reply.content_type))
    headers += reply.headers.items()
    if status != 204:
        headers.append(("Content-Length", str(len(reply.body))))
    if close:
        headers.append(("Connection", "close"))
    return h11.Response(status_code=status, headers=headers, reason=HTTPStatus(status).phrase)


class ApiConnection(asyncio.Protocol):
    """One connection to the API port: a request read, answered, the next."""

    __slots__ = (
        "body", "busy", "cancel", "closing", "http", "listener", "paused", "request", "stalled",
        "timer", "transport", "unread",
    )  # fmt: skip

    def __init__(self, listener: Listener) -> None:
        self.listener = listener
        self.transport: asyncio.Transport | None = None
        self.http: h11.Connection | None = connection()  # None: let go by ``_shed``
        self.closing = False  # the held long poll's reply closes the connection
        self.request: ApiRequest | None = None  # the request whose body is coming
        self.body: bytearray | None = None  # its body so far
        self.timer: asyncio.TimerHandle | None = None  # for the head, or the body
        self.busy = False  # a request is being answered
        self.stalled = False  # writing paused: the client does not read its replies
        self.paused = False  # reading paused: too much came unread
        self.unread = 0  # bytes received while a request was answered (held by h11)
        self.cancel: Callable[[], object] | None = None  # the request being answered's

    # -- the transport's calls ------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        listener, tcp = self.listener, cast(asyncio.Transport, transport)
        if len(listener.connections) >= listener.max_connections:
            listener.refused += 1
            refuse_connection(tcp, {})
            return
        listener.connections.add(self)
        self.transport = tcp
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self.transport is None or self.transport.is_closing():  # refused, or answered
            return
        self._http().receive_data(data)
        if not self.busy and not self.stalled:
            self._read()
            return
        self.unread += len(data)
        if self.unread > self.listener.buffer_limit and not self.paused:
            self.paused = True
            self.transport.pause_reading()

    def pause_writing(self) -> None:
        self.stalled = True  # the client is not reading its replies: read no more requests

    def resume_writing(self) -> None:
        self.stalled = False
        self._next()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.listener.connections.discard(self)
        self._drop_request()
        self.transport = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        cancel, self.cancel = self.cancel, None
        if cancel is not None:  # a long poll leaves the line; a request is cancelled
            cancel()

    # -- reading a request ----------------------------------------------------------

    def _read(self) -> None:
        """Read what has come: a head, a body, then hand the request on; again while
        each is answered at once."""
        http = self._http()
        while not self.busy and self.transport is not None and not self.transport.is_closing():
            try:
                event = http.next_event()
                if type(event) is h11.Request:
                    self._head(event)
                elif type(event) is h11.Data:
                    self._data(event.data)
                elif type(event) is h11.EndOfMessage:
                    self._start()
                else:  # NEED_DATA; PAUSED (closing); ConnectionClosed (not fed)
                    return
            except h11.RemoteProtocolError as exc:
                self._malformed(exc)
                return

    def _head(self, event: h11.Request) -> None:
        transport, listener = self.transport, self.listener
        assert transport is not None
        peer = transport.get_extra_info("peername")
        request, length = read_request(event, peer[0] if isinstance(peer, tuple) else None)
        if length is not None and length > listener.max_body:
            self._too_large(length)
            return
        if length != 0:
            # A request whose body is coming is in flight (site.py): a slot is held
            # until its body is whole.
            busy = listener.api.take_slot(request.path)
            if busy is not None:
                self._close_with(busy)
                return
            self.body = bytearray()
            self._arm()  # the body has --message-timeout from now
            http = self._http()
            if http.they_are_waiting_for_100_continue:
                transport.write(http.send(_CONTINUE))
        self.request = request

    def _data(self, data: bytes) -> None:
        body = self.body
        assert body is not None
        body += data
        if len(body) > self.listener.max_body:
            self._too_large(None)

    def _start(self) -> None:
        """Answer the request: at once, held (a long poll), or by a task."""
        request, body = self.request, self.body
        assert request is not None
        if body is not None:
            request.body = bytes(body)
        self._drop_request()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.busy = True
        api = self.listener.api
        begun = api.begin(request)
        if isinstance(begun, Reply):
            self.reply(begun, head_only=request.method == "HEAD")
            return
        op, params = begun
        if op.long_poll and api.holds_long_polls():
            self.cancel = api.long_poll(op, params, request, self._polled)
            if self.cancel is not None:  # it waits
                self._shed()
            return
        task = asyncio.get_running_loop().create_task(api.answer(op, params, request))
        task.add_done_callback(self._answered)
        self.cancel = task.cancel
        if op.long_poll:  # forwarded to the other nodes: answered 204 by a stop
            self.listener.polls.add(task)

    # -- answering ------------------------------------------------------------------

    def _answered(self, task: asyncio.Task[Reply]) -> None:
        self.listener.polls.discard(task)
        if not task.cancelled():
            self.reply(task.result())
        elif self.listener.stopping:  # a forwarded long poll, cut by the stop
            self.reply(Reply(204))
        self._next()

    def _polled(self, reply: Reply) -> None:
        """A long poll's answer, maybe from inside the engine's delivery: the next
        request is read on the next turn, not inside it."""
        self.reply(reply)
        if self.transport is not None:
            asyncio.get_running_loop().call_soon(self._next)

    def reply(self, reply: Reply, head_only: bool = False, close: bool = False) -> None:
        """Write ``reply``; then the connection waits for the next request, or is
        closed (``close``, the server stopping, or as the request asked: h11's)."""
        self.cancel, self.busy = None, False
        transport = self.transport
        if transport is None or transport.is_closing():  # the client went away
            return
        http = self._http()
        close = close or self.listener.stopping
        head = http.send(response(reply, close))
        body = b"" if head_only or not reply.body else http.send(h11.Data(data=reply.body))
        transport.write(head + body + http.send(_END))
        if http.our_state is h11.MUST_CLOSE:
            transport.close()
            return
        http.start_next_cycle()
        self._arm()

    def _shed(self) -> None:
        """A long poll waits: its h11 connection (0.9 kB) is let go, to be made again
        for the reply (``resumed``) or as soon as the client sends more, so that the
        wait holds what a blocked reserve does (tests/test_long_poll_memory.py)."""
        http = self.http
        assert http is not None
        if not http.trailing_data[0]:  # no bytes of a next request wait in it
            self.closing = http.their_state is h11.MUST_CLOSE
            self.http = None

    def _http(self) -> h11.Connection:
        if self.http is None:
            self.http = resumed(self.closing)
        return self.http

    def _next(self) -> None:
        """Read on, once a reply is written and the client reads its replies."""
        if self.busy or self.stalled or self.transport is None:
            return
        self.unread = 0
        if self.paused:
            self.paused = False
            self.transport.resume_reading()
        self._read()

    def _arm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        timeout_s = self.listener.timeout_s
        self.timer = asyncio.get_running_loop().call_later(timeout_s, self._timed_out)

    def _timed_out(self) -> None:
        self.timer = None
        if self.busy or self.transport is None:
            return
        if self.request is None:  # idle, or a head that never finished: closed
            self.transport.close()
            return
        timeout_s = self.listener.timeout_s
        detail = f"no complete body for {timeout_s:g} s"
        self._close_with(problem(408, "bad_request", detail, unquote(self.request.path)))

    def _malformed(self, exc: h11.RemoteProtocolError) -> None:
        assert self.transport is not None
        peer = self.transport.get_extra_info("peername")
        status = exc.error_status_hint
        self.listener.malformed.log(peer[0] if isinstance(peer, tuple) else None, exc, status)
        self._close_with(problem(status, "bad_request", f"malformed request: {exc}", ""))

    def _too_large(self, length: int | None) -> None:
        limit = self.listener.max_body
        size = "over" if length is None else f"{length} bytes,"
        detail = f"the body is {size} the {limit}-byte limit (--max-message)"
        self._close_with(problem(413, "too_large", detail, ""))

    def _close_with(self, reply: Reply) -> None:
        """Answer and close: what is left of the request is not read."""
        self._drop_request()
        self.reply(reply, close=True)

    def _drop_request(self) -> None:
        """Done reading a request: the slot its body held in flight is freed."""
        if self.body is not None:
            self.listener.api.in_flight -= 1
        self.request = self.body = None


class Listener:
    """The API port: its connections, within the bounds above."""

    def __init__(self, api: HttpApi) -> None:
        settings = api.settings
        self.api = api
        self.timeout_s = settings.message_timeout_s
        self.max_body = settings.max_message_bytes
        # What a connection may hold unread while a request is answered.
        self.buffer_limit = MAX_HEAD_BYTES + settings.max_message_bytes
        self.max_connections = API_CONNECTIONS
        self.connections: set[ApiConnection] = set()
        self.polls: set[asyncio.Task[Reply]] = set()  # long polls forwarded (several nodes)
        self.refused = 0  # connections answered 503 for being over max_connections
        self.malformed = MalformedLog("HTTP API")
        self.stopping = False  # replies close their connections
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int, tls: ssl.SSLContext | None) -> tuple[str, int]:
        loop = asyncio.get_running_loop()
        # The protocol port's backlog: a fleet of workers polling again after a
        # restart waits there rather than have its SYNs dropped and retried.
        self._server = await loop.create_server(
            lambda: ApiConnection(self), host, port, ssl=tls, reuse_address=True, backlog=BACKLOG
        )
        address = self._server.sockets[0].getsockname()
        return address[0], address[1]

    async def stop(self) -> None:
        """Stop listening, close the idle connections, give the requests in flight
        ``STOP_GRACE_S`` to be answered (each closes its connection), then close the rest."""
        self.stopping = True
        if self._server is not None:
            self._server.close()
            self._server = None
        for conn in list(self.connections):
            if not conn.busy and conn.transport is not None:
                conn.transport.close()
        for poll in list(self.polls):
            poll.cancel()
        deadline = time.monotonic() + STOP_GRACE_S
        while self.connections and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.abort()
