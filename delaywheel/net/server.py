"""The TCP server: the listener, what spans connections, and the stop.

It speaks the protocol and nothing else: each connection (``connection``)
decodes requests and answers them through the method table (``routes``),
which calls the engine. The server owns what spans connections: the
listening socket, the tick driver (``ticker``), the sweeper that closes
connections stuck in the middle of a message, and the graceful stop.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from delaywheel_client.protocol import Encoder

from delaywheel.config import Settings
from delaywheel.delivery.service import Deliveries
from delaywheel.engine.engine import Engine
from delaywheel.net.connection import Connection
from delaywheel.net.routes import Method, routes_for
from delaywheel.net.ticker import Ticker


class Server:
    def __init__(
        self, settings: Settings, engine: Engine, deliveries: Deliveries | None = None
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.deliveries = deliveries
        self.connections: set[Connection] = set()
        self.encoder = Encoder()
        self._server: asyncio.Server | None = None
        self.ticker = Ticker(engine)
        self._sweeper: asyncio.TimerHandle | None = None
        self.routes: dict[str, Method] = routes_for(self)
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
        self.ticker.start()
        self._sweep()
        host, port = self._server.sockets[0].getsockname()[:2]
        return host, port

    async def stop(self) -> None:
        """Stop accepting and reading, answer what is in flight, close the
        connections, give deliveries in flight their grace period, and wait
        for the journal to drain."""
        self.ticker.stop()  # the wheel stops: nothing fires, no delivery starts
        if self._server is not None:
            self._server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
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

    def rearm(self) -> None:
        """A change may have moved the next timer earlier: the driver looks again."""
        self.ticker.rearm()

    def _sweep(self) -> None:
        """Close connections stuck in the middle of a message (see message_timeout_s)."""
        timeout_s = self.settings.message_timeout_s
        stale_before = time.monotonic() - timeout_s
        for conn in list(self.connections):
            if conn.partial_since is not None and conn.partial_since < stale_before:
                conn.refuse("bad_request", f"no complete message for {timeout_s:g} s")
        self._sweeper = asyncio.get_running_loop().call_later(min(timeout_s / 2, 5.0), self._sweep)

    def stats(self, now_s: float) -> dict[str, Any]:
        """What ``stats`` answers: the engine's figures and the server's own."""
        stats = self.engine.stats(now_s)
        stats["connections"] = len(self.connections)
        stats["tls"] = self.settings.tls_cert is not None
        if self.deliveries is not None:
            stats["deliveries"] = self.deliveries.stats()
        return stats
