"""The TCP server: the listener, what spans connections, and the stop.

It speaks the protocol and nothing else: each connection (``connection``)
decodes requests and answers them through the method table (``routes``),
which calls the engine. The server owns what spans connections: the
listening sockets and their accept loop (``listener``: why not
``create_server``), the tick driver (``ticker``), the sweeper that closes
connections stuck in the middle of a message, and the graceful stop.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from typing import Any

from delaywheel_client.protocol import Encoder

from delaywheel.config import Settings
from delaywheel.delivery.service import Deliveries
from delaywheel.engine.engine import Engine
from delaywheel.ha.coordinator import Coordinator
from delaywheel.net.connection import Connection
from delaywheel.net.listener import Listener
from delaywheel.net.routes import Method, routes_for
from delaywheel.net.signins import SignIns
from delaywheel.net.ticker import Ticker


class Server:
    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        deliveries: Deliveries | None = None,
        coordinator: Coordinator | None = None,
        tls: ssl.SSLContext | None = None,  # net.tls.tls_of(settings), built at start
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.deliveries = deliveries
        self.connections: set[Connection] = set()
        self.per_address: dict[str, int] = {}  # connections open, by peer IP address
        # Failed sign-ins by address, for every door: auth here, and the dashboard's.
        self.signins = SignIns()
        self.encoder = Encoder()  # one for every connection: replies are packed one at a time
        # A TLS peer gets --message-timeout to finish its handshake, as it gets
        # to finish a message.
        self.listener = Listener(
            lambda: Connection(self), tls=tls, handshake_timeout_s=settings.message_timeout_s
        )
        self.ticker = Ticker(engine)
        self._sweeper: asyncio.TimerHandle | None = None
        self.routes: dict[str, Method] = routes_for(self)
        # Every name that is not a method is counted as one: a client must not
        # make a label of metrics out of any string it sends.
        self.unknown = Method("unknown", None, False)
        self.accepted = 0  # connections, since the start
        self.refused: dict[str, int] = {}  # connections closed by the server, by code
        self.accept_errors = self.listener.errors  # failed accepts, by errno name
        # A node of several on a shared keyspace (ha/coordinator.py), for metrics.
        self.coordinator = coordinator

    async def start(self) -> tuple[str, int]:
        self.listener.start(self.settings.host, self.settings.port)
        if self.deliveries is not None:
            await self.deliveries.start(self.engine, self.rearm)
        self.ticker.start()
        self._sweep()
        host, port = self.listener.sockets[0].getsockname()[:2]
        return host, port

    async def stop(self, until_s: float | None = None) -> str | None:
        """Stop accepting and reading, answer what is in flight, close the
        connections, give deliveries in flight their grace period, and wait
        for the journal to drain.

        With ``until_s`` (a ``time.monotonic()`` time: a node's stop is
        bounded, ha/coordinator.py) nothing waits past it: a change not
        durable by then is never answered (its client sees the connection
        close: outcome unknown), and the deliveries get what is left of their
        grace. Returns what it stopped waiting on then, or None."""
        self.ticker.stop()  # the wheel stops: nothing fires, no delivery starts
        self.listener.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for conn in list(self.connections):
            conn.stop_reading()
        # A connection holding more than a turn's requests handles the rest on
        # the next turns; then every reply waits only for the journal.
        while any(conn.busy for conn in self.connections):
            await asyncio.sleep(0)
        gave_up = None if await self._drained(until_s) else "waiting for the journal to drain"
        for conn in list(self.connections):
            conn.close()
        if self.deliveries is not None:
            grace_s = self.settings.shutdown_grace_s
            if until_s is not None:
                grace_s = min(grace_s, max(0.0, until_s - time.monotonic()))
            await self.deliveries.stop(grace_s)
        if not await self._drained(until_s):  # the outcomes of the deliveries
            gave_up = "waiting for the journal to drain"
        return gave_up

    async def _drained(self, until_s: float | None) -> bool:
        """Wait for the journal to drain, until ``until_s`` when given."""
        if until_s is None or self.engine.journal.newest() is None:
            await self.engine.journal.drain()
            return True
        # drain() waits on the batches' futures, not on Redis: cancelled at once.
        left_s = max(0.0, until_s - time.monotonic())
        try:
            await asyncio.wait_for(self.engine.journal.drain(), left_s)
        except asyncio.TimeoutError:
            return False
        return True

    def rearm(self) -> None:
        """A change may have moved the next timer earlier: the driver looks again."""
        self.ticker.rearm()

    def _sweep(self) -> None:
        """Close connections stuck in the middle of a message (see message_timeout_s),
        and those that have not signed in within auth_timeout_s on a server with a token."""
        settings = self.settings
        timeout_s, auth_timeout_s = settings.message_timeout_s, settings.auth_timeout_s
        now = time.monotonic()
        stale_before, unsigned_before = now - timeout_s, now - auth_timeout_s
        for conn in list(self.connections):
            if not conn.authed and conn.opened_s < unsigned_before:
                conn.refuse("unauthorized", f"no auth within {auth_timeout_s:g} s")
                continue
            if conn.stalled:  # its requests wait for it to read, not for its bytes
                continue
            if conn.partial_since is not None and conn.partial_since < stale_before:
                conn.refuse("bad_request", f"no complete message for {timeout_s:g} s")
        every_s = min(timeout_s / 2, 5.0)
        if settings.token is not None:
            every_s = min(every_s, auth_timeout_s / 2)
        self._sweeper = asyncio.get_running_loop().call_later(every_s, self._sweep)

    def stats(self, now_s: float) -> dict[str, Any]:
        """What ``stats`` answers: the engine's figures and the server's own."""
        stats = self.engine.snapshot().stats(now_s)
        ownership = self.engine.ownership
        stats["node"] = ownership.node
        stats["partitions"] = ownership.stats()
        if self.coordinator is not None:  # a node of a keyspace (docs/ha.md)
            coordinator = self.coordinator
            stats["replicas"] = coordinator.replicas.stats(
                coordinator.writes_refused_for_replicas()
            )
        stats["connections"] = len(self.connections)
        stats["schedules"] = self.engine.schedules.stats()
        stats["topic_settings"] = self.engine.topics.stats(now_s)
        stats["topic_shares"] = self.engine.flow.shares()
        stats["tls"] = self.settings.tls_cert is not None
        if self.deliveries is not None:
            stats["deliveries"] = self.deliveries.stats()
        return stats

    def cluster_map(self) -> dict[str, Any]:
        """The ``cluster`` reply (a single-node store: one partition, this node's)."""
        host, port = (
            self.listener.sockets[0].getsockname()[:2] if self.listener.sockets else ("", 0)
        )
        return self.engine.ownership.cluster_map(f"{host}:{port}")
