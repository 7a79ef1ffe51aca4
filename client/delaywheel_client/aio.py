"""The asyncio client: many requests in flight on one connection.

How it works. One ``asyncio.Protocol`` per connection: a call encodes its request, writes
it and waits on a future kept under its msgid; ``data_received`` decodes the replies and
resolves the futures by msgid, so replies may come back in any order (a blocked
``reserve`` is answered after later requests). There is no reader task and no task per
call: a call costs one future and one timer.

Failures. When the connection drops, every pending call fails with ``ConnectionFailed``
(``ServerClosed`` when the server said why), and the next call connects again. The retry
rules are the blocking client's: requests that were never written are retried up to
``retries`` times, and one that was written is sent again only for read-only methods. A
call that gets no reply within ``timeout_s`` raises ``ConnectionFailed`` and leaves the
connection open; its late reply is dropped (a late ``reserve`` reply leaves that task
reserved until its ttr runs out).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, cast

from delaywheel_client.calls import (
    Task,
    TaskList,
    Topics,
    list_query,
    reply_timeout_s,
    task_fields,
    topic_list,
)
from delaywheel_client.client import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    MAX_REPLY_BYTES,
    MAX_REPLY_CONTAINER_LEN,
    READ_ONLY_METHODS,
    closed_by,
    parse_url,
    retry_delay_s,
)
from delaywheel_client.errors import ConnectionFailed, ServerClosed, error_from_reply
from delaywheel_client.pipeline import QueuedCalls
from delaywheel_client.protocol import (
    MAX_MSGID,
    Decoder,
    Encoder,
    Notification,
    ProtocolError,
    Response,
)


class _Dropped(Exception):
    """The connection failed; ``sent`` says whether the request may have reached the server.
    ``closed_by`` is the server's ``(code, message)`` when it said why it closed."""

    def __init__(self, reason: str, sent: bool, closed_by: tuple[str, str] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.sent = sent
        self.closed_by = closed_by


class _Protocol(asyncio.Protocol):
    def __init__(self, label: str) -> None:
        self.label = label
        self.loop = asyncio.get_running_loop()
        self.decoder = Decoder(
            max_message_bytes=MAX_REPLY_BYTES, max_container_len=MAX_REPLY_CONTAINER_LEN
        )
        self.encoder = Encoder()
        self.transport: asyncio.Transport | None = None
        self.pending: dict[int, asyncio.Future[Response]] = {}
        self.msgid = 0
        self.lost = False
        self.closed = self.loop.create_future()  # set by connection_lost
        self.why: str | None = None  # what went wrong, when we know better than the OS
        self.closed_by: tuple[str, str] | None = None
        self.paused = False
        self.drained: asyncio.Future[None] | None = None
        # Requests made in this loop turn, written together at its end: one
        # syscall for a whole burst of concurrent calls instead of one each.
        self.outbox: list[bytes] = []

    # -- transport events ------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport, so no isinstance.
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        pending = self.pending
        try:
            self.decoder.feed(data)
            for message in self.decoder:
                if type(message) is Response:
                    future = pending.pop(message.msgid, None)
                    if future is not None and not future.done():
                        future.set_result(message)
                elif type(message) is Notification and message.method == "error":
                    self.closed_by = closed_by(message.params)
        except ProtocolError as exc:
            self.why = f"undecodable reply: {exc}"
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.closed_by is not None:
            reason = f"the server closed the connection: {self.closed_by[1]}"
        elif self.why is not None:
            reason = self.why
        else:
            reason = "connection lost" + (f": {type(exc).__name__}: {exc}" if exc else "")
        pending, self.pending = self.pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(_Dropped(reason, True, self.closed_by))
        if not self.closed.done():
            self.closed.set_result(None)
        self._wake_writers()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self._wake_writers()

    def _wake_writers(self) -> None:
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)
        self.drained = None

    # -- requests ----------------------------------------------------------------

    async def wait_drained(self) -> None:
        """Wait while the transport's buffer is over its high-water mark."""
        while self.paused and not self.lost:
            if self.drained is None:
                self.drained = self.loop.create_future()
            await self.drained

    def send(self, method: str, params: Sequence[Any]) -> tuple[int, asyncio.Future[Response]]:
        msgid = self.msgid
        payload = self.encoder.request(msgid, method, params)  # TypeError: the caller's value
        self.msgid = (msgid + 1) & MAX_MSGID
        future: asyncio.Future[Response] = self.loop.create_future()
        self.pending[msgid] = future
        self.outbox.append(payload)
        if len(self.outbox) == 1:
            self.loop.call_soon(self.write_outbox)
        return msgid, future

    def write_outbox(self) -> None:
        outbox, self.outbox = self.outbox, []
        if self.transport is not None and not self.lost:
            self.transport.write(b"".join(outbox))

    def time_out(self, msgid: int, method: str, timeout_s: float) -> None:
        future = self.pending.pop(msgid, None)
        if future is not None and not future.done():
            future.set_exception(_Dropped(f"no reply to {method} within {timeout_s:g} s", True))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class AsyncClient:
    """An asyncio delaywheel client; every ``Client`` method, as a coroutine.

    Example::

        async with await AsyncClient.connect("127.0.0.1", 3450) as dw:
            await dw.add("emails", {"to": "a@example.com"}, delay=30)
            tasks = await asyncio.gather(*(dw.get(f"order-{n}") for n in range(500)))
            task = await dw.reserve(["emails", "sms"], timeout=5)

    One connection carries every call, concurrent ones included. Errors and retries are
    as in ``Client``: server errors raise their ``errors`` class, a lost connection raises
    ``ConnectionFailed`` for the calls in flight and the next call reconnects.
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
        self._protocol: _Protocol | None = None
        self._connecting: asyncio.Lock | None = None
        self._closed = False

    @classmethod
    async def connect(
        cls,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        *,
        token: str | None = None,
        timeout_s: float = 10.0,
        connect_timeout_s: float = 5.0,
        retries: int = 3,
    ) -> AsyncClient:
        """A client with its connection open (and authenticated when ``token`` is given)."""
        client = cls(
            host,
            port,
            token=token,
            timeout_s=timeout_s,
            connect_timeout_s=connect_timeout_s,
            retries=retries,
        )
        await client._ready()
        return client

    @classmethod
    def from_url(cls, url: str, **kw: Any) -> AsyncClient:
        """As ``Client.from_url``; the connection opens on the first call."""
        host, port, token = parse_url(url)
        kw.setdefault("token", token)
        return cls(host, port, **kw)

    def __repr__(self) -> str:
        return f"<AsyncClient {self._label}>"

    # -- the connection ----------------------------------------------------------

    async def _open(self) -> _Protocol:
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            protocol = self._protocol
            if protocol is not None and not protocol.lost:
                return protocol  # another task connected while we waited
            if self._closed:
                raise ConnectionFailed(f"{self._label}: the client is closed")
            loop = asyncio.get_running_loop()
            label = self._label
            try:
                _, opened = await asyncio.wait_for(
                    loop.create_connection(lambda: _Protocol(label), self.host, self.port),
                    self.connect_timeout_s,
                )
            except (OSError, asyncio.TimeoutError) as exc:
                cause = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                raise _Dropped(f"cannot connect: {cause}", False) from exc
            if self.token is not None:
                await self._auth(opened, self.token)
            self._protocol = opened
            return opened

    async def _auth(self, protocol: _Protocol, token: str) -> None:
        _, future = protocol.send("auth", (token,))
        try:
            reply = await asyncio.wait_for(future, self.timeout_s)
        except _Dropped as exc:
            exc.sent = False  # only auth was sent; the caller's request was not
            raise
        except asyncio.TimeoutError as exc:
            protocol.close()
            raise _Dropped(f"no reply to auth within {self.timeout_s:g} s", False) from exc
        if reply.error is not None:
            protocol.close()
            raise error_from_reply(reply.error)

    async def _failed(self, exc: _Dropped, read_only: bool, attempt: int) -> None:
        """After a drop: returns (having slept) to retry, else raises ConnectionFailed."""
        if exc.closed_by is not None:
            raise ServerClosed(f"{self._label}: {exc.reason}", exc.closed_by[0]) from exc
        if (read_only or not exc.sent) and attempt < self.retries and not self._closed:
            await asyncio.sleep(retry_delay_s(attempt))
            return
        maybe = " (it was sent and may have been applied)" if exc.sent and not read_only else ""
        raise ConnectionFailed(f"{self._label}: {exc.reason}{maybe}") from exc

    async def _ready(self) -> _Protocol:
        attempt = 0
        while True:
            protocol = self._protocol
            if protocol is not None and not protocol.lost:
                return protocol
            try:
                return await self._open()
            except _Dropped as exc:
                await self._failed(exc, True, attempt)
                attempt += 1

    async def _call(self, method: str, params: Sequence[Any], timeout_s: float) -> Any:
        attempt = 0
        while True:
            protocol = self._protocol
            if protocol is None or protocol.lost:
                try:
                    protocol = await self._open()
                except _Dropped as exc:
                    await self._failed(exc, True, attempt)
                    attempt += 1
                    continue
            if protocol.paused:
                await protocol.wait_drained()
                if protocol.lost:
                    continue  # nothing was written; the next turn reconnects
            msgid, future = protocol.send(method, params)
            timer = protocol.loop.call_later(timeout_s, protocol.time_out, msgid, method, timeout_s)
            try:
                reply = await future
            except _Dropped as exc:
                await self._failed(exc, method in READ_ONLY_METHODS, attempt)
                attempt += 1
                continue
            finally:
                timer.cancel()
                protocol.pending.pop(msgid, None)  # when this call was cancelled
            if reply.error is None:
                return reply.result
            raise error_from_reply(reply.error)

    def pipeline(self) -> AsyncPipeline:
        """Queue calls and send them together: the fastest way to make many.

        ``await pipeline.execute()`` (or leaving ``async with client.pipeline()
        as pipe:``) writes every queued request at once and waits for all the
        replies, with no task or coroutine per call::

            async with client.pipeline() as pipe:
                for order in orders:
                    pipe.add("orders", order, delay=1800)
            ids = [added["id"] for added in pipe.results]

        A pipeline is not retried after a lost connection (some of it may have
        been applied); with client-chosen ids a resend is safe (``exists``).
        """
        return AsyncPipeline(self)

    async def _call_many(
        self, calls: Sequence[tuple[str, Sequence[Any]]], timeout_s: float
    ) -> list[Response]:
        protocol = await self._ready()
        if protocol.paused:
            await protocol.wait_drained()
        sent = [protocol.send(method, params) for method, params in calls]
        # Out now, as its own write: pipelines in flight overlap with the
        # server's work instead of being merged into one lock-step burst.
        protocol.write_outbox()
        futures = [future for _, future in sent]
        try:
            done = asyncio.gather(*futures)
            return list(await asyncio.wait_for(done, timeout_s))
        except asyncio.TimeoutError:
            raise ConnectionFailed(
                f"{self._label}: no reply to a pipeline of {len(calls)} within {timeout_s:g} s "
                "(it was sent and may have been applied)"
            ) from None
        except _Dropped as exc:
            await self._failed(exc, False, self.retries)  # raises: never retried blindly
            raise AssertionError("unreachable") from exc
        finally:
            for msgid, _ in sent:
                protocol.pending.pop(msgid, None)

    async def close(self) -> None:
        """Close the connection; calls still in flight fail with ``ConnectionFailed``."""
        self._closed = True
        protocol, self._protocol = self._protocol, None
        if protocol is not None and not protocol.lost:
            protocol.close()
            await protocol.closed

    async def __aenter__(self) -> AsyncClient:
        await self._ready()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- methods (see Client for each one's contract) ------------------------------

    async def call(self, method: str, *params: Any) -> Any:
        return await self._call(method, params, reply_timeout_s(method, params, self.timeout_s))

    async def ping(self) -> str:
        result: str = await self._call("ping", (), self.timeout_s)
        return result

    async def add(
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
        fields = task_fields(topic, body, delay, at, id, ttr, max_attempts, target)
        result: Task = await self._call("add", (fields,), self.timeout_s)
        return result

    async def add_many(self, tasks: Iterable[Mapping[str, Any]]) -> TaskList:
        result: TaskList = await self._call("add_many", ([dict(t) for t in tasks],), self.timeout_s)
        return result

    async def update(self, id: str, **changes: Any) -> Task:
        result: Task = await self._call("update", (id, changes), self.timeout_s)
        return result

    async def delete(self, id: str) -> bool:
        return bool(await self._call("delete", (id,), self.timeout_s))

    async def get(self, id: str) -> Task | None:
        result: Task | None = await self._call("get", (id,), self.timeout_s)
        return result

    async def reserve(self, topics: Topics, timeout: float = 0) -> Task | None:
        result: Task | None = await self._call(
            "reserve", (topic_list(topics), timeout), timeout + self.timeout_s
        )
        return result

    async def ack(self, id: str) -> bool:
        return bool(await self._call("ack", (id,), self.timeout_s))

    async def release(self, id: str, delay: float = 0) -> bool:
        return bool(await self._call("release", (id, delay), self.timeout_s))

    async def touch(self, id: str) -> float:
        result: float = await self._call("touch", (id,), self.timeout_s)
        return result

    async def kick(self, topic: str, count: int) -> int:
        result: int = await self._call("kick", (topic, count), self.timeout_s)
        return result

    async def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("stats", (), self.timeout_s)
        return result

    async def iter_tasks(
        self, *, topic: str | None = None, state: str | None = None, page_size: int = 1000
    ) -> AsyncIterator[Task]:
        cursor = None
        while True:
            page = await self.list(topic=topic, state=state, limit=page_size, cursor=cursor)
            for task in page["tasks"]:
                yield task
            cursor = page["next"]
            if cursor is None:
                return

    async def list(
        self,
        *,
        topic: str | None = None,
        state: str | None = None,
        limit: int | None = None,
        cursor: Any = None,
    ) -> dict[str, Any]:
        query = list_query(topic, state, limit, cursor)
        result: dict[str, Any] = await self._call("list", (query,), self.timeout_s)
        return result


__all__ = ["AsyncClient"]


class AsyncPipeline(QueuedCalls):
    """Queued calls for ``AsyncClient``; see ``AsyncClient.pipeline()``.

    The methods have ``AsyncClient``'s names and params; each queues a call.
    ``await execute()`` returns the results in call order, raising the first
    error after every reply is in (or, with ``raise_on_error=False``, putting
    the exceptions in the list).
    """

    def __init__(self, client: AsyncClient) -> None:
        super().__init__(client.timeout_s)
        self._client = client

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        calls, timeout_s = self._take()
        if not calls:
            self.results = []
            return self.results
        return self._collect(await self._client._call_many(calls, timeout_s), raise_on_error)

    async def __aenter__(self) -> AsyncPipeline:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        if exc_type is None:
            await self.execute()
        else:
            self._take()
