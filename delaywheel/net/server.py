"""The TCP server: routes, auth, limits, and the tick driver.

It speaks the protocol and nothing else: each connection (connection.py)
decodes requests and answers them through ``routes``, which call the engine.
The server also owns what spans connections: the listening socket, the tick
driver that sleeps until the wheel's next non-empty tick, and the sweeper
that closes connections stuck in the middle of a message.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Callable
from typing import Any

from delaywheel.config import Settings
from delaywheel.delivery.service import Deliveries
from delaywheel.engine import validate
from delaywheel.engine.engine import Engine
from delaywheel.errors import RequestError
from delaywheel.net.connection import Connection

log = logging.getLogger("delaywheel.server")  # pinned: its name is documented

# The driver wakes at least this often even with nothing due, so a forward
# jump of the wall clock is noticed without waiting out a long sleep.
MAX_DRIVER_SLEEP_S = 1.0

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


Route = Callable[[Connection, list[Any], float], Any]


class Method:
    """How the server answers a method, and how often it was called and failed
    since the start (for metrics: one attribute increment per request)."""

    __slots__ = ("calls", "errors", "mutating", "name", "run")

    def __init__(self, name: str, run: Route | None, mutating: bool) -> None:
        self.name = name
        self.run = run  # None: reserve (the connection serves it) or unknown
        self.mutating = mutating
        self.calls = 0
        self.errors: dict[str, int] = {}  # by error code

    def failed(self, code: str) -> None:
        self.errors[code] = self.errors.get(code, 0) + 1


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
    def __init__(
        self, settings: Settings, engine: Engine, deliveries: Deliveries | None = None
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.deliveries = deliveries
        self.connections: set[Connection] = set()
        self._server: asyncio.Server | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._armed_s: float | None = None
        self._stopping = False
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
        # One lookup per request.
        self.routes: dict[str, Method] = {
            method: Method(method, _positional(method, handlers[method], names, optional), mutating)
            for method, (names, optional, mutating) in METHODS.items()
        }
        self.routes["ping"] = Method("ping", _ping, False)
        self.routes["auth"] = Method("auth", self._auth, False)
        self.routes["stats"] = Method("stats", self._stats, False)
        self.routes["reserve"] = Method("reserve", None, True)
        # Every name that is not a method is counted as one: a client must not
        # make a label of metrics out of any string it sends.
        self.unknown = Method("unknown", None, False)
        self.accepted = 0  # connections, since the start
        self.refused: dict[str, int] = {}  # connections closed by the server, by code

    async def start(self) -> tuple[str, int]:
        loop = asyncio.get_running_loop()
        tls = self.settings.tls_context()
        # A TLS peer gets --message-timeout to finish its handshake, as it gets
        # to finish a message. A failed handshake (a plain-text client, a
        # certificate that does not verify) just closes that connection: the
        # loop logs OSErrors only in debug mode, and Connection never sees it.
        self._server = await loop.create_server(
            lambda: Connection(self),
            self.settings.host,
            self.settings.port,
            reuse_address=True,
            ssl=tls,
            ssl_handshake_timeout=None if tls is None else self.settings.message_timeout_s,
        )
        if self.deliveries is not None:
            await self.deliveries.start(self.engine, self.rearm)
        self._on_tick()
        self._sweep()
        host, port = self._server.sockets[0].getsockname()[:2]
        return host, port

    async def stop(self) -> None:
        """Stop accepting and reading, answer what is in flight, close the
        connections, give deliveries in flight their grace period, and wait
        for the journal to drain."""
        self._stopping = True  # the wheel stops: nothing fires, no delivery starts
        if self._server is not None:
            self._server.close()
        for timer in (self._timer, self._sweeper):
            if timer is not None:
                timer.cancel()
        self._timer = self._sweeper = None
        for conn in list(self.connections):
            conn.stop_reading()
        # A connection holding more than a turn's requests handles the rest on
        # the next turns; then every reply waits only for the journal.
        while any(conn.busy for conn in self.connections):
            await asyncio.sleep(0)
        await self.engine.journal.drain()
        for conn in list(self.connections):
            conn.close()
        if self.deliveries is not None:
            await self.deliveries.stop(self.settings.shutdown_grace_s)
        await self.engine.journal.drain()

    # -- the tick driver -------------------------------------------------------

    def rearm(self) -> None:
        """Sleep until the wheel's next non-empty tick (called after every change)."""
        if self._stopping:
            return
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
        stats["tls"] = self.settings.tls_cert is not None
        if self.deliveries is not None:
            stats["deliveries"] = self.deliveries.stats()
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
