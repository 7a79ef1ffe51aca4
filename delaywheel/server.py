"""The TCP server: connections, auth, limits, reply ordering, and the tick driver.

It speaks the protocol and nothing else: decode requests, check auth, call the
engine, encode replies. Each connection is an ``asyncio.Protocol`` (streams
cost 3x the round trips, see DESIGN.md) that handles everything one read
delivered, then writes all the replies that are ready in one ``write``.

Replies leave in request order. A reply to a mutating request waits in the
connection's line until the store write that holds its change returns (group
commit, see journal.py); the replies behind it wait too. Only a ``reserve``
that had to block is answered out of line, when it gets a task or times out.

Backpressure: when the transport's write buffer is full (a client that sends
but never reads), or too many replies are waiting on the store, the server
stops reading from that connection until it drains. Memory per connection is
therefore bounded by one read, one decoder buffer and that many replies.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import socket
import time
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any, cast

from delaywheel_client.protocol import Decoder, Encoder, ProtocolError, Request

from delaywheel import validate
from delaywheel.config import Settings
from delaywheel.engine import Engine
from delaywheel.errors import RequestError
from delaywheel.journal import Batch
from delaywheel.queues import Waiter
from delaywheel.store.base import StoreError

log = logging.getLogger(__name__)

# Stop reading from a connection with this many replies waiting for the store:
# enough for a deep pipeline, small enough to bound the memory it can pin.
MAX_QUEUED_REPLIES = 10_000
# Requests handled per connection per loop turn before the rest wait a turn:
# small enough that replies flow while a big pipeline is still being read,
# large enough that the per-turn overhead is noise.
MAX_REQUESTS_PER_TURN = 256
# The driver wakes at least this often even with nothing due, so a forward
# jump of the wall clock is noticed without waiting out a long sleep.
MAX_DRIVER_SLEEP_S = 1.0
# A reserve may block for at most a day; longer waits are a client bug.
MAX_RESERVE_TIMEOUT_S = 86_400.0

# method -> (param names, how many trailing ones are optional, mutating)
METHODS: dict[str, tuple[tuple[str, ...], int, bool]] = {
    "add": (("task",), 0, True),
    "add_many": (("tasks",), 0, True),
    "update": (("id", "changes"), 0, True),
    "delete": (("id",), 0, True),
    "get": (("id",), 0, False),
    "list": (("query",), 1, False),
    "ack": (("id",), 0, True),
    "release": (("id", "delay"), 1, True),
    "touch": (("id",), 0, True),
    "kick": (("topic", "count"), 0, True),
}
OPEN_METHODS = frozenset({"ping", "auth"})  # allowed before auth


Route = Callable[["Connection", list[Any], float], Any]


def _positional(
    method: str, handler: Callable[..., Any], names: tuple[str, ...], optional: int
) -> Route:
    """A route calling ``handler(*params, now_s)``, with the arity checked."""
    most = len(names)

    def run(conn: Connection, params: list[Any], now_s: float) -> Any:
        if len(params) == most:  # the common case, without building a new list
            return handler(*params, now_s)
        return handler(*validate.params(method, params, *names, optional=optional), now_s)

    return run


def _ping(conn: Connection, params: list[Any], now_s: float) -> str:
    validate.params("ping", params)
    return "pong"


class Server:
    def __init__(self, settings: Settings, engine: Engine) -> None:
        self.settings = settings
        self.engine = engine
        self.connections: set[Connection] = set()
        self._server: asyncio.Server | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._armed_s: float | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        handlers: dict[str, Callable[..., Any]] = {
            "add": engine.add,
            "add_many": engine.add_many,
            "update": engine.update,
            "delete": engine.delete,
            "get": engine.get,
            "list": engine.list_tasks,
            "ack": engine.ack,
            "release": engine.release,
            "touch": engine.touch,
            "kick": engine.kick,
        }
        # method -> (run(conn, params, now_s), mutating): one lookup per request.
        self.routes: dict[str, tuple[Route, bool]] = {
            method: (_positional(method, handlers[method], names, optional), mutating)
            for method, (names, optional, mutating) in METHODS.items()
        }
        self.routes["ping"] = (_ping, False)
        self.routes["auth"] = (self._auth, False)
        self.routes["stats"] = (self._stats, False)

    async def start(self) -> tuple[str, int]:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: Connection(self), self.settings.host, self.settings.port, reuse_address=True
        )
        self._on_tick()
        self._sweep()
        host, port = self._server.sockets[0].getsockname()[:2]
        return host, port

    async def stop(self) -> None:
        """Stop accepting, close connections, and wait for the journal to drain."""
        if self._server is not None:
            self._server.close()
        for timer in (self._timer, self._sweeper):
            if timer is not None:
                timer.cancel()
        for conn in list(self.connections):
            conn.close()
        await self.engine.journal.drain()

    # -- the tick driver -------------------------------------------------------

    def rearm(self) -> None:
        """Sleep until the wheel's next non-empty tick (called after every change)."""
        next_s = self.engine.next_fire_s()
        if next_s is None:
            next_s = time.time() + MAX_DRIVER_SLEEP_S
        if self._armed_s is not None and self._armed_s <= next_s:
            return
        if self._timer is not None:
            self._timer.cancel()
        delay_s = min(max(next_s - time.time(), 0.0), MAX_DRIVER_SLEEP_S)
        self._armed_s = time.time() + delay_s
        self._timer = asyncio.get_running_loop().call_later(delay_s, self._on_tick)

    def _on_tick(self) -> None:
        self._timer = None
        self._armed_s = None
        try:
            self.engine.advance(time.time())
        except Exception:  # the driver must survive a bug in one task's handling
            log.exception("advancing the wheel failed")
        self.rearm()

    def _sweep(self) -> None:
        """Close connections stuck in the middle of a message (see message_timeout_s)."""
        timeout_s = self.settings.message_timeout_s
        stale_before = time.monotonic() - timeout_s
        for conn in list(self.connections):
            if conn.partial_since is not None and conn.partial_since < stale_before:
                conn.refuse("bad_request", f"no complete message for {timeout_s:g} s")
        self._sweeper = asyncio.get_running_loop().call_later(min(timeout_s / 2, 5.0), self._sweep)

    # -- requests ----------------------------------------------------------------

    def _stats(self, conn: Connection, params: list[Any], now_s: float) -> dict[str, Any]:
        validate.params("stats", params)
        stats = self.engine.stats(now_s)
        stats["connections"] = len(self.connections)
        return stats

    def _auth(self, conn: Connection, params: list[Any], now_s: float) -> bool:
        (token,) = validate.params("auth", params, "token")
        expected = self.settings.token
        if expected is None:
            conn.authed = True
            return True
        if type(token) is not str or not hmac.compare_digest(token.encode(), expected.encode()):
            raise RequestError("unauthorized", "wrong token")
        conn.authed = True
        return True


