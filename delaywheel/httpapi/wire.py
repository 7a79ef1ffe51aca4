"""The API port's HTTP/1.1: its connections, read with httptools and answered by the server.

aiohttp's server keeps, for each connection, a request handler, its parser, a queue and
a task, and for each request a Request with its headers and URL and a task holding the
frames of the handler's chain: about 9 kB for a long poll that waits before any of ours,
twice what a protocol connection with a blocked ``reserve`` holds. So the API's own port
is an asyncio protocol of ours over httptools (Node's llhttp, in C: it calls us back
with a request's parts, holds no task), and the dashboard's port serves /v1 through
aiohttp (mount.py). A connection is an ``ApiConnection``: its transport, its parser, a
timer. A request is read whole (head, then body), handed to site.py, and its reply
written by us; a long poll that waits holds the connection, a place in the engine's
line and a timer (net/calls.py), as a blocked ``reserve`` does, and no parser (one is
0.9 kB; it holds nothing between requests, so the next is read by a new one).

What is read is llhttp's, strict (RFC 9112; no leniency is turned on): the request line
and header fields, CRLF ends each line (a bare LF, a folded field are refused), a body
by one Content-Length or chunked; ``Expect: 100-continue`` answered before the body is
read; keep-alive as HTTP/1.1 has it (an HTTP/1.0 request is answered and its connection
closed). What llhttp refuses is answered 400 (505 for a version it does not know) as a
problem, the connection closed and logged as the dashboard's are (net/httpsite.py).
Refused here besides: an HTTP version other than 1.0 and 1.1 (505), a head over
``MAX_HEAD_BYTES`` or with more than ``MAX_FIELDS`` fields (431), a transfer coding other
than chunked (501), a protocol upgrade or CONNECT (501), a missing Host on HTTP/1.1
(400), and, as framing a proxy may read otherwise (request smuggling), Transfer-Encoding
on HTTP/1.0 (400; llhttp refuses it beside Content-Length, and two Content-Lengths). A
body over --max-message is 413, the connection closed and the rest unread. Requests on
a connection are answered in order, one at a time: what a client sends meanwhile waits
unread (reading paused past ``MAX_HEAD_BYTES`` and --max-message), bytes are handed to
the parser ``FEED_BYTES`` at a time and only once the requests it read before are
answered, and none is read while the client does not read its replies.

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

from httptools import HttpParserCallbackError, HttpParserError, HttpParserUpgrade, HttpRequestParser

from delaywheel.httpapi.messages import ApiRequest, Reply, query_of
from delaywheel.httpapi.problems import problem
from delaywheel.net.httpsite import MalformedLog, refuse_connection
from delaywheel.net.limits import API_CONNECTIONS
from delaywheel.net.listener import BACKLOG

if TYPE_CHECKING:
    import ssl
    from collections.abc import Callable

    from delaywheel.httpapi.site import HttpApi

# A request's line and header fields: at most this many bytes (a head is refused once
# the bytes handed to the parser wholly within it pass this, so by the time at most
# ``FEED_BYTES`` more have come), and fields.
MAX_HEAD_BYTES = 16_384
MAX_FIELDS = 100
# Bytes handed to the parser at once: it reads all it is given, so this bounds the
# requests read ahead of their answers (each waits, parsed, in ``ApiConnection.ready``).
FEED_BYTES = 4096
# Seconds the requests in flight get to finish when the server stops.
STOP_GRACE_S = 10.0

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
# llhttp's reason for a version it does not read (HTTP/1.2, HTTP/3.1): 505 as ours.
_BAD_VERSION = "Invalid HTTP version"


class Refused(Exception):
    """A request the server answers ``reply`` and reads no further; ``malformed``: it is
    counted and logged as one (a 413 or a 503 is not)."""

    def __init__(self, reply: Reply, malformed: bool = True) -> None:
        super().__init__(reply.status)
        self.reply, self.malformed = reply, malformed


def refused(status: int, detail: str) -> Refused:
    return Refused(problem(status, "bad_request", f"malformed request: {detail}", ""))


def read_request(
    method: bytes, target: bytes, version: str, fields: dict[str, str], remote: str | None
) -> tuple[ApiRequest, int | None]:
    """A request head as site.py's request, and its body's length (None: chunked).
    Raises what the server refuses of it besides llhttp (above)."""
    if version not in ("1.1", "1.0"):
        raise refused(505, f"the version {version} is not HTTP/1.1 or HTTP/1.0")
    if version == "1.1" and "host" not in fields:
        raise refused(400, "no Host field on HTTP/1.1")
    length: int | None = int(fields.get("content-length", "0"))  # checked by llhttp
    coding = fields.get("transfer-encoding")
    if coding is not None:  # llhttp refuses it beside Content-Length
        if version != "1.1":
            raise refused(400, "Transfer-Encoding on HTTP/1.0")
        if coding.lower() != "chunked":
            raise refused(501, f"the transfer coding {coding!r}: only chunked is read")
        length = None
    text = target.decode("latin-1")  # llhttp lets no byte over 0x7e through
    split = None if text.startswith("/") else urlsplit(text)
    if split is not None and split.scheme in ("http", "https"):  # the absolute form
        text = (split.path or "/") + ("?" + split.query if split.query else "")
    path, _, query = text.partition("?")
    request = ApiRequest(method.decode("ascii"), path, query_of(query), fields, None, remote)
    return request, length


_date: tuple[int, str] = (0, "")


def _now_date() -> str:
    """The Date field's value, made once a second."""
    global _date
    second = int(time.time())
    if _date[0] != second:
        _date = (second, formatdate(second, usegmt=True))
    return _date[1]


