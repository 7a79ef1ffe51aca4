"""What both clients share: their settings, the retry policy, and the blocking connection.

How it works. ``Connection`` is one TCP socket with ``TCP_NODELAY``, one ``Decoder`` and one
``Encoder``: it encodes a request once, writes it with one ``sendall`` and reads until its
reply is decoded. ``Client`` keeps a small pool of them (see client.py); ``AsyncClient``
has its own asyncio protocol (see _aio_protocol.py) but the same limits on replies.

Retries. Both clients describe a lost connection as a ``Dropped`` that says whether the
request may have reached the server, and ``ClientBase._backoff_s`` decides: a request that
could not be sent at all (connect refused, reset while writing) is retried on a new
connection, up to ``retries`` times with a short backoff. A request that was sent but
whose reply never came may have been applied, so only the read-only methods (``ping``,
``auth``, ``get``, ``list``, ``stats``: see methods.py) are sent again; the others raise
``ConnectionFailed``. When the server said why it closed the connection, the call raises
``ServerClosed`` at once. Give ``add`` an ``id`` to make it safe to repeat yourself: a
second add of the same id answers ``Exists``. A TLS failure (a certificate that does not
verify, a server that refuses ours) is not retried either: it would fail the same way.
"""

from __future__ import annotations

import dataclasses
import select
import socket
import ssl
import urllib.parse
from collections.abc import Sequence
from typing import Any, TypeVar

from delaywheel_client._tls import (
    CLOSED_UNANSWERED_HINT,
    PLAIN_CLOSED_HINT,
    PathLike,
    client_context,
    handshake_failure,
    tls_reason,
)
from delaywheel_client.errors import ConnectionFailed, ServerClosed
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


def closed_by(params: Any) -> tuple[str, str]:
    """(code, message) from the params of the server's ``error`` notification."""
    if type(params) is list and len(params) >= 2:
        return str(params[0]), str(params[1])
    return "internal", f"malformed error notification: {params!r}"


