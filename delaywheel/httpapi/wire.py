"""The API port's HTTP/1.1: its connections, read and answered by the server itself.

aiohttp's server keeps, for each connection, a request handler, its parser, a queue and
a task, and for each request a Request with its headers and URL and a task holding the
frames of the handler's chain: about 9 kB for a long poll that waits before any of ours,
twice what a protocol connection with a blocked ``reserve`` holds. So the API's own port
is served here, and the dashboard's port serves /v1 through aiohttp (mount.py). A
connection is an ``ApiConnection``: its transport, a buffer while a request comes in, a
timer. A request is read whole (head, then body), handed to site.py, and its reply
written; a long poll that waits holds the connection, a place in the engine's line and a
timer (net/calls.py), as a blocked ``reserve`` does.

What is read (RFC 9112): a request line (origin or absolute form; HTTP/1.1 or 1.0) and
header fields, ``MAX_HEAD_BYTES`` at most; a body by Content-Length or chunked (not both,
no other transfer coding), at most --max-message bytes (past it 413 and the connection
closed, the rest unread); ``Expect: 100-continue`` is answered before the body is read.
Anything else is malformed: 400, the connection closed, logged as the dashboard's are
(net/httpsite.py). Requests on a connection are answered in order, one at a time: what
a client sends meanwhile waits in the buffer (reading paused past ``MAX_HEAD_BYTES`` and
--max-message), and none is read while the client does not read its replies.
Connections are kept alive as HTTP/1.1 has it (1.0: only with ``Connection:
keep-alive``).

Bounds: a request's head must arrive within --message-timeout of the connection or of
the previous reply (else the connection is closed), its body within --message-timeout of
its head (else 408 and closed); at most ``API_CONNECTIONS`` connections (past it 503 and
closed, net/httpsite.py).
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from typing import TYPE_CHECKING, cast
from urllib.parse import unquote

from delaywheel.httpapi.messages import ApiRequest, Reply, query_of
from delaywheel.httpapi.problems import problem
from delaywheel.net.httpsite import MalformedLog, refuse_connection
from delaywheel.net.limits import API_CONNECTIONS
from delaywheel.net.listener import BACKLOG

if TYPE_CHECKING:
    import ssl
    from collections.abc import Callable

    from delaywheel.httpapi.site import HttpApi

# A request's line and header fields: at most this many bytes, and fields.
MAX_HEAD_BYTES = 16_384
MAX_FIELDS = 100
# A chunk-size line (with extensions) or a trailer field: at most this long.
MAX_CHUNK_LINE = 4096
# Seconds the requests in flight get to finish when the server stops.
STOP_GRACE_S = 10.0

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
# Control characters but horizontal tab (CR and LF among them): never in a field value.
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_TARGET = re.compile(rb"[\x21-\x7e]+\Z")
_ABSOLUTE = re.compile(rb"[hH][tT][tT][pP][sS]?://[^/?]*")
_HEX = re.compile(rb"[0-9A-Fa-f]{1,15}\Z")
_CHUNKED = -1  # Head.length of a chunked body


class Malformed(Exception):
    """A request that is not HTTP/1.1 as RFC 9112 has it. Its text names the part
    that is wrong, never quotes it (the log line must not show headers)."""


class _TooLarge(Exception):
    """A body over --max-message."""


@dataclass(slots=True)
class Head:
    method: str
    path: str
    query: str
    headers: dict[str, str]  # lower-cased names, each one's first value
    length: int  # the body's bytes; _CHUNKED
    keep_alive: bool
    expect_continue: bool


def parse_head(raw: bytes) -> Head:
    """A request's line and fields (``raw``: up to the blank line, not included)."""
    line, *fields = raw.split(b"\r\n")
    parts = line.split(b" ")
    if len(parts) != 3:
        raise Malformed("the request line is not METHOD TARGET VERSION")
    method, target, version = parts
    if not _TOKEN.match(method):
        raise Malformed("the method is not a token")
    if version not in (b"HTTP/1.1", b"HTTP/1.0"):
        raise Malformed("the version is not HTTP/1.1 or HTTP/1.0")
    if not _TARGET.match(target):
        raise Malformed("the request target is empty or holds a space or control byte")
    absolute = _ABSOLUTE.match(target)
    if absolute is not None:  # absolute-form: the path is what follows the authority
        target = target[absolute.end() :] or b"/"
    if len(fields) > MAX_FIELDS:
        raise Malformed(f"more than {MAX_FIELDS} header fields")
    headers: dict[str, str] = {}
    lengths: list[bytes] = []
    codings: list[bytes] = []
    for field in fields:
        name, colon, value = field.partition(b":")
        if not colon or not _TOKEN.match(name):  # a space before the colon, a fold
            raise Malformed("a header field is not NAME: VALUE")
        value = value.strip(b" \t")
        if _BAD_VALUE.search(value):
            raise Malformed("a header value holds a control byte")
        key = name.decode("ascii").lower()
        if key == "content-length":
            lengths.append(value)
        elif key == "transfer-encoding":
            codings.append(value)
        headers.setdefault(key, value.decode("latin-1"))
    http11 = version == b"HTTP/1.1"
    return Head(
        method.decode("ascii"),
        *target.decode("ascii").partition("?")[::2],
        headers,
        _body_length(lengths, codings, http11),
        _keep_alive(headers.get("connection", ""), http11),
        http11 and headers.get("expect", "").lower() == "100-continue",
    )


