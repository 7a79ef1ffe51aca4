"""Where a call runs: on this node, or forwarded to the node that owns it.

A node that serves every partition (one node, or a memory or SQLite store) answers every
call itself (net/calls.py: the route a connection's request takes). A node of several
runs a call itself too, and when the engine answers ``moved`` or ``tryagain`` (another
node owns the task's partition, or it is being handed over) forwards it over the native
protocol with the Python client's ``AsyncClusterClient``, which follows ``moved``, waits
out ``tryagain`` and resends as every cluster client does (delaywheel_client/plans.py);
the owner's reply is the answer. The calls that visit every node (``list``, ``stats``,
``kick``, ``schedule_list``, ``ping``, ``cluster``: plans.FAN_OUT) and ``reserve``, which
collects from every node in turn as ``ClusterClient`` does, go through that client from
the start on such a node. An error left when the client gives up is ``unavailable``:
an HTTP client never sees ``moved`` or ``tryagain``.
"""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING, Any

from delaywheel_client.aio_cluster import AsyncClusterClient
from delaywheel_client.errors import DelaywheelError
from delaywheel_client.plans import FAN_OUT, method_plan

from delaywheel.errors import RequestError
from delaywheel.net.calls import Reserves, call

if TYPE_CHECKING:
    from delaywheel.net.server import Server

ELSEWHERE = frozenset({"moved", "tryagain"})
# Codes an HTTP client is shown as they are; any other from a forwarded call (a
# connection that failed, moved or tryagain past the client's own retries) is unavailable.
SHOWN_CODES = frozenset(
    {"bad_request", "not_found", "exists", "conflict", "too_large", "unauthorized", "unavailable"}
)


class Calls:
    """Runs the protocol's methods for the HTTP API, here or on their owner."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.reserves = Reserves(server)
        self._cluster: AsyncClusterClient | None = None
        self.forwarded = 0  # calls sent on to another node (or through the cluster client)

    async def run(self, method: str, params: list[Any]) -> Any:
        whole = self.server.engine.ownership.owns_all
        if method == "reserve":
            if whole:
                return await self.reserves.reserve(params)
            return await self._forward(method, params)
        if method == "wait":  # held here, or forwarded to its task's owner
            try:
                return await self.reserves.wait(params)
            except RequestError as exc:
                if whole or exc.code not in ELSEWHERE:
                    raise
            return await self._forward(method, params)
        if not whole and method in FAN_OUT:
            return await self._forward(method, params)
        try:
            return await call(self.server, method, params)
        except RequestError as exc:
            if exc.code not in ELSEWHERE:
                raise
        return await self._forward(method, params)

    async def _forward(self, method: str, params: list[Any]) -> Any:
        client = self._client()
        self.forwarded += 1
        try:
            return await client._run(method_plan(client, method, params))
        except DelaywheelError as exc:
            if exc.code in SHOWN_CODES:
                raise RequestError(exc.code, exc.message, exc.data) from None
            raise RequestError("unavailable", f"the task's node could not answer: {exc}") from None

    def _client(self) -> AsyncClusterClient:
        if self._cluster is None:
            settings = self.server.settings
            sockets = self.server.listener.sockets
            host, port = sockets[0].getsockname()[:2] if sockets else (settings.host, settings.port)
            if host in ("0.0.0.0", "::", ""):
                host = "127.0.0.1"
            shown = f"[{host}]" if ":" in host else host
            self._cluster = AsyncClusterClient(
                [f"{shown}:{port}"], token=settings.token, tls=_tls(self.server)
            )
        return self._cluster

    async def close(self) -> None:
        self.reserves.stop()
        if self._cluster is not None:
            await self._cluster.close()
            self._cluster = None


def _tls(server: Server) -> ssl.SSLContext | bool:
    """The nodes' own certificate, trusted as the anchor (nodes of one keyspace share
    it, and reach each other by the addresses of the map, not by the names it holds);
    with client certificates required, it is this node's too (so it must allow client
    authentication as well)."""
    settings = server.settings
    if settings.tls_cert is None or settings.tls_key is None:
        return False
    context = ssl.create_default_context(cafile=settings.tls_cert)
    context.check_hostname = False
    # The certificate itself is the anchor, whoever signed it (OpenSSL otherwise
    # wants the chain to end at a self-signed root in the file).
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    if settings.tls_client_ca is not None:
        context.load_cert_chain(settings.tls_cert, settings.tls_key)
    return context
