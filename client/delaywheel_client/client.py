"""The blocking client: plain sockets, the sans-IO codec, a small pool of connections.

How it works. A call borrows an idle ``Connection`` (or opens one, sending ``auth`` first
when a token is set), exchanges its request and reply on it, then puts the connection back.
So threads never wait for each other: one thread blocked in ``reserve`` holds its own
connection while the others use theirs. At most ``MAX_IDLE_CONNECTIONS`` idle connections
are kept, and one the server closed while it sat idle is thrown away before it is reused,
without counting as a failure. Retries follow ``ClientBase`` (see connection.py). The
methods are commands.py's: this class says only how a call is sent (``_send``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, TypeVar

from delaywheel_client.commands import Blocking, Shape
from delaywheel_client.connection import (
    MAX_IDLE_CONNECTIONS,
    ClientBase,
    Connection,
    Dropped,
    parse_url,
)
from delaywheel_client.errors import ConnectionFailed, error_from_reply
from delaywheel_client.methods import READ_ONLY_METHODS
from delaywheel_client.pipeline import QueuedCalls
from delaywheel_client.serve import serve

_T = TypeVar("_T")


@serve
class Client(ClientBase, Blocking):
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
    top of it); ``connect_timeout_s`` bounds opening a connection (and its TLS handshake).

    TLS (see ``ClientBase``)::

        Client("queue.internal", 3450, tls_ca="ca.pem")  # verified against a private CA
        Client("queue.internal", 3450, tls_ca="ca.pem",  # mutual TLS
               tls_cert="client.pem", tls_key="client.key")
        Client("queue.example.com", 3450, tls=True)  # a certificate the system trusts

    A certificate that does not verify raises ``ConnectionFailed`` at the first call,
    without retrying.
    """

    def __post_init__(self) -> None:
        super().__post_init__()
        # list.pop() and list.append() are atomic, so the pool needs no lock.
        self._idle: list[Connection] = []

    def __repr__(self) -> str:
        return f"<Client {self._label}>"

    # -- connections -----------------------------------------------------------

    def _connect(self) -> Connection:
        if self._closed:
            raise ConnectionFailed(f"{self._label}: the client is closed")
        conn = Connection.open(
            self.host,
            self.port,
            self.connect_timeout_s,
            self.timeout_s,
            self._ssl,
            self._server_hostname,
        )
        if self.token is not None:
            try:
                reply = conn.exchange("auth", (self.token,), self.timeout_s)
            except Dropped as exc:
                exc.sent = False  # only auth was sent; the caller's request was not
                raise
            if reply.error is not None:
                conn.close()
                raise error_from_reply(reply.error)
        return conn

    def _borrow(self) -> Connection:
        idle = self._idle
        while True:
            try:
                conn = idle.pop()
            except IndexError:
                return self._connect()
            if not conn.stale():
                return conn
            conn.close()  # closed by the server while idle: not a failure, try the next

    def _give_back(self, conn: Connection) -> None:
        if self._closed or len(self._idle) >= MAX_IDLE_CONNECTIONS or conn.decoder.buffered_bytes:
            conn.close()
        else:
            self._idle.append(conn)

    def _exchange(self, read_only: bool, exchange: Callable[[Connection], _T]) -> _T:
        """``exchange(conn)`` on a borrowed connection, retried after a drop as
        ``ClientBase._backoff_s`` allows."""
        attempt = 0
        while True:
            try:
                conn = self._borrow()
            except Dropped as exc:
                time.sleep(self._backoff_s(exc, True, attempt))
                attempt += 1
                continue
            try:
                result = exchange(conn)
            except Dropped as exc:
                time.sleep(self._backoff_s(exc, read_only, attempt))
                attempt += 1
                continue
            except TypeError:
                self._give_back(conn)  # raised while encoding: nothing was sent
                raise
            except BaseException:  # KeyboardInterrupt mid-reply: the stream is out of step
                conn.close()
                raise
            self._give_back(conn)
            return result

    def _send(
        self, method: str, params: Sequence[Any], wait_s: float = 0.0, shape: Shape = None
    ) -> Any:
        timeout_s = wait_s + self.timeout_s  # a reserve's bad timeout raises before sending
        reply = self._exchange(
            method in READ_ONLY_METHODS, lambda conn: conn.exchange(method, params, timeout_s)
        )
        if reply.error is None:
            return reply.result if shape is None else shape(reply.result)
        raise error_from_reply(reply.error)

    def _call_many(self, calls: Sequence[tuple[str, Sequence[Any]]], timeout_s: float) -> list[Any]:
        read_only = all(method in READ_ONLY_METHODS for method, _ in calls)
        return self._exchange(read_only, lambda conn: conn.exchange_many(calls, timeout_s))

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

    def pipeline(self) -> Pipeline:
        """A batch: queue calls, then send them in one write and read every reply.

        Example::

            with dw.pipeline() as pipe:  # executes on a clean exit
                for n in range(1000):
                    pipe.add("thumbnails", {"image": n})
            first_id = pipe.results[0]["id"]
        """
        return Pipeline(self)


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


# parse_url: importable from here, as before the split.
__all__ = ["Client", "Pipeline", "parse_url"]
