"""The asyncio client: many requests in flight on one connection.

How it works. One ``ClientProtocol`` (see _aio_protocol.py) carries every call: a call
writes its request and waits on a future that the protocol resolves when the reply with
its msgid arrives. A call costs one future and one timer.

Failures. When the connection drops, every pending call fails with ``ConnectionFailed``
(``ServerClosed`` when the server said why), and the next call connects again. The retry
rules are the blocking client's (``ClientBase`` in connection.py): requests that were never
written are retried up to ``retries`` times, and one that was written is sent again only for
read-only methods. A call that gets no reply within ``timeout_s`` raises ``ConnectionFailed``
and leaves the connection open; its late reply is dropped (a late ``reserve`` reply leaves
that task reserved until its ttr runs out).

The methods are commands.py's, as coroutines: this class says only how a call is sent
(``_send``).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from delaywheel_client._aio_protocol import ClientProtocol
from delaywheel_client._tls import PathLike, handshake_failure
from delaywheel_client.commands import Awaiting, Shape
from delaywheel_client.connection import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    ClientBase,
    Dropped,
    describe,
)
from delaywheel_client.errors import ConnectionFailed, error_from_reply
from delaywheel_client.methods import READ_ONLY_METHODS
from delaywheel_client.pipeline import QueuedCalls
from delaywheel_client.protocol import Response
from delaywheel_client.serve import serve


@serve
class AsyncClient(ClientBase, Awaiting):
    """An asyncio delaywheel client; every ``Client`` method, as a coroutine.

    Example::

        async with await AsyncClient.connect("127.0.0.1", 3450) as dw:
            await dw.add("emails", {"to": "a@example.com"}, delay=30)
            tasks = await asyncio.gather(*(dw.get(f"order-{n}") for n in range(500)))
            task = await dw.reserve(["emails", "sms"], timeout=5)

    One connection carries every call, concurrent ones included. Errors and retries are
    as in ``Client``: server errors raise their ``errors`` class, a lost connection raises
    ``ConnectionFailed`` for the calls in flight and the next call reconnects.

    TLS takes the parameters of ``Client`` (see ``ClientBase``): ``tls``, ``tls_ca``,
    ``tls_cert``, ``tls_key``, ``server_hostname``; ``connect_timeout_s`` bounds the
    handshake too.
    """

    def __post_init__(self) -> None:
        super().__post_init__()
        self._protocol: ClientProtocol | None = None
        self._connecting: asyncio.Lock | None = None

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
        tls: bool | ssl.SSLContext = False,
        tls_ca: PathLike | None = None,
        tls_cert: PathLike | None = None,
        tls_key: PathLike | None = None,
        server_hostname: str | None = None,
    ) -> AsyncClient:
        """A client with its connection open (and authenticated when ``token`` is given)."""
        client = cls(
            host,
            port,
            token=token,
            timeout_s=timeout_s,
            connect_timeout_s=connect_timeout_s,
            retries=retries,
            tls=tls,
            tls_ca=tls_ca,
            tls_cert=tls_cert,
            tls_key=tls_key,
            server_hostname=server_hostname,
        )
        await client._ready()
        return client

    def __repr__(self) -> str:
        return f"<AsyncClient {self._label}>"

    # -- the connection ----------------------------------------------------------

    async def _open(self) -> ClientProtocol:
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            protocol = self._protocol
            if protocol is not None and not protocol.lost:
                return protocol  # another task connected while we waited
            if self._closed:
                raise ConnectionFailed(f"{self._label}: the client is closed")
            loop = asyncio.get_running_loop()
            tls = self._ssl
            connecting = loop.create_connection(
                ClientProtocol,
                self.host,
                self.port,
                ssl=tls,
                server_hostname=None if tls is None else self._server_hostname,
                ssl_handshake_timeout=None if tls is None else self.connect_timeout_s,
            )
            try:
                _, opened = await asyncio.wait_for(connecting, self.connect_timeout_s)
            except ssl.SSLError as exc:
                raise Dropped(handshake_failure(exc), False, permanent=True) from exc
            except (OSError, asyncio.TimeoutError) as exc:
                raise Dropped(f"cannot connect: {describe(exc)}", False) from exc
            if self.token is not None:
                await self._auth(opened, self.token)
            self._protocol = opened
            return opened

    async def _auth(self, protocol: ClientProtocol, token: str) -> None:
        _, future = protocol.send("auth", (token,))
        try:
            reply = await asyncio.wait_for(future, self.timeout_s)
        except Dropped as exc:
            exc.sent = False  # only auth was sent; the caller's request was not
            raise
        except asyncio.TimeoutError as exc:
            protocol.close()
            raise Dropped(f"no reply to auth within {self.timeout_s:g} s", False) from exc
        if reply.error is not None:
            protocol.close()
            raise error_from_reply(reply.error)

    async def _ready(self) -> ClientProtocol:
        attempt = 0
        while True:
            protocol = self._protocol
            if protocol is not None and not protocol.lost:
                return protocol
            try:
                return await self._open()
            except Dropped as exc:
                await asyncio.sleep(self._backoff_s(exc, True, attempt))
                attempt += 1

    async def _send(
        self, method: str, params: Sequence[Any], wait_s: float = 0.0, shape: Shape = None
    ) -> Any:
        timeout_s = wait_s + self.timeout_s
        attempt = 0
        while True:
            protocol = self._protocol
            if protocol is None or protocol.lost:
                try:
                    protocol = await self._open()
                except Dropped as exc:
                    await asyncio.sleep(self._backoff_s(exc, True, attempt))
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
            except Dropped as exc:
                await asyncio.sleep(self._backoff_s(exc, method in READ_ONLY_METHODS, attempt))
                attempt += 1
                continue
            finally:
                timer.cancel()
                protocol.pending.pop(msgid, None)  # when this call was cancelled
            if reply.error is None:
                return reply.result if shape is None else shape(reply.result)
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
        if not calls:
            return []
        protocol = await self._ready()
        while protocol.paused:
            await protocol.wait_drained()
            if protocol.lost:  # lost while we waited: nothing was written, so reconnect
                protocol = await self._ready()
        replies = protocol.send_many(calls)
        # Out now, as its own write: pipelines in flight overlap with the
        # server's work instead of being merged into one lock-step burst.
        protocol.write_outbox()
        try:
            return await asyncio.wait_for(replies.future, timeout_s)
        except asyncio.TimeoutError:
            raise ConnectionFailed(
                f"{self._label}: no reply to a pipeline of {len(calls)} within {timeout_s:g} s "
                "(it was sent and may have been applied)"
            ) from None
        except Dropped as exc:
            raise self._failure(exc, False) from exc  # never retried blindly
        finally:
            if replies.left:  # each reply's arrival took its msgid out of pending
                pending = protocol.pending
                for msgid in protocol.msgids(replies.first, len(calls)):
                    pending.pop(msgid, None)

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


__all__ = ["AsyncClient", "AsyncPipeline"]
