"""One client connection: decode, answer in order, hold replies until durable.

Each connection is an ``asyncio.Protocol`` (streams cost several times the round
trips, docs/performance.md). It handles what one read delivered, at most
``MAX_REQUESTS_PER_TURN`` requests a loop turn, and writes all the replies that
are ready in one ``write``.

Replies leave in request order. A reply to a mutating request waits in the
connection's line until the store write that holds its change returns (group
commit, see journal.py); the replies behind it wait too. The line is
net/replies.py's ``ReplyLine``; this module writes what it hands out. Only a
``reserve`` or ``wait`` that had to block is answered out of line, when it
gets its answer or times out (net/blocked.py). What a connection logs is
net/connlog.py's.

Backpressure: when the transport's write buffer is full (a client that sends
but never reads), or too many replies are waiting on the store, the connection
stops reading until it drains; and while the transport's buffer is over its
high-water mark (OUTPUT_HIGH_BYTES), or more than MAX_LINE_BYTES of replies wait on the store, it
handles none of the requests it has already read (a pipeline of big reads
would otherwise pile its replies up in memory). A turn stops as soon as its
replies pass MAX_TURN_REPLY_BYTES, so one reply larger than the bound goes
out whole, alone. Memory per connection is therefore bounded by one read, one
decoder buffer, about MAX_TURN_REPLY_BYTES of replies (or one reply) plus the
transport's buffer, and MAX_LINE_BYTES (or MAX_QUEUED_REPLIES replies) waiting
on the store.

An idle connection is small (about 3 kB, docs/operations.md "Connections"):
its decoder holds a MessagePack parser only while a message is partly
received (protocol.py, "Memory"), and the encoder is the server's.
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import TYPE_CHECKING, cast

from delaywheel_client.methods import OPEN_METHODS  # allowed before auth
from delaywheel_client.protocol import Decoder, ProtocolError, Request

from delaywheel import checks
from delaywheel.engine.horizon import MAX_FETCHES, NeedsStore
from delaywheel.errors import RequestError
from delaywheel.net.blocked import Blocked
from delaywheel.net.connlog import internal_error, log_refusal
from delaywheel.net.replies import ReplyLine
from delaywheel.store.base import StoreError

if TYPE_CHECKING:
    from delaywheel.net.server import Server


# Stop reading from a connection with this many replies waiting for the store:
# enough for a deep pipeline, small enough to bound the memory it can pin.
MAX_QUEUED_REPLIES = 10_000
# The transport's high-water mark: above it, the connection handles none of
# its buffered requests and reads nothing more until the client has read its
# replies down to a quarter of it. Group commit answers a pipeline's adds in
# bursts (a store write's worth: 8,000 replies of ~70 bytes in the journal
# bench); asyncio's 64 KiB default made every burst a pause, and Redis
# pipelined adds lost a third of their rate waiting on the client.
OUTPUT_HIGH_BYTES = 1024 * 1024
# Bytes of replies one turn may make before it stops: a client that pipelines
# big reads and never reads the replies pins at most this, the transport's
# buffer (OUTPUT_HIGH_BYTES) and one reply, however large that is.
MAX_TURN_REPLY_BYTES = 64 * 1024
# Bytes of replies waiting on the store above which no more requests are
# handled until they leave: far above what a pipeline of adds has in flight
# (10,000 replies of about 70 bytes), so only big replies (reserves of big
# tasks) ever reach it.
MAX_LINE_BYTES = 4 * 1024 * 1024
# Requests handled per connection per loop turn before the rest wait a turn:
# small enough that replies flow while a big pipeline is still being read,
# large enough that the per-turn overhead is noise.
MAX_REQUESTS_PER_TURN = 256
# The message limit of a connection that has not signed in yet (on a server
# with a token): ``auth`` with a token takes a few hundred bytes, and a peer
# that has proved nothing should not make the server buffer megabytes.
UNAUTHENTICATED_MAX_MESSAGE_BYTES = 16 * 1024


class Connection(asyncio.Protocol):
    def __init__(self, server: Server) -> None:
        self.server = server
        self.engine = server.engine
        self.journal = server.engine.journal
        self.authed = server.settings.token is None
        self.decoder = Decoder(max_message_bytes=server.settings.max_message_bytes)
        if not self.authed:  # until auth, a message is at most a token's size
            self.decoder.max_message_bytes = min(
                UNAUTHENTICATED_MAX_MESSAGE_BYTES, server.settings.max_message_bytes
            )
        self.encoder = server.encoder
        self.transport: asyncio.Transport | None = None
        # Replies leave in request order, through the line (net/replies.py);
        # those of a blocked reserve or wait out of line (net/blocked.py),
        # made at the first reserve or wait: most connections make neither,
        # and an idle one is kept small (docs/operations.md "Connections").
        self.line = ReplyLine(self.journal, self.encoder, server.rearm)
        self.blocked: Blocked | None = None
        # An inline store (memory) has written every change of a turn when the
        # turn ends (``Journal.release`` in _work), and _work's last _flush
        # sends their replies.
        self.inline = self.journal.inline
        self.stopping = False  # the server is shutting down: read nothing more
        self.writing_paused = False
        self.reading_paused = False
        # When the message now half-received started to be waited for, or None.
        self.partial_since: float | None = None
        self.busy = False  # more requests are buffered; _work is scheduled for them
        # A request waits for a store read before it runs (engine/horizon.py):
        # nothing after it is handled until it has run, so requests keep their order.
        self.fetching = False
        # Requests are buffered but handling them waits until the client reads
        # its replies (writing resumes) or the line's replies leave.
        self.stalled = False
        # A request of this turn may have scheduled a timer earlier than the
        # driver's: only then is the driver asked to look again (most requests
        # are reads, and each look costs a few heap peeks and clock reads).
        self.timers_moved = False
        # The peer's IP address while it is counted in server.per_address, and
        # when the connection was accepted (for --auth-timeout).
        self.address: str | None = None
        self.opened_s = 0.0

    def signed_in(self) -> None:
        """``auth`` succeeded: the connection gets the full message limit."""
        self.authed = True
        self.decoder.max_message_bytes = self.server.settings.max_message_bytes

    # -- transport events ----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport, so no isinstance.
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=OUTPUT_HIGH_BYTES)
        self.line.attach(self._flush)  # until connection_lost, which every made one gets
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        server = self.server
        if len(server.connections) >= server.settings.max_connections:
            limit = server.settings.max_connections
            self.refuse("unavailable", f"too many connections (limit {limit})")
            return
        name = transport.get_extra_info("peername")
        address = name[0] if isinstance(name, tuple) and name else None
        if address is not None:
            held = server.per_address.get(address, 0)
            if held >= server.settings.connections_per_address:
                limit = server.settings.connections_per_address
                self.refuse("unavailable", f"too many connections from {address} (limit {limit})")
                return
            server.per_address[address] = held + 1
            self.address = address
        self.opened_s = time.monotonic()
        server.connections.add(self)
        server.accepted += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        address = self.address
        if address is not None:
            self.address = None
            per_address = self.server.per_address
            held = per_address[address] - 1
            if held:
                per_address[address] = held
            else:
                del per_address[address]
        if self.blocked is not None:
            self.blocked.drop()
        self.line.detach()
        self.transport = None

    def pause_writing(self) -> None:
        self.writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self.writing_paused = False
        if self.stalled:
            self._resume_work()
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
        if self.transport is None or self.fetching:
            return
        line = self.line
        if self.writing_paused or line.line_bytes > MAX_LINE_BYTES:
            # The client is not reading what it was sent: handle nothing more
            # of its pipeline, or its replies would pile up in memory.
            self.stalled = True
            self._update_reading()
            return
        line.turn_bytes = 0
        decoder, journal = self.decoder, self.journal
        handled = 0
        inline = self.inline
        # The journal waits for our flush at the end of the turn: no call_soon per change.
        if inline:
            journal.hold()
        try:
            now_s = time.time()
            for message in decoder:
                handled += 1
                if type(message) is Request:
                    self._handle(message, now_s)
                    if self.fetching:  # the rest waits for its store read
                        break
                # Notifications from clients are ignored (pynvim sends one to
                # announce itself); a response from a client has no meaning.
                if handled == MAX_REQUESTS_PER_TURN or line.turn_bytes > MAX_TURN_REPLY_BYTES:
                    self.busy = True
                    break
        except ProtocolError as exc:
            self._flush()
            self.refuse(exc.code, exc.message)
            return
        finally:
            if inline:  # the turn's replies can leave now, in one write
                journal.release()
        if self.busy:
            asyncio.get_running_loop().call_soon(self._work)
        elif decoder.unpacker is None:  # nothing buffered (buffered_bytes, cheaper)
            self.partial_since = None
        elif handled or self.partial_since is None:
            self.partial_since = time.monotonic()
        self._flush()
        if self.timers_moved:
            self.timers_moved = False
            self.server.rearm()

    # -- handling ----------------------------------------------------------------

    def _fetch_later(self, request: Request, need: NeedsStore, fetches: int) -> None:
        """The request needs a store read first: nothing more is handled until
        it has run (``_fetch_first``)."""
        self.fetching = True
        asyncio.get_running_loop().create_task(self._fetch_first(request, need, fetches + 1))

    async def _fetch_first(self, request: Request, need: NeedsStore, fetches: int) -> None:
        """Read what the request needs from the store, then handle it again,
        then the requests behind it."""
        route = self.server.routes.get(request.method) or self.server.unknown
        try:
            if fetches > MAX_FETCHES:
                raise RequestError("unavailable", "the store kept changing under the request")
            await need.fetch()
        except (RequestError, StoreError) as exc:
            self.fetching = False
            code = exc.code if isinstance(exc, RequestError) else "unavailable"
            route.failed(code)
            msgid = request.msgid
            reply = self.encoder.error_response(msgid, code, str(exc))
            self.line.queue(msgid, reply, None, route)
        except Exception as exc:
            self.fetching = False
            route.failed("internal")
            msgid = request.msgid
            reply = internal_error(self.encoder, msgid, request.method, exc)
            self.line.queue(msgid, reply, None, route)
        else:
            self.fetching = False
            if self.transport is None:
                self.engine.horizon.settle()
                return
            self._handle(request, time.time(), fetches)
            if self.fetching:  # it needs another read
                return
            self.engine.horizon.settle()
            if self.journal.inline:
                self.journal.release()
        self._flush()
        self.server.rearm()
        if not self.busy:
            self.busy = True
            asyncio.get_running_loop().call_soon(self._work)

    def _handle(self, request: Request, now_s: float, fetches: int = 0) -> None:
        msgid, method = request.msgid, request.method
        route = self.server.routes.get(method)
        if route is None:
            route = self.server.unknown
        if not fetches:
            route.calls += 1
        if not self.authed and method not in OPEN_METHODS:
            message = f"{method} needs auth first (send auth [token])"
            route.failed("unauthorized")
            reply = self.encoder.error_response(msgid, "unauthorized", message)
            self.line.queue(msgid, reply, None, route)
            return
        run = route.run
        if run is None:  # reserve, wait, or no such method: one check for every other call
            if method == "reserve":
                self.timers_moved = True  # a reservation's deadline is a timer
                (self.blocked or self._blocked()).reserve(request, route, now_s)
            elif method == "wait":
                try:
                    (self.blocked or self._blocked()).wait(request, route)
                except NeedsStore as need:
                    self._fetch_later(request, need, fetches)
            else:
                route.failed("no_method")
                message = f"no method named {checks.show(method)}"
                reply = self.encoder.error_response(msgid, "no_method", message)
                self.line.queue(msgid, reply, None, route)
            return
        try:
            self.timers_moved |= route.mutating
            payload = self.encoder.response(msgid, run(self, request.params, now_s))
        except RequestError as exc:
            route.failed(exc.code)
            payload = self.encoder.error_response(msgid, exc.code, exc.message, exc.data)
        except NeedsStore as need:  # engine/horizon.py: a store read, then again
            self._fetch_later(request, need, fetches)
            return
        except Exception as exc:
            route.failed("internal")
            payload = internal_error(self.encoder, msgid, method, exc)
        batch = self.engine.journal.pending() if route.mutating else None
        self.line.queue(msgid, payload, batch, route)

    def _blocked(self) -> Blocked:
        """The connection's first reserve or wait: its ``Blocked``, made now."""
        assert self.transport is not None  # a request is handled only while connected
        self.blocked = Blocked(self.server, self.line, self.transport)
        return self.blocked

    def _flush(self) -> None:
        """Write the replies free to go; then, if that freed the connection
        (its client reads, the line is short again), handle and read more."""
        line = self.line
        data = line.take()
        if data is not None and self.transport is not None:
            self.transport.write(data)
        if self.stalled and not self.writing_paused and line.line_bytes <= MAX_LINE_BYTES:
            self._resume_work()
        if (
            self.reading_paused
            or self.writing_paused
            or self.busy
            or line.queued > MAX_QUEUED_REPLIES
        ):
            self._update_reading()

    def _resume_work(self) -> None:
        """The replies that stalled the connection have left: handle its buffered
        requests again, on the next loop turn (not inside a transport callback)."""
        self.stalled = False
        if not self.busy:
            self.busy = True
            asyncio.get_running_loop().call_soon(self._work)

    def _update_reading(self) -> None:
        if self.transport is None:
            return
        should_pause = (
            self.stopping
            or self.writing_paused
            or self.busy
            or self.stalled
            or self.line.queued > MAX_QUEUED_REPLIES
        )
        if should_pause and not self.reading_paused:
            self.transport.pause_reading()
            self.reading_paused = True
        elif not should_pause and self.reading_paused:
            self.transport.resume_reading()
            self.reading_paused = False

    # -- closing -------------------------------------------------------------------

    def refuse(self, code: str, message: str) -> None:
        """Tell the peer why, then close: bad input or over a limit."""
        refused = self.server.refused
        refused[code] = refused.get(code, 0) + 1
        log_refusal(self.transport, code, message)
        if self.transport is not None:
            self.transport.write(self.encoder.notification("error", [code, message]))
            self.transport.close()

    def stop_reading(self) -> None:
        """The server is stopping: read nothing more, and answer what is in
        flight. Requests already read are still handled (``_work``) and their
        replies go once durable; a blocked reserve is answered nil now, as if
        its timeout had run out, rather than cut off."""
        self.stopping = True
        self._update_reading()
        if self.blocked is not None:
            self.blocked.stop()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()  # after writing what is buffered
