"""The blocking client: plain sockets, the sans-IO codec, a small pool of connections.

How it works. Each connection is one TCP socket with ``TCP_NODELAY``, one ``Decoder`` and
one ``Encoder``. A call borrows an idle connection (or opens one, sending ``auth`` first
when a token is set), encodes the request once, writes it with one ``sendall`` and reads
until its reply is decoded, then puts the connection back. So threads never wait for each
other: one thread blocked in ``reserve`` holds its own connection while the others use
theirs. At most ``MAX_IDLE_CONNECTIONS`` idle connections are kept.

Retries. A connection is checked before it is reused: one the server closed while it sat
idle is thrown away without counting as a failure. A request that could not be sent at all
(connect refused, reset while writing) is retried on a new connection, up to ``retries``
times with a short backoff. A request that was sent but whose reply never came may have
been applied, so only the read-only methods (``ping``, ``auth``, ``get``, ``list``,
``stats``) are sent again; the others raise ``ConnectionFailed``. Give ``add`` an ``id`` to
make it safe to repeat yourself: a second add of the same id answers ``Exists``.
"""

from __future__ import annotations

import select
import socket
import time
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any

from delaywheel_client.calls import (
    Task,
    TaskList,
    Topics,
    list_query,
    reply_timeout_s,
    task_fields,
    topic_list,
)
from delaywheel_client.errors import (
    ConnectionFailed,
    ServerClosed,
    error_from_reply,
)
from delaywheel_client.pipeline import QueuedCalls
from delaywheel_client.protocol import (
    MAX_MSGID,
    Decoder,
    Encoder,
    Notification,
    ProtocolError,
    Response,
)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 3450

# Methods that change nothing on the server, so sending one again after its reply was lost
# is harmless. Everything else is sent at most once per call.
READ_ONLY_METHODS = frozenset({"ping", "auth", "get", "list", "stats"})

# Idle connections kept for reuse; a burst of more concurrent threads opens more, and the
# extra ones are closed when they come back.
MAX_IDLE_CONNECTIONS = 16

# Replies come from a server we chose to talk to, so they are bounded far more loosely than
# the server bounds requests: one list page of 1,000 tasks with 1 MiB bodies is ~1 GiB, and
# stats holds a map with one entry per topic.
MAX_REPLY_BYTES = 2**31 - 1
MAX_REPLY_CONTAINER_LEN = 2**24

# recv() size: under glibc's 128 KiB mmap threshold, so a small reply does not cost an
# mmap/munmap pair, and small enough for the codec (see protocol.py, "Where it is weak").
READ_CHUNK_BYTES = 65536

# A pipeline writes its requests in chunks of about this many bytes and reads each chunk's
# replies before writing the next. A server stops reading from a client that does not read
# its replies, and a client blocked writing a huge batch never reads: chunks keep both sides
# moving. 1,000 small adds still go out in one write.
PIPELINE_CHUNK_BYTES = 256 * 1024

RETRY_BASE_S = 0.05
RETRY_CAP_S = 1.0


def retry_delay_s(attempt: int) -> float:
    """Backoff before retry number ``attempt`` (0-based) of a request that was not sent."""
    return float(min(RETRY_BASE_S * 2**attempt, RETRY_CAP_S))


def parse_url(url: str) -> tuple[str, int, str | None]:
    """``delaywheel://[token@]host[:port]`` or ``host[:port]`` -> (host, port, token)."""
    text = url if "://" in url else f"delaywheel://{url}"
    parts = urllib.parse.urlsplit(text)
    if parts.scheme != "delaywheel":
        raise ValueError(f"not a delaywheel URL (delaywheel://[token@]host:port): {url!r}")
    try:
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"bad port in {url!r}: {exc}") from None
    host = parts.hostname or DEFAULT_HOST
    # delaywheel://TOKEN@host, or Redis-style delaywheel://:TOKEN@host.
    raw = parts.password if parts.password is not None else parts.username
    token = urllib.parse.unquote(raw) if raw else None
    return host, DEFAULT_PORT if port is None else port, token


# -- one connection ------------------------------------------------------------------------------


