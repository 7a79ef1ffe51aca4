"""The listening sockets and their accept loop, the same on asyncio's loop and uvloop.

Why not ``loop.create_server``: neither loop handles ``accept`` failing for
want of a file descriptor (EMFILE, the process's limit; ENFILE, the
system's) in a way an operator can see and count. Measured here (CPython
3.11.7, uvloop 0.23 with libuv 1.48), 80 clients against a limit of 64:

- asyncio (``selector_events._accept_connection``) calls the loop's
  exception handler, an ERROR with a traceback from the ``asyncio`` logger,
  removes the socket's reader and retries in a second; but it goes on
  calling ``accept`` up to the backlog (100) times in that same turn, each
  failure logged and each scheduling another retry: 1,099 tracebacks in
  3 s. The waiting clients stay in the kernel's backlog and are served once
  descriptors free up.
- uvloop sheds load (libuv's ``uv__server_io``): it closes a descriptor it
  keeps in reserve, accepts every waiting connection and closes it at once,
  then takes its reserve again. 32 of the 80 clients saw their connection
  closed without a word; nothing is logged, nothing reaches Python. Without
  its reserve libuv just returns, and the readable socket spins the loop.

So the server makes its sockets (as ``create_server`` would: every address
of the host, ``SO_REUSEADDR``, IPv6 sockets IPv6 only) and accepts on the
loop's reader callback, on either loop, then hands each connection to
``loop.connect_accepted_socket``, which makes the same transport as
``create_server`` (TLS included). When ``accept`` fails for want of a
resource, the failure is counted (``errors``, by errno name, for the
metrics), logged at most once every ``LOG_EVERY_S`` with the count since the
last line, and accepting pauses for ``ACCEPT_RETRY_S``: the connections
already open are served meanwhile, and the waiting clients stay in the
backlog, as on asyncio, until a descriptor frees up.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import socket
import ssl
import time
from collections.abc import Callable

log = logging.getLogger("delaywheel.listener")  # pinned: its name is documented

# The listen() backlog (the kernel caps it at net.core.somaxconn, 4096 on
# recent Linux): a burst of a thousand workers reconnecting after a restart
# waits there instead of having its SYNs dropped and retried a second later.
BACKLOG = 1024
# Connections accepted per readiness callback before other work gets a turn.
ACCEPTS_PER_TURN = 256
# After accept failed for want of a resource: how long before trying again.
# Short, so that a descriptor freed by a closing connection is used soon;
# long enough that a table that stays full costs a few failed calls a second.
ACCEPT_RETRY_S = 0.25
# At most one log line per this long about failed accepts (each is counted).
LOG_EVERY_S = 10.0

# accept(2): "the network errors ... should be treated like EAGAIN by retrying".
_RETRY_AT_ONCE = frozenset(
    {
        errno.ECONNABORTED,
        errno.EPROTO,
        errno.ENETDOWN,
        errno.ENOPROTOOPT,
        errno.EHOSTDOWN,
        errno.EHOSTUNREACH,
        errno.EOPNOTSUPP,
        errno.ENETUNREACH,
        getattr(errno, "ENONET", errno.ENETDOWN),
    }
)

ProtocolFactory = Callable[[], asyncio.Protocol]


def listening_sockets(host: str | None, port: int, backlog: int = BACKLOG) -> list[socket.socket]:
    """Bound, listening, non-blocking sockets for every address of ``host`` (all
    interfaces for None or ""), as ``loop.create_server`` binds them. Raises
    ``OSError`` with the errno of a failed bind and the address in its text."""
    infos = socket.getaddrinfo(
        host or None, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE
    )
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            try:
                sock = socket.socket(family, kind, proto)
            except OSError:  # an address family this kernel lacks (IPv6 off)
                continue
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                why = (exc.strerror or str(exc)).lower()
                raise OSError(
                    exc.errno, f"error while attempting to bind on address {address!r}: {why}"
                ) from None
            sock.listen(backlog)
            sock.setblocking(False)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    if not sockets:
        raise OSError(errno.EADDRNOTAVAIL, f"no address to listen on for host {host!r}")
    return sockets


class Listener:
    """Accepts on ``sockets`` and makes a connection of ``factory`` for each."""

    def __init__(
        self,
        factory: ProtocolFactory,
        *,
        tls: ssl.SSLContext | None = None,
        handshake_timeout_s: float | None = None,
    ) -> None:
        self.factory = factory
        self.tls = tls
        self.handshake_timeout_s = handshake_timeout_s if tls is not None else None
        self.sockets: list[socket.socket] = []
        self.errors: dict[str, int] = {}  # failed accepts by errno name, since the start
        self._loop: asyncio.AbstractEventLoop | None = None
        self._retries: dict[int, asyncio.TimerHandle] = {}  # fd -> its paused reader's retry
        self._starting: set[asyncio.Task[None]] = set()  # connections being set up
        self._unlogged = 0  # failures since the last line about them
        self._logged_at_s = -LOG_EVERY_S
        self._plain_unlogged = 0  # plain-text clients on a TLS port since the last line
        self._plain_logged_at_s = -LOG_EVERY_S

    def start(self, host: str | None, port: int) -> None:
        self._loop = asyncio.get_running_loop()
        self.sockets = listening_sockets(host, port)
        for sock in self.sockets:
            self._loop.add_reader(sock.fileno(), self._accept, sock)

    def close(self) -> None:
        """Stop accepting: the listening sockets close; open connections stay."""
        loop, self._loop = self._loop, None
        for sock in self.sockets:
            if loop is not None:
                loop.remove_reader(sock.fileno())
            sock.close()
        for retry in self._retries.values():
            retry.cancel()
        self._retries.clear()
        for task in self._starting:  # accepted, not yet set up: closed, as if not accepted
            task.cancel()

    def _accept(self, sock: socket.socket) -> None:
        for _ in range(ACCEPTS_PER_TURN):
            try:
                conn, _address = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _RETRY_AT_ONCE:
                    continue
                self._failed(sock, exc)
                return
            self._serve(conn)

    def _serve(self, conn: socket.socket) -> None:
        assert self._loop is not None
        conn.setblocking(False)
        task = self._loop.create_task(self._connect(conn))
        self._starting.add(task)
        task.add_done_callback(self._starting.discard)

    async def _connect(self, conn: socket.socket) -> None:
        assert self._loop is not None
        # Read now: once a handshake fails the transport has closed the socket.
        peer = _peer(conn) if self.tls is not None else ""
        try:
            await self._loop.connect_accepted_socket(
                self.factory,
                conn,
                ssl=self.tls,
                ssl_handshake_timeout=self.handshake_timeout_s,
            )
        except Exception as exc:
            # A failed TLS handshake (a plain-text client, a certificate that
            # does not verify) or a peer gone already: that connection only.
            # create_server says nothing of these either, outside debug mode.
            log.debug("connection not set up: %r", exc)
            if self.tls is not None and _looks_plain(exc):
                self._plain_text(peer)
            conn.close()

    def _plain_text(self, peer: str) -> None:
        """Log (rate-limited) a client that spoke plain text to this TLS port."""
        self._plain_unlogged += 1
        now_s = time.monotonic()
        if now_s - self._plain_logged_at_s < LOG_EVERY_S:
            return
        more = self._plain_unlogged - 1
        log.warning(
            "%s sent plain text to this TLS port (or never finished its handshake)%s:"
            " it should connect with TLS (the CLI's --tls or --tls-ca FILE; in Python"
            " tls=True or tls_ca=)",
            peer,
            f" ({more} more since the last line)" if more else "",
            extra={"peer": peer, "failures": self._plain_unlogged},
        )
        self._plain_logged_at_s, self._plain_unlogged = now_s, 0

    def _failed(self, sock: socket.socket, exc: OSError) -> None:
        """Count, log (rate-limited) and pause accepting on ``sock`` for a while."""
        name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        self.errors[name] = self.errors.get(name, 0) + 1
        self._unlogged += 1
        now_s = time.monotonic()
        if now_s - self._logged_at_s >= LOG_EVERY_S:
            self._log(exc, name)
            self._logged_at_s, self._unlogged = now_s, 0
        assert self._loop is not None
        fd = sock.fileno()
        self._loop.remove_reader(fd)
        self._retries[fd] = self._loop.call_later(ACCEPT_RETRY_S, self._resume, sock)

    def _resume(self, sock: socket.socket) -> None:
        self._retries.pop(sock.fileno(), None)
        if self._loop is not None:
            self._loop.add_reader(sock.fileno(), self._accept, sock)

    def _log(self, exc: OSError, name: str) -> None:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        more = f" ({self._unlogged - 1} more since the last line)" if self._unlogged > 1 else ""
        if exc.errno == errno.EMFILE:
            advice = (
                f"the open files limit ({soft}, hard {hard}) is reached: raise LimitNOFILE= "
                "in systemd or ulimits: nofile: in compose, or lower --max-connections"
            )
        elif exc.errno == errno.ENFILE:
            advice = "the system's open files table is full (fs.file-max)"
        else:
            advice = "the system is short of memory for sockets"
        log.warning(
            "cannot accept connections: %s (%s)%s; %s. Open connections are still served; "
            "accepting again in %g s",
            *(exc.strerror or exc, name, more, advice, ACCEPT_RETRY_S),
            extra={"errno": name, "failures": self._unlogged},
        )


# What OpenSSL says when the first bytes are not a TLS record: an HTTP
# request, or a record header it cannot read (a MessagePack request's first
# byte, 0x94 for a 4-array, is no record type).
_PLAIN_TEXT_REASONS = frozenset(
    {"HTTP_REQUEST", "HTTPS_PROXY_REQUEST", "WRONG_VERSION_NUMBER", "UNKNOWN_PROTOCOL",
     "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG"}
)  # fmt: skip


def _peer(conn: socket.socket) -> str:
    try:
        host, port = conn.getpeername()[:2]
    except OSError:  # gone already
        return "a client"
    return f"{host}:{port}"


def _looks_plain(exc: Exception) -> bool:
    """Whether a failed TLS set-up looks like a client that is not speaking TLS.

    A short plain request (a ``ping``, 9 bytes) reads as the start of a record
    longer than what came, so OpenSSL waits for the rest until the handshake
    times out: a timeout counts too.
    """
    if isinstance(exc, ssl.SSLError):
        return exc.reason in _PLAIN_TEXT_REASONS
    return isinstance(exc, ConnectionAbortedError | TimeoutError) and "handshake" in str(exc)
