"""One client connection: decode, answer in order, hold replies until durable.

Each connection is an ``asyncio.Protocol`` (streams cost several times the round
trips, docs/performance.md). It handles what one read delivered, at most
``MAX_REQUESTS_PER_TURN`` requests a loop turn, and writes all the replies that
are ready in one ``write``.

Replies leave in request order. A reply to a mutating request waits in the
connection's line until the store write that holds its change returns (group
commit, see journal.py); the replies behind it wait too. Only a ``reserve``
that had to block is answered out of line, when it gets a task or times out.

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
import logging
import socket
import time
from collections import deque
from functools import partial
from operator import attrgetter
from typing import TYPE_CHECKING, Any, cast

from delaywheel_client.methods import OPEN_METHODS  # allowed before auth
from delaywheel_client.protocol import Decoder, ProtocolError, Request

from delaywheel import checks
from delaywheel.engine import validate
from delaywheel.engine.horizon import MAX_FETCHES, NeedsStore
from delaywheel.engine.journal import Wait
from delaywheel.engine.queues import Waiter, Watch
from delaywheel.errors import RequestError
from delaywheel.store.base import StoreError, reply_for

if TYPE_CHECKING:
    from delaywheel.net.routes import Method
    from delaywheel.net.server import Server

log = logging.getLogger("delaywheel.connection")  # pinned: its name is documented

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
# A reserve may block for at most a day; longer waits are a client bug.
MAX_RESERVE_TIMEOUT_S = 86_400.0
# A blocked wait whose task's partition left this node: when to send it again.
WAIT_MOVED_RETRY_MS = 100
# Topics one reserve may name. A blocked reserve waits in a line per topic
# (about 0.6 kB each), so 100,000 topics (1.2 MB sent) held 90 MB; a worker
# that watches more than this many topics is better served by fewer.
MAX_RESERVE_TOPICS = 1_000


class Durable:
    """What a reply that waits for no write waits for, in a list of waits."""

    __slots__ = ()
    finished = True
    error: StoreError | None = None


DURABLE = Durable()
# Read in C over a group's waits (``_flush``), not a line of Python per reply.
_finished = attrgetter("finished")
_error = attrgetter("error")


class Replies:
    """Replies next to each other in the connection's line: their payloads in
    request order, and each one's msgid and method, which a failed write needs
    to answer it with its error and count it against its method. ``wait`` is
    the store write (a journal ``Batch`` or ``Joint``) they all wait for, while
    they wait for one (None: none); ``waits`` is each one's, once they differ on a store of lanes
    (a Redis keyspace's partitions are lanes of their own, and consecutive
    requests mostly touch different ones).

    A group rather than an object per reply: a pipeline's replies mostly wait
    for one batch, so the line is emptied a group at a time, and only its
    head is looked at when a write is done (docs/performance.md,
    "Measurements behind the code"). A group whose replies wait for different
    writes leaves the line a prefix at a time: a reply goes once its own write
    and every one before it are done, whatever the later ones wait for."""

    __slots__ = ("msgids", "payloads", "routes", "size", "wait", "waits")

    def __init__(self, wait: Wait | None) -> None:
        self.wait = wait
        self.waits: list[Wait | Durable] | None = None
        self.size = 0  # bytes of its payloads
        self.payloads: list[bytes] = []
        self.msgids: list[int] = []
        self.routes: list[Method] = []  # the method each answers: a failed write counts against it


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
        # Replies leave in request order: those free to go now (``ready``, bytes),
        # then the line of those waiting for a store write and all behind them,
        # in groups (``Replies``); ``queued`` counts the replies in the line.
        self.ready: list[bytes] = []
        self.replies: deque[Replies] = deque()
        self.queued = 0
        # Bytes of replies made this turn (``turn_bytes``, see _work), and of
        # those in the line (``line_bytes``, see MAX_LINE_BYTES).
        self.turn_bytes = 0
        self.line_bytes = 0
        # The last write we registered a callback on (most replies wait on the one
        # before theirs: no set to look in), and every one whose callback has
        # not run yet, each registered once.
        self.waiting_on: Wait | None = None
        # On a store of lanes: whether we wait to be told of the next store answer.
        self.listening = False
        # One lane (memory, SQLite): batches only move forward, so a batch
        # other than ``waiting_on`` is always a new one: no set to keep.
        self.lanes = self.journal.lanes > 1
        # An inline store (memory) has written every change of a turn when the
        # turn ends (``Journal.release`` in _work), and _work's last _flush
        # sends their replies: no callback to register on a write.
        self.inline = self.journal.inline
        # Blocked reserves: each one's timeout timer and the msgid it answers.
        self.waiters: dict[Waiter, tuple[asyncio.TimerHandle, int]] = {}
        # Blocked waits, the same way: each one's timeout timer and msgid.
        self.watches: dict[Watch, tuple[asyncio.TimerHandle, int]] = {}
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
        for waiter, (timer, _) in self.waiters.items():
            timer.cancel()
            self.engine.cancel_wait(waiter)
        self.waiters.clear()
        self._drop_watches()
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
        if self.writing_paused or self.line_bytes > MAX_LINE_BYTES:
            # The client is not reading what it was sent: handle nothing more
            # of its pipeline, or its replies would pile up in memory.
            self.stalled = True
            self._update_reading()
            return
        self.turn_bytes = 0
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
                if handled == MAX_REQUESTS_PER_TURN or self.turn_bytes > MAX_TURN_REPLY_BYTES:
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
            self._queue(msgid, self.encoder.error_response(msgid, code, str(exc)), None, route)
        except Exception as exc:
            self.fetching = False
            route.failed("internal")
            self._queue(
                request.msgid, self._internal(request.msgid, request.method, exc), None, route
            )
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
            self._queue(msgid, reply, None, route)
            return
        run = route.run
        if run is None:  # reserve, wait, or no such method: one check for every other call
            if method == "reserve":
                self.timers_moved = True  # a reservation's deadline is a timer
                self._reserve(request, route, now_s)
            elif method == "wait":
                try:
                    self._wait(request, route)
                except NeedsStore as need:
                    self._fetch_later(request, need, fetches)
            else:
                route.failed("no_method")
                message = f"no method named {checks.show(method)}"
                reply = self.encoder.error_response(msgid, "no_method", message)
                self._queue(msgid, reply, None, route)
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
            payload = self._internal(msgid, method, exc)
        batch = self.engine.journal.pending() if route.mutating else None
        self._queue(msgid, payload, batch, route)

    def _internal(self, msgid: int, method: str, exc: Exception) -> bytes:
        log.exception("internal error in %s", method, exc_info=exc)
        return self.encoder.error_response(
            msgid, "internal", f"internal error in {method}: {exc!r}"
        )

    def _queue(self, msgid: int, payload: bytes, wait: Wait | None, route: Method) -> None:
        replies = self.replies
        size = len(payload)
        self.turn_bytes += size
        if not replies:
            if wait is None:  # nothing to wait for, nothing ahead of it
                self.ready.append(payload)
                return
            group = Replies(wait)
            replies.append(group)
        else:
            group = replies[-1]
            waits = group.waits
            if waits is not None:
                waits.append(DURABLE if wait is None else wait)
            elif group.wait is not wait:
                if self.lanes:  # from here on, each reply's own
                    waits = group.waits = [cast(Wait, group.wait)] * len(group.payloads)
                    waits.append(DURABLE if wait is None else wait)
                else:  # one lane: the next batch's replies, a group of their own
                    group = Replies(wait)
                    replies.append(group)
        if wait is not None and not self.inline:
            if self.lanes:  # told once a store answer has settled writes
                if not self.listening:
                    self.listening = True
                    self.journal.on_settled(self._settled)
            elif wait is not self.waiting_on:
                self.waiting_on = wait
                wait.add_callback(partial(self._write_done, wait))
        group.payloads.append(payload)
        group.msgids.append(msgid)
        group.routes.append(route)
        group.size += size
        self.line_bytes += size
        self.queued += 1
        if self.queued > MAX_QUEUED_REPLIES:
            self._update_reading()

    def _settled(self, failed: bool) -> None:
        """A store answer has settled writes (a store of lanes): the replies at
        the head of the line whose writes are done go; if some still wait, we
        are told again after the next answer."""
        self.listening = False
        if failed:  # the rollback may have put back an earlier timer
            self.server.rearm()
        self._flush()
        if self.replies and not self.listening:
            self.listening = True
            self.journal.on_settled(self._settled)

    def _write_done(self, wait: Wait, error: StoreError | None) -> None:
        if wait is self.waiting_on:
            self.waiting_on = None  # not to keep a finished batch's tasks alive
        if error is not None:  # the rollback may have put back an earlier timer
            self.server.rearm()
        self._flush()

    def _flush(self) -> None:
        """Write the ready replies and those at the head of the line no longer waiting."""
        replies, ready = self.replies, self.ready
        while replies:
            group = replies[0]
            waits = group.waits
            if waits is None:
                wait = group.wait
                if wait is not None:
                    if not wait.finished:
                        break
                    if wait.error is not None:
                        self._failed(group, 0, len(group.payloads), wait.error)
                replies.popleft()
                ready += group.payloads
                self.queued -= len(group.payloads)
                self.line_bytes -= group.size
                continue
            if all(map(_finished, waits)):  # one store answer settles every lane: commonest
                if any(map(_error, waits)):
                    for i, each in enumerate(waits):
                        if each.error is not None:
                            self._failed(group, i, i + 1, each.error)
                replies.popleft()
                ready += group.payloads
                self.queued -= len(waits)
                self.line_bytes -= group.size
                continue
            done = 0
            for each in waits:
                if not each.finished:
                    break
                if each.error is not None:
                    self._failed(group, done, done + 1, each.error)
                done += 1
            if done == len(waits):
                replies.popleft()
                ready += group.payloads
                self.queued -= done
                self.line_bytes -= group.size
                continue
            left = group.payloads[:done]
            ready += left
            self.queued -= done
            size = sum(map(len, left))
            group.size -= size
            self.line_bytes -= size
            del group.payloads[:done], group.msgids[:done], group.routes[:done], waits[:done]
            break
        if ready and self.transport is not None:
            self.transport.write(ready[0] if len(ready) == 1 else b"".join(ready))
            ready.clear()
        if self.stalled and not self.writing_paused and self.line_bytes <= MAX_LINE_BYTES:
            self._resume_work()
        if (
            self.reading_paused
            or self.writing_paused
            or self.busy
            or self.queued > MAX_QUEUED_REPLIES
        ):
            self._update_reading()

    def _resume_work(self) -> None:
        """The replies that stalled the connection have left: handle its buffered
        requests again, on the next loop turn (not inside a transport callback)."""
        self.stalled = False
        if not self.busy:
            self.busy = True
            asyncio.get_running_loop().call_soon(self._work)

    def _failed(self, group: Replies, first: int, end: int, error: StoreError) -> None:
        """The replies ``first:end`` of ``group`` get the error of their write."""
        if self.inline:  # no callback rearms for us (_write_done, _settled do otherwise)
            self.server.rearm()  # the rollback may have put back an earlier timer
        code, data = reply_for(error)
        message, encode = str(error), self.encoder.error_response
        for i in range(first, end):
            payload = encode(group.msgids[i], code, message, data)
            grown = len(payload) - len(group.payloads[i])  # the line's bytes stay exact
            group.payloads[i] = payload
            group.size += grown
            self.line_bytes += grown
            group.routes[i].failed(code)

    def _update_reading(self) -> None:
        if self.transport is None:
            return
        should_pause = (
            self.stopping
            or self.writing_paused
            or self.busy
            or self.stalled
            or self.queued > MAX_QUEUED_REPLIES
        )
        if should_pause and not self.reading_paused:
            self.transport.pause_reading()
            self.reading_paused = True
        elif not should_pause and self.reading_paused:
            self.transport.resume_reading()
            self.reading_paused = False

    # -- reserve -------------------------------------------------------------------

    def _reserve(self, request: Request, route: Method, now_s: float) -> None:
        msgid = request.msgid
        try:
            topics, timeout_s = reserve_params(request.params)
            result = self.engine.try_reserve(topics, now_s)
        except RequestError as exc:
            route.failed(exc.code)
            reply = self.encoder.error_response(msgid, exc.code, exc.message, exc.data)
            self._queue(msgid, reply, None, route)
            return
        except Exception as exc:
            route.failed("internal")
            self._queue(msgid, self._internal(msgid, "reserve", exc), None, route)
            return
        if result is not None or timeout_s == 0:
            batch = self.engine.journal.pending() if result is not None else None
            self._queue(msgid, self.encoder.response(msgid, result), batch, route)
            return
        waiter = Waiter(validate.topics(topics), lambda task: self._reserved(waiter, msgid, task))
        timer = asyncio.get_running_loop().call_later(
            timeout_s, lambda: self._reserve_timed_out(waiter, msgid)
        )
        self.waiters[waiter] = (timer, msgid)
        self.engine.wait_reserve(waiter)

    def _reserved(self, waiter: Waiter, msgid: int, task: dict[str, Any]) -> None:
        blocked = self.waiters.pop(waiter, None)
        if blocked is not None:
            blocked[0].cancel()
        self._answer_once_durable(msgid, task, "reserve")

    def _answer_once_durable(self, msgid: int, task: dict[str, Any], method: str) -> None:
        """A blocked call's answer, out of line, once the change it reports
        (the reservation; the change that made a waited-for task final) is
        durable: an error instead if that write fails."""
        payload = self.encoder.response(msgid, task)
        batch = self.engine.journal.pending()
        if batch is None:
            self._send(payload)
            return

        def durable(error: StoreError | None) -> None:
            if error is None:
                self._send(payload)
            else:
                code, data = reply_for(error)
                self.server.routes[method].failed(code)
                self._send(self.encoder.error_response(msgid, code, str(error), data))

        batch.add_callback(durable)

    def _reserve_timed_out(self, waiter: Waiter, msgid: int) -> None:
        blocked = self.waiters.pop(waiter, None)
        if blocked is None:
            return
        blocked[0].cancel()  # when called before its time, by stop_reading
        self.engine.cancel_wait(waiter)
        self._send(self.encoder.response(msgid, None))

    # -- wait ----------------------------------------------------------------------

    def _wait(self, request: Request, route: Method) -> None:
        """``wait``: the task's map once it is done, dead or gone, or nil after
        the timeout. Held as a blocked reserve is: a ``Watch`` in the task
        table's line for the id, a timer, nothing else while idle."""
        msgid = request.msgid
        try:
            task_id, timeout_s = wait_params(request.params)
            final = self.engine.wait_now(task_id)
        except RequestError as exc:
            route.failed(exc.code)
            reply = self.encoder.error_response(msgid, exc.code, exc.message, exc.data)
            self._queue(msgid, reply, None, route)
            return
        if final is not None or timeout_s == 0:
            # A state read as the store may not hold it yet: answered once it does.
            batch = self.engine.journal.pending() if final is not None else None
            self._queue(msgid, self.encoder.response(msgid, final), batch, route)
            return
        watch = Watch(task_id, lambda task: self._waited(watch, msgid, task))
        timer = asyncio.get_running_loop().call_later(
            timeout_s, lambda: self._wait_timed_out(watch, msgid)
        )
        self.watches[watch] = (timer, msgid)
        self.engine.watch(watch)

    def _waited(self, watch: Watch, msgid: int, task: dict[str, Any] | None) -> None:
        blocked = self.watches.pop(watch, None)
        if blocked is None:
            return
        blocked[0].cancel()
        if task is None:  # its partition left this node: a cluster client asks the new owner
            self.server.routes["wait"].failed("tryagain")
            message = f"task {watch.task_id!r} is no longer served here: send wait again"
            data = {"partition": None, "retry_after_ms": WAIT_MOVED_RETRY_MS}
            self._send(self.encoder.error_response(msgid, "tryagain", message, data))
            return
        self._answer_once_durable(msgid, task, "wait")

    def _wait_timed_out(self, watch: Watch, msgid: int) -> None:
        blocked = self.watches.pop(watch, None)
        if blocked is None:
            return
        self.engine.cancel_watch(watch)
        self._send(self.encoder.response(msgid, None))

    def _drop_watches(self) -> None:
        """The connection is going: its waits are answered by nothing (a
        client that is still there sends its ``wait`` again: it is read-only)."""
        for watch, (timer, _) in self.watches.items():
            timer.cancel()
            self.engine.cancel_watch(watch)
        self.watches.clear()

    def _send(self, payload: bytes) -> None:
        """Write a reply that does not wait its turn (a blocked reserve's)."""
        if self.transport is not None:
            self.transport.write(payload)

    # -- closing -------------------------------------------------------------------

    def refuse(self, code: str, message: str) -> None:
        """Tell the peer why, then close: bad input or over a limit."""
        refused = self.server.refused
        refused[code] = refused.get(code, 0) + 1
        peer, reason = _peer(self.transport), _loggable(message)
        log.info(
            "closing connection from %s: %s: %s",
            *(peer, code, reason),
            extra={"peer": peer, "code": code, "reason": reason},
        )
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
        for waiter, (_, msgid) in list(self.waiters.items()):
            self._reserve_timed_out(waiter, msgid)
        # Not a nil (a timeout) for a wait: left unanswered, its client's
        # retry sends it again to the server's next run.
        self._drop_watches()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()  # after writing what is buffered