class _Dropped(Exception):
    """The connection failed; ``sent`` says whether the request may have reached the server."""

    def __init__(self, reason: str, sent: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.sent = sent


class _Connection:
    """One socket and its codec. Not thread-safe: one borrower at a time."""

    __slots__ = ("decoder", "encoder", "label", "msgid", "poller", "sock", "timeout_s")

    def __init__(self, sock: socket.socket, label: str, timeout_s: float) -> None:
        self.sock = sock
        self.label = label
        self.timeout_s = timeout_s
        sock.settimeout(timeout_s)
        self.decoder = Decoder(
            max_message_bytes=MAX_REPLY_BYTES, max_container_len=MAX_REPLY_CONTAINER_LEN
        )
        self.encoder = Encoder()
        self.msgid = 0
        self.poller: Any = None
        if hasattr(select, "poll"):
            self.poller = select.poll()
            self.poller.register(sock, select.POLLIN)

    def stale(self) -> bool:
        """True when, while idle, the server closed this connection or sent something."""
        if self.decoder.buffered_bytes:
            return True
        if self.poller is not None:
            return bool(self.poller.poll(0))
        return bool(select.select([self.sock], [], [], 0)[0])

    def next_msgid(self) -> int:
        msgid = self.msgid
        self.msgid = (msgid + 1) & MAX_MSGID
        return msgid

    def set_timeout(self, timeout_s: float) -> None:
        if timeout_s != self.timeout_s:
            self.sock.settimeout(timeout_s)
            self.timeout_s = timeout_s

    def exchange(self, method: str, params: Sequence[Any], timeout_s: float) -> Response:
        """Send one request, return its reply. Raises _Dropped, ServerClosed, TypeError."""
        msgid = self.msgid
        payload = self.encoder.request(msgid, method, params)  # TypeError: the caller's value
        self.msgid = (msgid + 1) & MAX_MSGID
        if timeout_s != self.timeout_s:
            self.set_timeout(timeout_s)
        try:
            self.sock.sendall(payload)
        except OSError as exc:
            raise self._dropped(f"sending {method} failed: {_describe(exc)}", sent=False) from exc
        return self._read_reply(msgid, method)

    def _read_reply(self, msgid: int, method: str) -> Response:
        sock, decoder = self.sock, self.decoder
        try:
            while True:
                data = sock.recv(READ_CHUNK_BYTES)
                if not data:
                    raise self._dropped(f"the server closed the connection during {method}")
                decoder.feed(data)
                for message in decoder:
                    if type(message) is Response:
                        if message.msgid == msgid:
                            return message
                    elif type(message) is Notification:
                        self._notified(message)
        except TimeoutError as exc:
            raise self._dropped(f"no reply to {method} within {self.timeout_s:g} s") from exc
        except OSError as exc:
            raise self._dropped(f"reading the reply to {method} failed: {_describe(exc)}") from exc
        except ProtocolError as exc:
            raise self._dropped(f"undecodable reply to {method}: {exc}") from exc

    def exchange_many(
        self, calls: Sequence[tuple[str, Sequence[Any]]], timeout_s: float
    ) -> list[Response]:
        """Send many requests in as few writes as the chunk size allows; replies in order."""
        encoder = self.encoder
        payloads = []
        for method, params in calls:
            payloads.append(encoder.request(self.next_msgid(), method, params))
        first = (self.msgid - len(calls)) & MAX_MSGID
        self.set_timeout(timeout_s)
        replies: list[Response | None] = [None] * len(calls)
        start = 0
        while start < len(payloads):
            end, size = start, 0
            while end < len(payloads) and (end == start or size < PIPELINE_CHUNK_BYTES):
                size += len(payloads[end])
                end += 1
            try:
                self.sock.sendall(b"".join(payloads[start:end]))
            except OSError as exc:
                raise self._dropped(
                    f"sending a pipeline failed: {_describe(exc)}", sent=start > 0
                ) from exc
            self._read_replies(first, start, end, replies)
            start = end
        return replies  # type: ignore[return-value]  # every slot was filled

    def _read_replies(
        self, first: int, start: int, end: int, replies: list[Response | None]
    ) -> None:
        sock, decoder = self.sock, self.decoder
        waiting = end - start
        try:
            while waiting:
                data = sock.recv(READ_CHUNK_BYTES)
                if not data:
                    raise self._dropped("the server closed the connection during a pipeline")
                decoder.feed(data)
                for message in decoder:
                    if type(message) is Response:
                        index = (message.msgid - first) & MAX_MSGID
                        if start <= index < end and replies[index] is None:
                            replies[index] = message
                            waiting -= 1
                    elif type(message) is Notification:
                        self._notified(message)
        except TimeoutError as exc:
            raise self._dropped(f"no reply to a pipeline within {self.timeout_s:g} s") from exc
        except OSError as exc:
            raise self._dropped(f"reading pipeline replies failed: {_describe(exc)}") from exc
        except ProtocolError as exc:
            raise self._dropped(f"undecodable reply in a pipeline: {exc}") from exc

    def _notified(self, message: Notification) -> None:
        """The server's parting ``[2, "error", [code, message]]``; other notifications are
        not defined for clients and are ignored."""
        if message.method != "error":
            return
        self.close()
        code, text = closed_by(message.params)
        raise ServerClosed(f"{self.label}: the server closed the connection: {text}", code)

    def _dropped(self, reason: str, sent: bool = True) -> _Dropped:
        self.close()
        return _Dropped(reason, sent)

    def close(self) -> None:
        self.sock.close()


def closed_by(params: Any) -> tuple[str, str]:
    """(code, message) from the params of the server's ``error`` notification."""
    if type(params) is list and len(params) >= 2:
        return str(params[0]), str(params[1])
    return "internal", f"malformed error notification: {params!r}"


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


# -- the client ------------------------------------------------------------------------------------


class Client:
    """A blocking delaywheel client, safe to share between threads.

    Example::

        with Client("127.0.0.1", 3450) as dw:  # or Client.from_url("delaywheel://tok@host:3450")
            dw.add("emails", {"to": "a@example.com"}, delay=30, id="welcome-42")
            # -> {"id": "welcome-42", "at": 1767225630.0, "cycle": 0, "slot": 1830}
            task = dw.reserve("emails", timeout=5)  # None after 5 s with nothing ready
            if task is not None:
                dw.ack(task["id"])

    Errors from the server raise the ``errors`` class of their code (``NotFound``,
    ``Conflict``, ...). A lost connection raises ``ConnectionFailed``; requests that were
    never sent are retried ``retries`` times first. A request that was sent but whose reply
    was lost is sent again only for read-only methods: ``add``, ``ack``, ``reserve`` and the
    other writes raise ``ConnectionFailed``, because they may have been applied. Give ``add``
    an ``id`` to make it idempotent: adding the same id again answers ``Exists``.

    ``timeout_s`` is how long to wait for a reply (``reserve`` waits its own ``timeout`` on
    top of it); ``connect_timeout_s`` bounds opening a connection.
    """

    def __init__(
        self,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        *,
        token: str | None = None,
        timeout_s: float = 10.0,
        connect_timeout_s: float = 5.0,
        retries: int = 3,
    ) -> None:
        self.host = host
        self.port = port
        self.token = token
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.retries = retries
        self._label = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
        # list.pop() and list.append() are atomic, so the pool needs no lock.
        self._idle: list[_Connection] = []
        self._closed = False

    @classmethod
    def from_url(cls, url: str, **kw: Any) -> Client:
        """``delaywheel://[token@]host:port`` or plain ``host:port``; ``kw`` as ``__init__``.

        A ``token`` in ``kw`` wins over one in the URL.
        """
        host, port, token = parse_url(url)
        kw.setdefault("token", token)
        return cls(host, port, **kw)

    def __repr__(self) -> str:
        return f"<Client {self._label}>"

    # -- connections -----------------------------------------------------------

    def _connect(self) -> _Connection:
        if self._closed:
            raise ConnectionFailed(f"{self._label}: the client is closed")
        try:
            sock = socket.create_connection((self.host, self.port), self.connect_timeout_s)
        except OSError as exc:
            raise _Dropped(f"cannot connect: {_describe(exc)}", sent=False) from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = _Connection(sock, self._label, self.timeout_s)
        if self.token is not None:
            try:
                reply = conn.exchange("auth", (self.token,), self.timeout_s)
            except _Dropped as exc:
                exc.sent = False  # only auth was sent; the caller's request was not
                raise
            if reply.error is not None:
                conn.close()
                raise error_from_reply(reply.error)
        return conn

    def _borrow(self) -> _Connection:
        idle = self._idle
        while True:
            try:
                conn = idle.pop()
            except IndexError:
                return self._connect()
            if not conn.stale():
                return conn
            conn.close()  # closed by the server while idle: not a failure, try the next

    def _give_back(self, conn: _Connection) -> None:
        if self._closed or len(self._idle) >= MAX_IDLE_CONNECTIONS or conn.decoder.buffered_bytes:
            conn.close()
        else:
            self._idle.append(conn)

    def _failed(self, exc: _Dropped, read_only: bool, attempt: int) -> bool:
        """After a drop: True to retry (having slept), else raises ConnectionFailed."""
        if (read_only or not exc.sent) and attempt < self.retries and not self._closed:
            time.sleep(retry_delay_s(attempt))
            return True
        maybe = " (it was sent and may have been applied)" if exc.sent and not read_only else ""
        raise ConnectionFailed(f"{self._label}: {exc.reason}{maybe}") from exc

    def _call(self, method: str, params: Sequence[Any], timeout_s: float) -> Any:
        attempt = 0
        while True:
            try:
                conn = self._borrow()
            except _Dropped as exc:
                self._failed(exc, True, attempt)
                attempt += 1
                continue
            try:
                reply = conn.exchange(method, params, timeout_s)
            except _Dropped as exc:
                self._failed(exc, method in READ_ONLY_METHODS, attempt)
                attempt += 1
                continue
            except TypeError:
                self._give_back(conn)  # raised while encoding: nothing was sent
                raise
            except BaseException:  # KeyboardInterrupt mid-reply: the stream is out of step
                conn.close()
                raise
            self._give_back(conn)
            if reply.error is None:
                return reply.result
            raise error_from_reply(reply.error)

    def _call_many(self, calls: Sequence[tuple[str, Sequence[Any]]], timeout_s: float) -> list[Any]:
        read_only = all(method in READ_ONLY_METHODS for method, _ in calls)
        attempt = 0
        while True:
            try:
                conn = self._borrow()
            except _Dropped as exc:
                self._failed(exc, True, attempt)
                attempt += 1
                continue
            try:
                replies = conn.exchange_many(calls, timeout_s)
            except _Dropped as exc:
                self._failed(exc, read_only, attempt)
                attempt += 1
                continue
            except TypeError:
                self._give_back(conn)  # raised while encoding: nothing was sent
                raise
            except BaseException:
                conn.close()
                raise
            self._give_back(conn)
            return replies

    def close(self) -> None:
        """Close the idle connections; ones in use are closed when their call returns."""
        self._closed = True
        while True:
            try:
                self._idle.pop().close()
            except IndexError:
                return

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- methods ---------------------------------------------------------------

    def call(self, method: str, *params: Any) -> Any:
        """Any method by name: ``call("get", "task-1")``. Returns the result or raises."""
        return self._call(method, params, reply_timeout_s(method, params, self.timeout_s))

    def ping(self) -> str:
        """``"pong"``."""
        result: str = self._call("ping", (), self.timeout_s)
        return result

    def add(
        self,
        topic: str,
        body: Any = None,
        *,
        delay: float | None = None,
        at: float | None = None,
        id: str | None = None,
        ttr: float | None = None,
        max_attempts: int | None = None,
        target: Mapping[str, Any] | None = None,
    ) -> Task:
        """Add a task; returns ``{"id", "at", "cycle", "slot"}``. Keys left None are not sent
        (the server's defaults apply: due now, ttr 60 s, 5 attempts, the ready queue)."""
        fields = task_fields(topic, body, delay, at, id, ttr, max_attempts, target)
        result: Task = self._call("add", (fields,), self.timeout_s)
        return result

    def add_many(self, tasks: Iterable[Mapping[str, Any]]) -> TaskList:
        """Add task maps all or nothing; returns ``add``'s result for each, in order."""
        result: TaskList = self._call("add_many", ([dict(t) for t in tasks],), self.timeout_s)
        return result

    def update(self, id: str, **changes: Any) -> Task:
        """Change ``delay``/``at``, ``body``, ``topic``, ``ttr``, ``target`` or
        ``max_attempts``; returns the updated task."""
        result: Task = self._call("update", (id, changes), self.timeout_s)
        return result

    def delete(self, id: str) -> bool:
        """True if the task existed."""
        return bool(self._call("delete", (id,), self.timeout_s))

    def get(self, id: str) -> Task | None:
        """The task, or None."""
        result: Task | None = self._call("get", (id,), self.timeout_s)
        return result

    def reserve(self, topics: Topics, timeout: float = 0) -> Task | None:
        """The oldest ready task of ``topics``, now reserved, or None after ``timeout`` s."""
        result: Task | None = self._call(
            "reserve", (topic_list(topics), timeout), timeout + self.timeout_s
        )
        return result

    def ack(self, id: str) -> bool:
        """The reserved task is done and removed."""
        return bool(self._call("ack", (id,), self.timeout_s))

    def release(self, id: str, delay: float = 0) -> bool:
        """Put a reserved task back, due after ``delay`` seconds."""
        return bool(self._call("release", (id, delay), self.timeout_s))

    def touch(self, id: str) -> float:
        """Extend a reservation by its ttr; returns the new deadline (Unix s)."""
        result: float = self._call("touch", (id,), self.timeout_s)
        return result

    def kick(self, topic: str, count: int) -> int:
        """Make up to ``count`` dead tasks of ``topic`` ready again; returns how many."""
        result: int = self._call("kick", (topic, count), self.timeout_s)
        return result

    def stats(self) -> dict[str, Any]:
        """Counts by state and topic, wheel settings, store URL, uptime, version, ..."""
        result: dict[str, Any] = self._call("stats", (), self.timeout_s)
        return result

    def pipeline(self) -> Pipeline:
        """A batch: queue calls, then send them in one write and read every reply.

        Example::

            with dw.pipeline() as pipe:  # executes on a clean exit
                for n in range(1000):
                    pipe.add("thumbnails", {"image": n})
            first_id = pipe.results[0]["id"]
        """
        return Pipeline(self)

    def iter_tasks(
        self, *, topic: str | None = None, state: str | None = None, page_size: int = 1000
    ) -> Iterator[Task]:
        """Every matching task, following ``list``'s ``next`` cursor page by page."""
        cursor = None
        while True:
            page = self.list(topic=topic, state=state, limit=page_size, cursor=cursor)
            yield from page["tasks"]
            cursor = page["next"]
            if cursor is None:
                return

    # Defined last: inside the class body, the name ``list`` is this method from here on.
    def list(
        self,
        *,
        topic: str | None = None,
        state: str | None = None,
        limit: int | None = None,
        cursor: Any = None,
    ) -> dict[str, Any]:
        """One page: ``{"tasks": [...], "next": cursor or None}`` (limit <= 1000)."""
        query = list_query(topic, state, limit, cursor)
        result: dict[str, Any] = self._call("list", (query,), self.timeout_s)
        return result


class Pipeline(QueuedCalls):
    """Queued calls sent together by ``execute()``; see ``Client.pipeline()``.

    Each method has ``Client``'s name and params, queues the call and returns None.
    ``execute()`` returns the results in call order. With ``raise_on_error`` (the default)
    the first error is raised after every reply has been read; otherwise errors come back
    as exception instances in the list. Used as a context manager it executes on a clean
    exit and keeps the results in ``results``.
    """

    def __init__(self, client: Client) -> None:
        super().__init__(client.timeout_s)
        self._client = client

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        calls, timeout_s = self._take()
        if not calls:
            self.results = []
            return self.results
        return self._collect(self._client._call_many(calls, timeout_s), raise_on_error)

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.execute()
        else:
            self._take()


__all__ = ["Client", "Pipeline", "parse_url"]