class Connection(asyncio.Protocol):
    def __init__(self, server: Server) -> None:
        self.server = server
        self.engine = server.engine
        self.authed = server.settings.token is None
        self.decoder = Decoder(max_message_bytes=server.settings.max_message_bytes)
        self.encoder = Encoder()
        self.transport: asyncio.Transport | None = None
        # Replies in request order: [msgid, bytes, batch it waits for or None].
        self.replies: deque[list[Any]] = deque()
        self.waiting_on: set[int] = set()  # id() of batches we have a callback on
        self.waiters: dict[Waiter, asyncio.TimerHandle | None] = {}
        self.writing_paused = False
        self.reading_paused = False
        # When the message now half-received started to be waited for, or None.
        self.partial_since: float | None = None
        self.busy = False  # more requests are buffered; _work is scheduled for them

    # -- transport events ----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport, so no isinstance.
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if len(self.server.connections) >= self.server.settings.max_connections:
            limit = self.server.settings.max_connections
            self.refuse("unavailable", f"too many connections (limit {limit})")
            return
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        for waiter, timer in self.waiters.items():
            if timer is not None:
                timer.cancel()
            self.engine.cancel_wait(waiter)
        self.waiters.clear()
        self.transport = None

    def pause_writing(self) -> None:
        self.writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._update_reading()

    def data_received(self, data: bytes) -> None:
        try:
            self.decoder.feed(data)
        except ProtocolError as exc:
            self.refuse(exc.code, exc.message)
            return
        if not self.busy:
            self._work()

    def _work(self) -> None:
        """Handle what has arrived, at most MAX_REQUESTS_PER_TURN; the rest next turn.

        Stopping after a slice lets the journal write it and its replies go out
        while the next slice is handled, so a pipelining client and the server
        work at the same time instead of taking turns, and one client's huge
        pipeline cannot hold the loop against everyone else.
        """
        self.busy = False
        if self.transport is None:
            return
        decoder = self.decoder
        handled = 0
        try:
            now_s = time.time()
            for message in decoder:
                handled += 1
                if type(message) is Request:
                    self._handle(message, now_s)
                # Notifications from clients are ignored (pynvim sends one to
                # announce itself); a response from a client has no meaning.
                if handled == MAX_REQUESTS_PER_TURN:
                    self.busy = True
                    break
        except ProtocolError as exc:
            self._flush()
            self.refuse(exc.code, exc.message)
            return
        if self.busy:
            asyncio.get_running_loop().call_soon(self._work)
        elif decoder.buffered_bytes == 0:
            self.partial_since = None
        elif handled or self.partial_since is None:
            self.partial_since = time.monotonic()
        self._flush()
        self.server.rearm()

    # -- handling ----------------------------------------------------------------

    def _handle(self, request: Request, now_s: float) -> None:
        msgid = request.msgid
        if request.method == "reserve":
            self._reserve(request, now_s)
            return
        method = request.method
        route = self.server.routes.get(method)
        mutating = False
        try:
            if route is None:
                raise RequestError("no_method", f"no method named {validate.show(method)}")
            if not self.authed and method not in OPEN_METHODS:
                raise RequestError("unauthorized", f"{method} needs auth first (send auth [token])")
            run, mutating = route
            payload = self.encoder.response(msgid, run(self, request.params, now_s))
        except RequestError as exc:
            payload = self.encoder.error_response(msgid, exc.code, exc.message)
        except Exception as exc:
            payload = self._internal(msgid, method, exc)
        self._queue(msgid, payload, self.engine.journal.pending() if mutating else None)

    def _internal(self, msgid: int, method: str, exc: Exception) -> bytes:
        log.exception("internal error in %s", method, exc_info=exc)
        return self.encoder.error_response(
            msgid, "internal", f"internal error in {method}: {exc!r}"
        )

    def _queue(self, msgid: int, payload: bytes, batch: Batch | None) -> None:
        self.replies.append([msgid, payload, batch])
        if batch is not None and id(batch) not in self.waiting_on:
            self.waiting_on.add(id(batch))
            batch.add_callback(partial(self._batch_done, batch))
        if len(self.replies) > MAX_QUEUED_REPLIES:
            self._update_reading()

    def _batch_done(self, batch: Batch, error: StoreError | None) -> None:
        self.waiting_on.discard(id(batch))
        for entry in self.replies:
            if entry[2] is batch:
                entry[2] = None
                if error is not None:
                    entry[1] = self.encoder.error_response(entry[0], "unavailable", str(error))
        self._flush()

    def _flush(self) -> None:
        """Write every reply at the head of the line that is no longer waiting."""
        replies = self.replies
        ready = []
        while replies and replies[0][2] is None:
            ready.append(replies.popleft()[1])
        if ready and self.transport is not None:
            self.transport.write(b"".join(ready))
        self._update_reading()

    def _update_reading(self) -> None:
        if self.transport is None:
            return
        should_pause = (
            self.writing_paused or self.busy or len(self.replies) > MAX_QUEUED_REPLIES
        )
        if should_pause and not self.reading_paused:
            self.transport.pause_reading()
            self.reading_paused = True
        elif not should_pause and self.reading_paused:
            self.transport.resume_reading()
            self.reading_paused = False

    # -- reserve -------------------------------------------------------------------

    def _reserve(self, request: Request, now_s: float) -> None:
        msgid = request.msgid
        try:
            if not self.authed:
                raise RequestError("unauthorized", "reserve needs auth first (send auth [token])")
            topics, timeout = validate.params(
                "reserve", request.params, "topics", "timeout", optional=1
            )
            timeout_s = validate.number(
                "timeout", 0 if timeout is None else timeout, high=MAX_RESERVE_TIMEOUT_S
            )
            result = self.engine.try_reserve(topics, now_s)
        except RequestError as exc:
            self._queue(msgid, self.encoder.error_response(msgid, exc.code, exc.message), None)
            return
        except Exception as exc:
            self._queue(msgid, self._internal(msgid, "reserve", exc), None)
            return
        if result is not None or timeout_s == 0:
            batch = self.engine.journal.pending() if result is not None else None
            self._queue(msgid, self.encoder.response(msgid, result), batch)
            return
        waiter = Waiter(validate.topics(topics), lambda task: self._reserved(waiter, msgid, task))
        timer = asyncio.get_running_loop().call_later(
            timeout_s, lambda: self._reserve_timed_out(waiter, msgid)
        )
        self.waiters[waiter] = timer
        self.engine.wait_reserve(waiter)

    def _reserved(self, waiter: Waiter, msgid: int, task: dict[str, Any]) -> None:
        timer = self.waiters.pop(waiter, None)
        if timer is not None:
            timer.cancel()
        payload = self.encoder.response(msgid, task)
        batch = self.engine.journal.pending()
        if batch is None:
            self._send(payload)
            return

        def durable(error: StoreError | None) -> None:
            if error is None:
                self._send(payload)
            else:
                self._send(self.encoder.error_response(msgid, "unavailable", str(error)))

        batch.add_callback(durable)

    def _reserve_timed_out(self, waiter: Waiter, msgid: int) -> None:
        if self.waiters.pop(waiter, None) is None:
            return
        self.engine.cancel_wait(waiter)
        self._send(self.encoder.response(msgid, None))

    def _send(self, payload: bytes) -> None:
        """Write a reply that does not wait its turn (a blocked reserve's)."""
        if self.transport is not None:
            self.transport.write(payload)

    # -- closing -------------------------------------------------------------------

    def refuse(self, code: str, message: str) -> None:
        """Tell the peer why, then close: bad input or over a limit."""
        log.info("closing connection: %s: %s", code, message)
        if self.transport is not None:
            self.transport.write(self.encoder.notification("error", [code, message]))
            self.transport.close()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
