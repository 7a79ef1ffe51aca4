"""The asyncio client's connection: an ``asyncio.Protocol`` with many requests in flight.

How it works. A call encodes its request with ``send()``, which queues it for one write at
the end of the loop turn and returns a future kept under its msgid; ``data_received``
decodes the replies and resolves the futures by msgid, so replies may come back in any
order (a blocked ``reserve`` is answered after later requests). There is no reader task
and no task per call. A pipeline (``send_many``) has one future for all its calls: its
``Replies`` stands in ``pending`` for each call's future and puts each reply in its place.
When the connection drops, every pending future fails with ``Dropped``, carrying the
server's ``(code, message)`` when it said why it closed.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Sequence
from typing import Any, cast

from delaywheel_client._tls import CLOSED_UNANSWERED_HINT, PLAIN_CLOSED_HINT, tls_reason
from delaywheel_client.connection import (
    MAX_REPLY_BYTES,
    MAX_REPLY_CONTAINER_LEN,
    Dropped,
    closed_by,
)
from delaywheel_client.protocol import (
    MAX_MSGID,
    Decoder,
    Encoder,
    Notification,
    ProtocolError,
    Response,
)


class Replies:
    """A pipeline's calls in ``pending``: it stands in for each call's future (``done``,
    ``set_result``, ``set_exception``) and resolves one future, ``future``, with every
    reply in call order once the last is in. A future per call, gathered, cost the
    client more than the rest of a pipelined add (docs/performance.md, "Measurements
    behind the code")."""

    __slots__ = ("first", "future", "left", "replies")

    def __init__(self, future: asyncio.Future[list[Response]], first: int, count: int) -> None:
        self.future = future
        self.first = first  # the first call's msgid; the others follow it
        self.left = count  # replies still to come
        self.replies: list[Response] = [None] * count  # type: ignore[list-item]  # all filled

    def done(self) -> bool:
        return self.future.done()

    def set_result(self, reply: Response) -> None:
        """Take one reply; the future is resolved by the last (unless it was cancelled)."""
        self.replies[(reply.msgid - self.first) & MAX_MSGID] = reply
        self.left -= 1
        if not self.left and not self.future.done():
            self.future.set_result(self.replies)

    def set_exception(self, exc: BaseException) -> None:
        self.future.set_exception(exc)


class ClientProtocol(asyncio.Protocol):
    """One connection of an ``AsyncClient``: requests out, replies to their futures."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.decoder = Decoder(
            max_message_bytes=MAX_REPLY_BYTES, max_container_len=MAX_REPLY_CONTAINER_LEN
        )
        self.encoder = Encoder()
        self.transport: asyncio.Transport | None = None
        # A call's future by msgid; a pipeline's calls share one Replies.
        self.pending: dict[int, asyncio.Future[Response] | Replies] = {}
        self.msgid = 0
        self.lost = False
        self.tls = False
        self.heard = False  # anything received yet
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
        self.tls = transport.get_extra_info("sslcontext") is not None
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        pending = self.pending
        self.heard = True
        try:
            self.decoder.feed(data)
            for message in self.decoder:
                if type(message) is Response:
                    future = pending.pop(message.msgid, None)
                    # A pipeline's Replies checks its future once, at its last reply.
                    if type(future) is Replies or (future is not None and not future.done()):
                        future.set_result(message)
                elif type(message) is Notification and message.method == "error":
                    self.closed_by = closed_by(message.params)
        except ProtocolError as exc:
            self.why = f"undecodable reply: {exc}"
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        # An SSLError is an alert (the server wanted our certificate, say): trying
        # again would end the same way.
        alert = exc if isinstance(exc, ssl.SSLError) else None
        if self.closed_by is not None:
            why = f"the server closed the connection: {self.closed_by[1]}"
        elif self.why is not None:
            why = self.why
        elif alert is not None:
            why = f"the server ended TLS: {tls_reason(alert)}"
        elif not self.heard and (exc is None or isinstance(exc, ConnectionResetError)):
            # A reset is a close too: the server closing with our request unread
            # makes its kernel answer RST (TLS 1.3 finishes the client's handshake
            # before the server has checked our certificate).
            hint = CLOSED_UNANSWERED_HINT if self.tls else PLAIN_CLOSED_HINT
            how = "closed" if exc is None else "reset"
            why = f"the server {how} the connection" + hint
        else:
            why = "connection lost" + (f": {type(exc).__name__}: {exc}" if exc else "")
        pending, self.pending = self.pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(Dropped(why, True, self.closed_by, alert is not None))
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

    def send_many(self, calls: Sequence[tuple[str, Sequence[Any]]]) -> Replies:
        """``send`` for each call, with one ``Replies`` for them all (``calls`` not empty).
        Every request is encoded before any is queued: a value that cannot be packed
        (TypeError) sends none of them."""
        first = self.msgid
        request = self.encoder.request
        payloads = [
            request((first + i) & MAX_MSGID, method, params)
            for i, (method, params) in enumerate(calls)
        ]
        count = len(payloads)
        replies = Replies(self.loop.create_future(), first, count)
        self.msgid = (first + count) & MAX_MSGID
        self.pending.update(dict.fromkeys(self.msgids(first, count), replies))
        outbox = self.outbox
        outbox += payloads
        if len(outbox) == count:
            self.loop.call_soon(self.write_outbox)
        return replies

    @staticmethod
    def msgids(first: int, count: int) -> list[int]:
        """The msgids of ``count`` calls sent together from ``first`` on."""
        end = first + count
        if end <= MAX_MSGID + 1:
            return list(range(first, end))
        return [msgid & MAX_MSGID for msgid in range(first, end)]

    def write_outbox(self) -> None:
        outbox, self.outbox = self.outbox, []
        if self.transport is not None and not self.lost:
            self.transport.write(b"".join(outbox))

    def time_out(self, msgid: int, method: str, timeout_s: float) -> None:
        future = self.pending.pop(msgid, None)
        if future is not None and not future.done():
            future.set_exception(Dropped(f"no reply to {method} within {timeout_s:g} s", True))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


__all__ = ["ClientProtocol"]