def _body_length(lengths: list[bytes], codings: list[bytes], http11: bool) -> int:
    """How the body is framed (RFC 9112 6.3): its length, or _CHUNKED."""
    if codings:
        if lengths:  # the two together are how requests get smuggled
            raise Malformed("both Content-Length and Transfer-Encoding")
        named = [c.strip().lower() for v in codings for c in v.split(b",")]
        if not http11 or named != [b"chunked"]:
            raise Malformed("a transfer coding other than chunked")
        return _CHUNKED
    if not lengths:
        return 0
    if len(set(lengths)) != 1 or not lengths[0].isdigit() or len(lengths[0]) > 15:
        raise Malformed("the Content-Length is not one number")
    return int(lengths[0])


def _keep_alive(connection: str, http11: bool) -> bool:
    options = {option.strip() for option in connection.lower().split(",")}
    return "close" not in options if http11 else "keep-alive" in options


class Chunks:
    """A chunked body, decoded as it arrives (RFC 9112 7.1); extensions and
    trailer fields are read past."""

    __slots__ = ("body", "left", "state")

    def __init__(self) -> None:
        self.body = bytearray()
        self.left = 0  # bytes of the current chunk not yet read
        self.state = "size"  # size, data, crlf, trailer

    def feed(self, buffer: bytearray, limit: int) -> bool:
        """Take what ``buffer`` holds of the body; True once it is whole."""
        while True:
            if self.state == "data":
                taken = min(self.left, len(buffer))
                if not taken:
                    return False
                self.body += buffer[:taken]
                del buffer[:taken]
                self.left -= taken
                if not self.left:
                    self.state = "crlf"
            elif self.state == "crlf":
                if len(buffer) < 2:
                    return False
                if buffer[:2] != b"\r\n":
                    raise Malformed("a chunk does not end with CRLF")
                del buffer[:2]
                self.state = "size"
            else:
                line = _line(buffer)
                if line is None:
                    return False
                if self.state == "trailer":
                    if not line:
                        return True
                    continue
                size = line.split(b";", 1)[0].strip(b" \t")
                if not _HEX.match(size):
                    raise Malformed("a chunk size is not a hex number")
                self.left = int(size, 16)
                if len(self.body) + self.left > limit:
                    raise _TooLarge
                self.state = "data" if self.left else "trailer"


def _line(buffer: bytearray) -> bytes | None:
    """The first line of ``buffer``, taken out of it; None while it is not whole."""
    end = buffer.find(b"\r\n")
    if end < 0:
        if len(buffer) > MAX_CHUNK_LINE:
            raise Malformed(f"a chunk line over {MAX_CHUNK_LINE} bytes")
        return None
    line = bytes(buffer[:end])
    del buffer[: end + 2]
    return line


_date: tuple[int, str] = (0, "")


def _now_date() -> str:
    """The Date field's value, made once a second."""
    global _date
    second = int(time.time())
    if _date[0] != second:
        _date = (second, formatdate(second, usegmt=True))
    return _date[1]


def encode(reply: Reply, close: bool, head_only: bool = False) -> bytes:
    """``reply`` as HTTP/1.1 bytes."""
    status = reply.status
    lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}", f"Date: {_now_date()}"]
    if reply.content_type is not None:
        lines.append(f"Content-Type: {reply.content_type}")
    lines += [f"{name}: {value}" for name, value in reply.headers.items()]
    if status != 204:
        lines.append(f"Content-Length: {len(reply.body)}")
    if close:
        lines.append("Connection: close")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only or status == 204 else head + reply.body