def response_head(reply: Reply, close: bool) -> bytes:
    """``reply``'s status line and header fields (the body is sent after it)."""
    status = reply.status
    lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}", f"Date: {_now_date()}"]
    if reply.content_type is not None:
        lines.append(f"Content-Type: {reply.content_type}")
    lines += [f"{name}: {value}" for name, value in reply.headers.items()]
    if status != 204:
        lines.append(f"Content-Length: {len(reply.body)}")
    if close:
        lines.append("Connection: close")
    lines.append("\r\n")
    return "\r\n".join(lines).encode("latin-1")


class ApiConnection(asyncio.Protocol):
    """One connection to the API port: a request read, answered, the next."""

    __slots__ = (
        "body", "busy", "cancel", "closing", "continue_due", "field_count", "fields", "head_fed",
        "listener", "parser", "paused", "pending", "ready", "request", "stalled", "target",
        "timer", "transport",
    )  # fmt: skip

    def __init__(self, listener: Listener) -> None:
        self.listener = listener
        self.transport: asyncio.Transport | None = None
        self.parser: HttpRequestParser | None = None  # made when bytes come; None: between
        self.pending: bytearray | None = None  # received, not yet handed to the parser
        self.ready: list[tuple[ApiRequest, bool] | Reply] = []  # read, to answer in order
        self.target = b""  # the head being read: its target, its fields (None: no head)
        self.fields: dict[str, str] | None = None
        self.field_count = 0  # its fields so far
        self.head_fed = 0  # bytes handed to the parser wholly within the head
        self.request: ApiRequest | None = None  # the request whose body is coming
        self.body: bytearray | None = None  # its body so far
        self.continue_due = False  # it asked for 100 Continue and none was sent
        self.closing = False  # the reply being made closes the connection
        self.timer: asyncio.TimerHandle | None = None  # for the head, or the body
        self.busy = False  # a request is being answered
        self.stalled = False  # writing paused: the client does not read its replies
        self.paused = False  # reading paused: too much came unread
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
        transport = self.transport
        if transport is None or transport.is_closing():  # refused, or answered
            return
        pending = self.pending
        if pending is not None:
            pending += data
            if len(pending) > self.listener.buffer_limit and not self.paused:
                self.paused = True
                transport.pause_reading()
        elif self.busy or self.stalled or len(data) > FEED_BYTES:
            self.pending = bytearray(data)
        else:
            self._feed(data)
        self._read()

    def pause_writing(self) -> None:
        self.stalled = True  # the client is not reading its replies: read no more requests

    def resume_writing(self) -> None:
        self.stalled = False
        self._next()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.listener.connections.discard(self)
        self._drop_request()
        self.transport = self.parser = self.pending = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        cancel, self.cancel = self.cancel, None
        if cancel is not None:  # a long poll leaves the line; a request is cancelled
            cancel()

    # -- reading requests -----------------------------------------------------------

    def _read(self) -> None:
        """Answer the requests read, in order; hand the parser more bytes when none is
        left; again while each is answered at once."""
        ready = self.ready
        while not self.busy and not self.stalled and self.transport is not None:
            if self.transport.is_closing():
                return
            if ready:
                item = ready.pop(0)
                if isinstance(item, Reply):  # refused: the rest is not read
                    self._close_with(item)
                    return
                self._start(*item)
                continue
            pending = self.pending
            if not pending:
                self.pending = None
                if self.continue_due:  # all read: the client waits for the 100 to send on
                    self.continue_due = False
                    self.transport.write(_CONTINUE)
                return
            data = bytes(pending[:FEED_BYTES])
            del pending[:FEED_BYTES]
            self._feed(data)

    def _feed(self, data: bytes) -> None:
        """Hand ``data`` to the parser: the requests it completes are queued in ``ready``;
        what it or we refuse is queued after them, and nothing more is read."""
        parser = self.parser
        if parser is None:
            parser = self.parser = HttpRequestParser(self)
        within_head = self.fields is not None
        try:
            parser.feed_data(data)
        except HttpParserCallbackError as exc:
            cause = exc.__context__
            if not isinstance(cause, Refused):  # a bug of ours in a callback
                raise
            self._refuse(cause)
        except HttpParserError as exc:
            ready = self.ready
            if ready and isinstance(ready[-1], tuple) and ready[-1][1]:
                # Bytes after a request that closes the connection: never read.
                self.parser = self.pending = None
                return
            self._refuse(refused(505 if str(exc) == _BAD_VERSION else 400, str(exc)), exc)
        except HttpParserUpgrade as exc:  # on_headers_complete refuses them first
            self._refuse(refused(501, "a protocol upgrade"), exc)
        else:
            if within_head and self.fields is not None:  # still in the same head
                self.head_fed += len(data)
                if self.head_fed > MAX_HEAD_BYTES:
                    detail = f"the head is over {MAX_HEAD_BYTES} bytes: too long"
                    self._refuse(refused(431, detail))

    def _refuse(self, refusal: Refused, exc: BaseException | None = None) -> None:
        if refusal.malformed:
            assert self.transport is not None
            peer = self.transport.get_extra_info("peername")
            remote = peer[0] if isinstance(peer, tuple) else None
            self.listener.malformed.log(remote, exc or refusal, refusal.reply.status)
        self._drop_request()
        self.parser = self.pending = self.fields = None
        self.ready.append(refusal.reply)

    # The parser's callbacks (httptools), inside ``feed_data``: they raise ``Refused``.

    def on_message_begin(self) -> None:
        self.target, self.fields, self.field_count, self.head_fed = b"", {}, 0, 0

    def on_url(self, url: bytes) -> None:
        self.target += url

    def on_header(self, name: bytes, value: bytes) -> None:
        fields = self.fields
        if fields is None:  # a chunked body's trailer field: read past
            return
        self.field_count += 1
        if self.field_count > MAX_FIELDS:
            raise refused(431, f"more than {MAX_FIELDS} header fields")
        # Each name's first value; llhttp trims the spaces before a value, not after.
        fields.setdefault(name.decode("latin-1").lower(), value.decode("latin-1").rstrip(" \t"))

    def on_headers_complete(self) -> None:
        parser, fields, transport = self.parser, self.fields, self.transport
        assert parser is not None and fields is not None and transport is not None
        self.fields = None
        if parser.should_upgrade():
            raise refused(501, "a protocol upgrade (Upgrade, CONNECT) is not served here")
        peer = transport.get_extra_info("peername")
        remote = peer[0] if isinstance(peer, tuple) else None
        version = parser.get_http_version()
        request, length = read_request(parser.get_method(), self.target, version, fields, remote)
        self.target = b""
        limit = self.listener.max_body
        if length is not None and length > limit:
            detail = f"the body is {length} bytes, over the {limit}-byte limit (--max-message)"
            raise Refused(problem(413, "too_large", detail, ""), malformed=False)
        if length != 0:
            # A request whose body is coming is in flight (site.py): a slot is held
            # until its body is whole.
            busy = self.listener.api.take_slot(request.path)
            if busy is not None:
                raise Refused(busy, malformed=False)
            self.body = bytearray()
            self._arm()  # the body has --message-timeout from now
            expect = fields.get("expect", "").lower() == "100-continue"
            self.continue_due = expect and version == "1.1"
        self.request = request

    def on_body(self, data: bytes) -> None:
        body = self.body
        assert body is not None
        self.continue_due = False
        body += data
        if len(body) > self.listener.max_body:
            limit = self.listener.max_body
            detail = f"the body is over the {limit}-byte limit (--max-message)"
            raise Refused(problem(413, "too_large", detail, ""), malformed=False)

    def on_message_complete(self) -> None:
        parser, request, body = self.parser, self.request, self.body
        assert parser is not None and request is not None
        if body is not None:
            request.body = bytes(body)
        self._drop_request()
        self.continue_due = False
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        close = parser.get_http_version() != "1.1" or not parser.should_keep_alive()
        self.ready.append((request, close))

    def _start(self, request: ApiRequest, close: bool) -> None:
        """Answer ``request``: at once, held (a long poll), or by a task."""
        self.busy, self.closing = True, close
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        api = self.listener.api
        begun = api.begin(request)
        if isinstance(begun, Reply):
            self.reply(begun, head_only=request.method == "HEAD")
            return
        op, params = begun
        if op.long_poll and api.holds_long_polls():
            self.cancel = api.long_poll(op, params, request, self._polled)
            if self.cancel is not None and self.fields is None and self.request is None:
                self.parser = None  # it waits: no request's bytes are in the parser
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
        closed (``close``, the server stopping, or as the request asked)."""
        self.cancel, self.busy = None, False
        transport = self.transport
        if transport is None or transport.is_closing():  # the client went away
            return
        close = close or self.closing or self.listener.stopping
        head = response_head(reply, close)
        transport.write(head if head_only or not reply.body else head + reply.body)
        if close:
            transport.close()
            return
        self._arm()

    def _next(self) -> None:
        """Read on, once a reply is written and the client reads its replies."""
        if self.busy or self.stalled or self.transport is None:
            return
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