def describe(exc: BaseException) -> str:
    """``TypeName: message``, or the type name alone when the message is empty."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class Dropped(Exception):
    """The connection failed; ``sent`` says whether the request may have reached the server.
    ``closed_by`` is the server's ``(code, message)`` when it said why it closed;
    ``permanent`` that trying again would fail the same way (TLS refused either way)."""

    def __init__(
        self,
        reason: str,
        sent: bool,
        closed_by: tuple[str, str] | None = None,
        permanent: bool = False,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.sent = sent
        self.closed_by = closed_by
        self.permanent = permanent


# -- the settings and the retry policy of both clients ---------------------------------------

_C = TypeVar("_C", bound="ClientBase")


@dataclasses.dataclass(eq=False, repr=False)
class ClientBase:
    """Where to connect and how long to wait: the settings ``Client`` and ``AsyncClient``
    share, and what both do when a connection drops. Subclasses set up their connection
    state in ``__post_init__``.

    TLS, for a server started with ``--tls-cert``: ``tls=True`` connects with TLS and
    verifies the server's certificate against the system's CAs and the host name;
    ``tls_ca`` (a PEM file) trusts a private CA instead; ``tls_cert`` and ``tls_key`` (PEM;
    the key may sit in the cert file) are this client's certificate, for a server with
    ``--tls-client-ca`` (mutual TLS); ``server_hostname`` is the name the server's
    certificate must carry when it is not ``host``. Giving ``tls_ca`` or ``tls_cert``
    turns TLS on by itself. For anything else (no verification, pinned ciphers) pass an
    ``ssl.SSLContext`` of your own as ``tls``. The files are loaded when the client is made:
    one that cannot be raises ``ValueError`` naming it.
    """

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    _: dataclasses.KW_ONLY
    token: str | None = None
    timeout_s: float = 10.0
    connect_timeout_s: float = 5.0
    retries: int = 3
    tls: bool | ssl.SSLContext = False
    tls_ca: PathLike | None = None
    tls_cert: PathLike | None = None
    tls_key: PathLike | None = None
    server_hostname: str | None = None

    def __post_init__(self) -> None:
        host, port = self.host, self.port
        self._label = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
        self._closed = False
        self._ssl = client_context(self.tls, self.tls_ca, self.tls_cert, self.tls_key)
        self._server_hostname = self.server_hostname or host

    @classmethod
    def from_url(cls: type[_C], url: str, **kw: Any) -> _C:
        """``delaywheel://[token@]host:port`` or plain ``host:port``; ``kw`` as ``__init__``.

        A ``token`` in ``kw`` wins over one in the URL. The connection opens on the first call.
        """
        host, port, token = parse_url(url)
        kw.setdefault("token", token)
        return cls(host, port, **kw)

    def _backoff_s(self, exc: Dropped, read_only: bool, attempt: int) -> float:
        """After a drop: how long to wait before trying again, or raises when the call may
        not be repeated (see the module docstring)."""
        retry = (read_only or not exc.sent) and exc.closed_by is None and not exc.permanent
        if retry and attempt < self.retries and not self._closed:
            return retry_delay_s(attempt)
        raise self._failure(exc, read_only) from exc

    def _failure(self, exc: Dropped, read_only: bool) -> ConnectionFailed:
        """What a call raises for a drop: ``ServerClosed`` when the server said why."""
        if exc.closed_by is not None:
            return ServerClosed(f"{self._label}: {exc.reason}", exc.closed_by[0])
        maybe_applied = exc.sent and not read_only
        maybe = " (it was sent and may have been applied)" if maybe_applied else ""
        failure = ConnectionFailed(f"{self._label}: {exc.reason}{maybe}")
        failure.maybe_applied = maybe_applied
        return failure


# -- one blocking connection -------------------------------------------------------------------


class Connection:
    """One socket and its codec. Not thread-safe: one borrower at a time."""

    __slots__ = ("decoder", "encoder", "heard", "msgid", "poller", "sock", "timeout_s")

    def __init__(self, sock: socket.socket, timeout_s: float) -> None:
        self.sock = sock
        self.timeout_s = timeout_s
        sock.settimeout(timeout_s)
        self.decoder = Decoder(
            max_message_bytes=MAX_REPLY_BYTES, max_container_len=MAX_REPLY_CONTAINER_LEN
        )
        self.encoder = Encoder()
        self.msgid = 0
        self.heard = False  # anything received yet
        self.poller: Any = None
        if hasattr(select, "poll"):
            self.poller = select.poll()
            self.poller.register(sock, select.POLLIN)

    @classmethod
    def open(
        cls,
        host: str,
        port: int,
        connect_timeout_s: float,
        timeout_s: float,
        tls: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
    ) -> Connection:
        """A new connection, with its TLS handshake done when ``tls`` is given; raises
        ``Dropped`` (not sent) when it cannot be opened."""
        try:
            sock = socket.create_connection((host, port), connect_timeout_s)
        except OSError as exc:
            raise Dropped(f"cannot connect: {describe(exc)}", sent=False) from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls is not None:
            try:  # the handshake, within connect_timeout_s; a failure closes the socket
                sock = tls.wrap_socket(sock, server_hostname=server_hostname or host)
            except ssl.SSLError as exc:
                raise Dropped(handshake_failure(exc), sent=False, permanent=True) from exc
            except OSError as exc:  # reset or timed out: worth another try
                raise Dropped(f"TLS handshake failed: {describe(exc)}", sent=False) from exc
        return cls(sock, timeout_s)

    def stale(self) -> bool:
        """True when, while idle, the server closed this connection or sent something."""
        if self.decoder.buffered_bytes:
            return True
        if isinstance(self.sock, ssl.SSLSocket) and self.sock.pending():
            return True  # decrypted, but not read yet
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
        """Send one request, return its reply. Raises Dropped, TypeError."""
        msgid = self.msgid
        payload = self.encoder.request(msgid, method, params)  # TypeError: the caller's value
        self.msgid = (msgid + 1) & MAX_MSGID
        if timeout_s != self.timeout_s:
            self.set_timeout(timeout_s)
        try:
            self.sock.sendall(payload)
        except OSError as exc:
            raise self._dropped(f"sending {method} failed: {describe(exc)}", sent=False) from exc
        return self._read_reply(msgid, method)

    def _read_reply(self, msgid: int, method: str) -> Response:
        reply: list[Response | None] = [None]
        self._read_replies(msgid, 0, 1, reply, method)
        return reply[0]  # type: ignore[return-value]  # the slot was filled

    def exchange_many(
        self, calls: Sequence[tuple[str, Sequence[Any]]], timeout_s: float
    ) -> list[Response]:
        """Send many requests in as few writes as the chunk size allows; replies in order."""
        first = self.msgid
        request = self.encoder.request
        payloads = [
            request((first + i) & MAX_MSGID, method, params)
            for i, (method, params) in enumerate(calls)
        ]
        self.msgid = (first + len(calls)) & MAX_MSGID
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
                    f"sending a pipeline failed: {describe(exc)}", sent=start > 0
                ) from exc
            self._read_replies(first, start, end, replies, "a pipeline")
            start = end
        return replies  # type: ignore[return-value]  # every slot was filled

    def _read_replies(
        self, first: int, start: int, end: int, replies: list[Response | None], what: str
    ) -> None:
        """Read until ``replies[start:end]`` are filled: the reply with msgid
        ``first + i`` goes to slot ``i``. ``what`` names the call in errors."""
        sock, decoder = self.sock, self.decoder
        waiting = end - start
        try:
            while waiting:
                data = sock.recv(READ_CHUNK_BYTES)
                if not data:
                    raise self._dropped(self._closed_reason(what))
                self.heard = True
                decoder.feed(data)
                for message in decoder:
                    if type(message) is Response:
                        index = (message.msgid - first) & MAX_MSGID
                        if start <= index < end and replies[index] is None:
                            replies[index] = message
                            waiting -= 1
                            if not waiting:
                                return  # anything after it stays buffered for later
                    elif type(message) is Notification:
                        self._notified(message)
        except TimeoutError as exc:
            raise self._dropped(f"no reply to {what} within {self.timeout_s:g} s") from exc
        except ssl.SSLError as exc:  # an alert: e.g. the server wanted our certificate
            why = f"the server ended TLS during {what}: {tls_reason(exc)}"
            raise self._dropped(why, permanent=True) from exc
        except ConnectionResetError as exc:
            if self.heard:
                raise self._dropped(f"reading the reply to {what} failed: {describe(exc)}") from exc
            # A close with our request unread makes the server's kernel answer RST.
            reason = self._closed_reason(what).replace("closed", "reset", 1)
            raise self._dropped(reason) from exc
        except OSError as exc:
            raise self._dropped(f"reading the reply to {what} failed: {describe(exc)}") from exc
        except ProtocolError as exc:
            raise self._dropped(f"undecodable reply to {what}: {exc}") from exc

    def _closed_reason(self, what: str) -> str:
        reason = f"the server closed the connection during {what}"
        if not self.heard:
            tls = isinstance(self.sock, ssl.SSLSocket)
            reason += CLOSED_UNANSWERED_HINT if tls else PLAIN_CLOSED_HINT
        return reason

    def _notified(self, message: Notification) -> None:
        """The server's parting ``[2, "error", [code, message]]``; other notifications are
        not defined for clients and are ignored."""
        if message.method != "error":
            return
        code, text = closed_by(message.params)
        reason = f"the server closed the connection: {text}"
        raise self._dropped(reason, closed_by=(code, text))

    def _dropped(
        self,
        reason: str,
        sent: bool = True,
        closed_by: tuple[str, str] | None = None,
        permanent: bool = False,
    ) -> Dropped:
        self.close()
        return Dropped(reason, sent, closed_by, permanent)

    def close(self) -> None:
        self.sock.close()


__all__ = [
    "ClientBase",
    "Connection",
    "Dropped",
    "closed_by",
    "describe",
    "parse_url",
    "retry_delay_s",
]