def reserve_params(params: list[Any]) -> tuple[Any, float]:
    """``reserve``'s params checked: its topics (as sent; ``try_reserve`` checks each)
    and its timeout in seconds. Raises ``bad_request`` naming what is wrong."""
    topics, timeout = validate.params("reserve", params, "topics", "timeout", optional=1)
    timeout_s = checks.number(
        "timeout", 0 if timeout is None else timeout, high=MAX_RESERVE_TIMEOUT_S
    )
    if type(topics) is list and len(topics) > MAX_RESERVE_TOPICS:
        raise RequestError(
            "bad_request",
            f"reserve may name at most {MAX_RESERVE_TOPICS} topics, got {len(topics)}",
        )
    return topics, timeout_s


def wait_params(params: list[Any]) -> tuple[str, float]:
    """``wait``'s params checked: the task id and the timeout in seconds."""
    task_id, timeout = validate.params("wait", params, "id", "timeout", optional=1)
    timeout_s = checks.number(
        "timeout", 0 if timeout is None else timeout, high=MAX_RESERVE_TIMEOUT_S
    )
    return validate.task_id(task_id), timeout_s


# A refusal's reason as logged: at most this long.
MAX_LOGGED_REASON_CHARS = 200


def _loggable(message: str) -> str:
    """A refusal's reason without what it quotes of the input (``checks.show``,
    the codec's descriptions: up to 40-80 characters of a str or bin the peer
    sent). The peer is told; the log is not, so whatever a peer sends (a task
    body, a token, garbage) never reaches it."""
    quotes = [i for i in (message.find("'"), message.find('"')) if i >= 0]
    if quotes:
        kept = message[: min(quotes)]
        kept = kept[:-1] if kept.endswith(" b") else kept  # a bin's repr: b'...'
        message = kept.rstrip() + " [input not logged]"
    if len(message) > MAX_LOGGED_REASON_CHARS:
        message = message[: MAX_LOGGED_REASON_CHARS - 3] + "..."
    return message


def _peer(transport: asyncio.BaseTransport | None) -> str:
    """The peer's address as HOST:PORT ([HOST]:PORT for IPv6), or "unknown"."""
    name = None if transport is None else transport.get_extra_info("peername")
    if not isinstance(name, tuple) or len(name) < 2:
        return "unknown" if not name else str(name)  # a Unix socket's path
    host, port = name[0], name[1]
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
