"""The Redis store's write path: a connection of its own, one pipeline per flush.

Why not redis-py here. Its asyncio ``pipeline(transaction=True)`` costs
several times the CPU per execute, however small, of the same MULTI/HSET/EXEC
bytes packed with ``hiredis.pack_command``, written on a plain
``asyncio.Protocol`` and parsed with ``hiredis.Reader`` (docs/performance.md,
"Measurements behind the code"); the fenced flush (fenced.py) is the same
case. A flush sits on the path of every mutating reply, so that difference
is most of a journaled add. redis-py still does everything that is not per
request: the start-up checks, loading, leases, the Cluster's slot map.

How it works
------------
``send(flush)`` writes the flush's bytes at once when the link is connected,
or queues them while it connects. Flushes are pipelined: several may be in
flight, Redis runs them in the order they were written, and their replies
come back in that order. A flush is its commands one after the other
(``pipeline()``; the fenced flush packs its own), and it expects one reply
each; it succeeded when none of them is an error (an EXEC's array is
looked into, and its nil means aborted). Each flush's
``done`` is called from ``data_received`` with None or an exception: no Task,
no coroutine.

Failures. A connection that drops (a Redis restart, say) takes the flushes in
flight with it, answered or not; each is sent again, once, in order, ahead of
anything newer, on a new connection. That is safe: a flush sets absolute
values (HSET) and removes ids (HDEL) of one key, so running again one that
Redis had already run changes nothing, and no later flush can have run
before it. A connect that fails, a second drop, or a reply that does not come
within ``timeout_s`` fails the flushes with ``ConnectionError`` or
``TimeoutError`` (the next send connects again). An error reply
fails only its own flush. On a Redis Cluster, ``MOVED`` means the slot went to
another node: nothing of that flush ran, so it is sent again to the node
named, up to ``MAX_MOVES`` times.

High availability: a fenced flush (fenced.py) is one EVALSHA per partition
that checks the partition's epoch and writes, optionally followed by WAIT,
still one round trip. It keeps its replies (``Flush.replies``) to tell the
partitions written from those fenced. Its script is loaded by the link's
handshake on every connection; a ``NOSCRIPT`` reply (SCRIPT FLUSH under a
live connection) means nothing of that EVALSHA ran, so the link reconnects,
which loads the script again, and sends the flush again, as for MOVED.

Sentinel: a link given ``resolve`` asks it for the primary's address before
every connect, so a drop or a refused handshake finds the new primary on the
next attempt; and a ``READONLY`` reply (the node was demoted to a replica:
nothing of that flush ran) reconnects through ``resolve`` and resends.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

import hiredis

# Replies a flush may wait for before the link gives up on the connection.
DEFAULT_TIMEOUT_S = 5.0
# Times one flush follows MOVED to another Cluster node before failing: a
# slot migrates once; more means the cluster is still settling.
MAX_MOVES = 3

Done = Callable[[Exception | None], None]
Resolve = Callable[[], Awaitable[tuple[str, int]]]
Command = Sequence[str | bytes | int | float]


def pipeline(commands: Sequence[Command]) -> Flush:
    """One flush: ``commands`` one after the other, no transaction."""
    payload = b"".join([hiredis.pack_command(cast(Any, tuple(command))) for command in commands])
    return Flush(payload, len(commands))


class Flush:
    """Bytes to send, how many replies they earn, and who to tell."""

    __slots__ = (
        "done",
        "error",
        "expected",
        "moves",
        "payload",
        "received",
        "replies",
        "sent_s",
        "tries",
    )

    def __init__(self, payload: bytes, expected: int, *, keep_replies: bool = False) -> None:
        self.payload = payload
        self.expected = expected
        # Every reply, in order, for a flush whose caller reads them (fenced.py).
        self.replies: list[object] | None = [] if keep_replies else None
        self.done: Done = _ignore
        self.received = 0
        self.error: Exception | None = None
        self.sent_s = 0.0
        self.tries = 0
        self.moves = 0

    def reset(self) -> None:
        self.received = 0
        self.error = None
        if self.replies is not None:
            self.replies = []


def _ignore(error: Exception | None) -> None:
    pass


class JournalLink(asyncio.Protocol):
    """One Redis connection that carries the store's flushes (see the module docstring)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        handshake: list[Command],
        tls: ssl.SSLContext | None = None,
        connect_timeout_s: float = DEFAULT_TIMEOUT_S,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        resolve: Resolve | None = None,
        follow_moved: bool = True,
    ) -> None:
        self.address = (host, port)
        # False for a link that serves one Cluster primary among several
        # (fenced_cluster.py): MOVED is then a reply its caller routes, and the
        # link stays on its node.
        self._follow_moved = follow_moved
        # Asked for the address before each connect (a Sentinel's primary), and
        # then READONLY (a primary demoted under us) reconnects and resends too.
        self._resolve = resolve
        self._handshake = handshake  # AUTH, SELECT, CLIENT SETNAME: sent first on each connection
        self._tls = tls
        self._connect_timeout_s = connect_timeout_s
        self._timeout_s = timeout_s
        self._transport: asyncio.Transport | None = None
        self._reader = hiredis.Reader()
        self._in_flight: deque[Flush] = deque()  # written, in order; replies pending
        self._waiting: deque[Flush] = deque()  # to write once connected
        self._moved: list[Flush] = []  # answered MOVED: to resend first, in order
        self._connecting: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False
        self._idle: asyncio.Future[None] | None = None  # see drain()

    # -- sending -------------------------------------------------------------

    def send(self, flush: Flush, done: Done) -> None:
        flush.done = done
        if self._closed:
            done(ConnectionError(f"{self._where()}: the journal connection is closed"))
            return
        if self._transport is not None and not self._waiting:
            self._write(flush)
        else:
            self._waiting.append(flush)
            self._connect_soon()

    def _write(self, flush: Flush) -> None:
        assert self._transport is not None
        flush.reset()
        flush.tries += 1
        flush.sent_s = time.monotonic()
        self._in_flight.append(flush)
        self._transport.write(flush.payload)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(
                self._timeout_s, self._check_timeout
            )

    def _connect_soon(self) -> None:
        if self._connecting is None and self._transport is None:
            self._connecting = asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        try:
            await asyncio.wait_for(self._open(), self._connect_timeout_s)
        except (OSError, asyncio.TimeoutError, ConnectionError) as exc:
            if self._transport is not None:
                self._transport.abort()
                self._transport = None
            self._connecting = None
            error = (
                exc
                if isinstance(exc, ConnectionError)
                else ConnectionError(f"Error connecting to {self._where()}: {exc!r}")
            )
            self._fail_all(self._waiting, error)
            return
        self._connecting = None
        waiting, self._waiting = self._waiting, deque()
        for flush in waiting:
            self._write(flush)

    async def _open(self) -> None:
        loop = asyncio.get_running_loop()
        if self._resolve is not None:
            self.address = await self._resolve()
        host, port = self.address
        await loop.create_connection(
            lambda: self, host, port, ssl=self._tls, server_hostname=host if self._tls else None
        )
        if self._handshake:
            answered: asyncio.Future[Exception | None] = loop.create_future()
            hello = pipeline(self._handshake)  # not a transaction: AUTH must come before MULTI
            self._write_hello(hello, answered)
            error = await answered
            if error is not None:
                raise ConnectionError(f"{self._where()} refused the handshake: {error}")

    def _write_hello(self, hello: Flush, answered: asyncio.Future[Exception | None]) -> None:
        def done(error: Exception | None) -> None:
            if not answered.done():
                answered.set_result(error)

        hello.done = done
        hello.tries = 1  # a handshake lost with its connection is not sent again
        self._write(hello)

    # -- the connection --------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport, so no isinstance.
        self._transport = cast(asyncio.Transport, transport)
        self._reader = hiredis.Reader()
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        reader.feed(data)
        in_flight = self._in_flight
        while (reply := reader.gets()) is not False:
            if not in_flight:  # a reply nobody asked for: the stream is out of step
                self._drop(ConnectionError(f"{self._where()} sent an unexpected reply"))
                return
            flush = in_flight[0]
            flush.received += 1
            if flush.replies is not None:
                flush.replies.append(reply)
            if flush.error is None and type(reply) is not int:  # an int is no error
                flush.error = _error_in(reply)
            if flush.received == flush.expected:
                in_flight.popleft()
                if flush.error is None and reply is None:  # EXEC gave nil: aborted
                    flush.error = ConnectionError("EXEC was aborted")
                if flush.error is not None and self._follow_move(flush):
                    return  # the rest are resent with it, once connection_lost runs
                flush.done(flush.error)
        if not in_flight:
            # The reply timer is left to run out: stopped here and started again
            # by the next write, it would cost a timer of the loop per flush
            # (docs/performance.md, "Measurements behind the code").
            # _check_timeout finds nothing in flight, or a flush sent since.
            self._wake_idle()

    def _follow_move(self, flush: Flush) -> bool:
        """On MOVED, send the flush again to the node named, on NOSCRIPT to the
        same node on a new connection (whose handshake loads the script);
        False otherwise."""
        moved = _moved_to(flush.error) if self._follow_moved else None
        if moved is None and (
            _is_noscript(flush.error) or (self._resolve is not None and _is_readonly(flush.error))
        ):
            moved = self.address  # the same node, or the one _resolve names then
        if moved is None or flush.moves >= MAX_MOVES:
            return False
        flush.moves += 1
        flush.tries = 0
        self.address = moved
        self._moved.append(flush)
        if self._transport is not None:
            self._transport.close()  # connection_lost reconnects, to the new node
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._stop_timer()
        if self._closed:
            self._fail_all(self._in_flight, ConnectionError(f"{self._where()}: closed"))
            self._fail_all(deque(self._moved), ConnectionError(f"{self._where()}: closed"))
            self._moved = []
            return
        # Resend what was in flight, once, ahead of what waits (see the module docstring).
        lost = ConnectionError(f"Connection to {self._where()} lost: {exc or 'closed by Redis'}")
        again = self._moved + [flush for flush in self._in_flight if flush.tries < 2]
        self._moved = []
        self._fail_all(deque(flush for flush in self._in_flight if flush.tries >= 2), lost)
        self._in_flight.clear()
        self._waiting.extendleft(reversed(again))
        if self._waiting:
            self._connect_soon()
        else:
            self._wake_idle()

    def _check_timeout(self) -> None:
        self._timer = None
        if not self._in_flight:
            return
        waited_s = time.monotonic() - self._in_flight[0].sent_s
        if waited_s >= self._timeout_s:
            self._drop(TimeoutError(f"{self._where()}: no reply within {self._timeout_s:g} s"))
        else:
            self._timer = asyncio.get_running_loop().call_later(
                self._timeout_s - waited_s, self._check_timeout
            )

    def _drop(self, error: Exception) -> None:
        """Give up on this connection: fail what is in flight, without resending."""
        in_flight, self._in_flight = self._in_flight, deque()
        self._fail_all(in_flight, error)
        if self._transport is not None:
            self._transport.abort()  # connection_lost finds nothing in flight

    def _fail_all(self, flushes: deque[Flush], error: Exception) -> None:
        while flushes:
            flushes.popleft().done(error)
        self._wake_idle()

    def reconnect(self) -> None:
        """Drop the connection now (the primary moved): what is in flight is sent
        again, once, on the next one, which asks ``resolve`` where to go first."""
        if self._transport is not None:
            self._transport.abort()  # connection_lost resends and reconnects

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- closing -----------------------------------------------------------------

    def busy(self) -> bool:
        return bool(self._in_flight or self._waiting or self._connecting)

    async def drain(self) -> None:
        """Wait until every flush sent so far has been answered or has failed."""
        while self.busy():
            self._idle = asyncio.get_running_loop().create_future()
            await self._idle

    def _wake_idle(self) -> None:
        if self._idle is not None and not self._idle.done() and not self.busy():
            self._idle.set_result(None)

    async def close(self) -> None:
        """Finish what was sent (within the reply timeout), then close."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.drain(), self._connect_timeout_s + self._timeout_s)
        self._closed = True
        if self._connecting is not None:
            self._connecting.cancel()
        if self._transport is not None:
            self._transport.close()
        self._fail_all(self._waiting, ConnectionError(f"{self._where()}: closed"))

    def _where(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"


def _error_in(reply: object) -> Exception | None:
    """The first error in a reply (EXEC's array holds one per command)."""
    if isinstance(reply, hiredis.ReplyError):
        return reply
    if type(reply) is list:
        for item in reply:
            if isinstance(item, hiredis.ReplyError):
                return item
    return None


def _is_noscript(error: Exception | None) -> bool:
    return isinstance(error, hiredis.ReplyError) and str(error).startswith("NOSCRIPT")


def _is_readonly(error: Exception | None) -> bool:
    return isinstance(error, hiredis.ReplyError) and str(error).startswith("READONLY")


def _moved_to(error: Exception | None) -> tuple[str, int] | None:
    """The node a ``MOVED <slot> <host>:<port>`` error names, else None."""
    if not isinstance(error, hiredis.ReplyError):
        return None
    words = str(error).split()
    if len(words) != 3 or words[0] != "MOVED":
        return None
    host, _, port = words[2].rpartition(":")
    return (host, int(port)) if port.isdigit() else None