class ApiConnection(asyncio.Protocol):
    """One connection to the API port: a request read, answered, the next."""

    __slots__ = (
        "buffer", "busy", "cancel", "chunks", "closing", "head", "listener", "paused",
        "stalled", "timer", "transport",
    )  # fmt: skip

    def __init__(self, listener: Listener) -> None:
        self.listener = listener
        self.transport: asyncio.Transport | None = None
        self.buffer: bytearray | None = None  # what has come of the next request
        self.head: Head | None = None  # the request whose body is coming
        self.chunks: Chunks | None = None  # its body, when chunked
        self.timer: asyncio.TimerHandle | None = None  # for the head, or the body
        self.busy = False  # a request is being answered
        self.stalled = False  # writing paused: the client does not read its replies
        self.closing = False  # closed after this reply
        self.paused = False  # reading paused: the buffer is full
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
        if self.buffer is None:
            self.buffer = bytearray(data)
        else:
            self.buffer += data
        if not self.busy and not self.stalled:
            self._read()
        elif len(self.buffer) > self.listener.buffer_limit and not self.paused:
            self.paused = True
            assert self.transport is not None
            self.transport.pause_reading()

    def pause_writing(self) -> None:
        self.stalled = True  # the client is not reading its replies: read no more requests

    def resume_writing(self) -> None:
        self.stalled = False
        self._next()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.listener.connections.discard(self)
        self._drop_head()
        self.transport = self.buffer = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        cancel, self.cancel = self.cancel, None
        if cancel is not None:  # a long poll leaves the line; a request is cancelled
            cancel()

    # -- reading a request ----------------------------------------------------------

    def _read(self) -> None:
        """Read what the buffer holds: a head, a body, then hand the request on."""
        buffer, listener = self.buffer, self.listener
        if buffer is None or self.transport is None:
            return
        head = self.head
        if head is None:
            while buffer[:2] == b"\r\n":  # blank lines before a request are allowed
                del buffer[:2]
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > MAX_HEAD_BYTES:
                    self._malformed(Malformed(f"the head is over {MAX_HEAD_BYTES} bytes"))
                return
            if end > MAX_HEAD_BYTES:
                self._malformed(Malformed(f"the head is over {MAX_HEAD_BYTES} bytes"))
                return
            raw = bytes(buffer[:end])
            del buffer[: end + 4]
            try:
                head = parse_head(raw)
            except Malformed as exc:
                self._malformed(exc)
                return
            if head.length > listener.max_body:
                self._too_large(head.length)
                return
            if head.length:
                # A request whose body is coming is in flight (site.py): a slot is
                # held until its body is whole.
                busy = listener.api.take_slot(head.path)
                if busy is not None:
                    self._close_with(busy)
                    return
                self.head, self.chunks = head, Chunks() if head.length == _CHUNKED else None
                self._arm()  # the body has --message-timeout from now
                if head.expect_continue:
                    self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        body: bytes | None = None
        if head.length == _CHUNKED:
            assert self.chunks is not None
            try:
                if not self.chunks.feed(buffer, listener.max_body):
                    return
            except Malformed as exc:
                self._malformed(exc)
                return
            except _TooLarge:
                self._too_large(None)
                return
            body = bytes(self.chunks.body)
        elif head.length:
            if len(buffer) < head.length:
                return
            body = bytes(buffer[: head.length])
            del buffer[: head.length]
        if not buffer:
            self.buffer = None
        self._start(head, body)

    def _start(self, head: Head, body: bytes | None) -> None:
        """Answer the request: at once, held (a long poll), or by a task."""
        self._drop_head()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.busy, self.closing = True, not head.keep_alive
        transport, api = self.transport, self.listener.api
        assert transport is not None
        peer = transport.get_extra_info("peername")
        remote = peer[0] if isinstance(peer, tuple) else None
        request = ApiRequest(
            head.method, head.path, query_of(head.query), head.headers, body, remote
        )
        begun = api.begin(request)
        if isinstance(begun, Reply):
            self.reply(begun, head_only=head.method == "HEAD")
            return
        op, params = begun
        if op.long_poll and api.holds_long_polls():
            self.cancel = api.long_poll(op, params, request, self.reply)
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

    def reply(self, reply: Reply, head_only: bool = False) -> None:
        """Write ``reply``; then the next request, or the connection closed."""
        self.cancel, self.busy = None, False
        transport = self.transport
        if transport is None or transport.is_closing():  # the client went away
            return
        close = self.closing or self.listener.stopping
        transport.write(encode(reply, close, head_only))
        if close:
            transport.close()
            return
        self._arm()
        if self.buffer or self.paused:  # the next request: next turn, not inside this one
            asyncio.get_running_loop().call_soon(self._next)

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
        if self.head is None:  # idle, or a head that never finished: closed
            self.transport.close()
            return
        timeout_s = self.listener.timeout_s
        detail = f"no complete body for {timeout_s:g} s"
        self._close_with(problem(408, "bad_request", detail, unquote(self.head.path)))

    def _malformed(self, exc: Malformed) -> None:
        assert self.transport is not None
        peer = self.transport.get_extra_info("peername")
        self.listener.malformed.log(peer[0] if isinstance(peer, tuple) else None, exc)
        self._close_with(problem(400, "bad_request", f"malformed request: {exc}", ""))

    def _too_large(self, length: int | None) -> None:
        limit = self.listener.max_body
        size = "over" if length is None else f"{length} bytes,"
        detail = f"the body is {size} the {limit}-byte limit (--max-message)"
        self._close_with(problem(413, "too_large", detail, ""))

    def _close_with(self, reply: Reply) -> None:
        """Answer and close: what is left of the request is not read."""
        self._drop_head()
        self.closing = True
        self.reply(reply)

    def _drop_head(self) -> None:
        """Done reading a request's body: its slot in flight is freed."""
        if self.head is not None:
            self.head = self.chunks = None
            self.listener.api.in_flight -= 1


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
