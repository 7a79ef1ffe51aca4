"""Which Redis the store talks to, behind one interface: plain, Cluster or Sentinel.

The store (store.py) asks its topology what it needs and never which kind
of Redis it has:

- ``client``: redis-py's client, for what is not per request (the start-up
  checks, loading, leases, membership); on a Cluster one that routes each
  command by its key.
- ``route(key)``: redis-py's keywords that send a command about ``key`` to
  the node serving it (none on one server, ``target_nodes`` on a Cluster).
- ``by_primary(keys)``: the keys' indexes grouped by the primary serving
  them (one group on one server), so that a read of every partition can
  go one pipeline per primary and a dead primary holds up only its own.
- ``writer()``: the journal's fenced writer: one link to the server
  (fenced.py), or one link per Cluster primary (fenced_cluster.py).
- ``confirm_primary()`` and ``primary_moves``: whether the server written to
  is still the primary, and how many times it changed. Only Sentinel can
  say no (sentinel.py); elsewhere True and 0. ``on_primary_changed``, given
  when the topology is built, hears of a new primary.
- ``read_on_primary(host, port, keys)``: ROLE and a GET of each key on that
  server itself, on a connection of its own (after a failover).
- ``lay_out(layout, node)``: the key layout's step at open. On a Cluster a
  keyspace of the release that kept every partition in one slot is spread
  over the primaries first (spread.py); elsewhere there was only ever the
  spread layout, and the meta key says so.

A ``redis://`` or ``rediss://`` URL gives a ``Topology`` until ``open()``
asks the server (``INFO cluster``): a Cluster node makes it a
``ClusterTopology`` (redis-py's ``RedisCluster``, which learns the slot map
from that node and follows it), so any node of a cluster will do as the URL.
``redis+sentinel://`` gives a ``SentinelTopology`` (sentinel.py); the store
picks (``topology_for`` in store.py).

The journal's writes go over links of their own (link.py, hiredis on a plain
``asyncio.Protocol``), not redis-py: their settings (AUTH, SELECT, TLS,
timeouts) come from the URL, and ``socket_timeout`` and the like in its
query are passed to redis-py and take precedence.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Sequence
from typing import Any, cast

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.connection import parse_url
from redis.exceptions import AuthenticationError

from delaywheel.store.base import (
    StoreConfigError,
    StoreUnavailable,
    scrub,
    unavailable,
    url_secrets,
)
from delaywheel.store.redis.client import (
    CLIENT_ERRORS,
    Client,
    close_quietly,
    connect_cluster,
    connect_plain,
    is_cluster_node,
)
from delaywheel.store.redis.fenced import LOAD_SCRIPTS, FencedWriter
from delaywheel.store.redis.fenced_cluster import ClusterFencedWriter, Held
from delaywheel.store.redis.layout import Layout
from delaywheel.store.redis.link import Command, JournalLink, Resolve
from delaywheel.store.redis.spread import SPREAD, Spread, spread

# (host, port) of the primary named now, a different one than before.
OnPrimaryChanged = Callable[[str, int], None]
Writer = FencedWriter | ClusterFencedWriter


class Topology:
    """One Redis server, the URL's: every key on it, and it is the primary."""

    def __init__(
        self,
        url: str,
        *,
        shown: str,
        connect_timeout_s: float,
        timeout_s: float,
        on_primary_changed: OnPrimaryChanged | None = None,
    ) -> None:
        """``shown``: the store's URL as messages show it (no password)."""
        self.url = shown
        self.secrets = url_secrets(url)
        try:
            options = parse_url(url)
        except ValueError as exc:
            detail = scrub(str(exc), self.secrets)
            raise StoreConfigError(f"store URL {shown!r}: {detail}") from None
        self._raw_url = url
        self._options = cast("dict[str, Any]", options)
        self.connect_timeout_s = connect_timeout_s
        self.timeout_s = timeout_s
        self.on_primary_changed = on_primary_changed
        self.primary_moves = 0  # primaries changed since the start (Sentinel's failovers)
        self._client: Client | None = None

    @property
    def client(self) -> Client:
        """redis-py's client (checks, loading, leases, membership)."""
        client = self._client
        assert client is not None, "open() first"
        return client

    async def open(self) -> Topology:
        """Connect redis-py's client; the topology found (this one, or a Cluster's).

        ``StoreUnavailable`` says what to do: the password, or Redis not there."""
        try:
            return await self._connect()
        except AuthenticationError as exc:  # before CLIENT_ERRORS: it is a ConnectionError
            raise StoreUnavailable(self._auth_failure()) from exc
        except CLIENT_ERRORS as exc:
            failed = str(unavailable(self.url, "open", exc, self.secrets)).rstrip(".")
            raise StoreUnavailable(
                f"{failed}. Is Redis running there? Without Redis, use the embedded store:"
                " --store sqlite:///delaywheel.db"
            ) from exc

    async def _connect(self) -> Topology:
        timeouts = {"connect_timeout_s": self.connect_timeout_s, "timeout_s": self.timeout_s}
        plain = await connect_plain(self._raw_url, **timeouts)
        if not await is_cluster_node(plain):
            self._client = plain
            return self
        await close_quietly(plain)
        cluster = ClusterTopology(
            self._raw_url,
            shown=self.url,
            connect_timeout_s=self.connect_timeout_s,
            timeout_s=self.timeout_s,
            on_primary_changed=self.on_primary_changed,
        )
        cluster._client = cluster.cluster = await connect_cluster(self._raw_url, **timeouts)
        return cluster

    def _auth_failure(self) -> str:
        """What Redis's refusal means, by whether the URL has a password (never shown)."""
        if self.secrets:
            return (
                f"store {self.url}: Redis refused the password in the URL (a wrong password,"
                " or a user Redis does not know): it goes in as redis://:PASSWORD@host:port/db,"
                " or redis://USER:PASSWORD@host:port/db for an ACL user"
            )
        return (
            f"store {self.url}: Redis needs a password and the URL has none:"
            " put it in the URL as redis://:PASSWORD@host:port/db"
        )

    def route(self, key: str) -> dict[str, Any]:
        """redis-py's keywords that send a command about ``key`` where it is served."""
        return {}

    def by_primary(self, keys: Sequence[str]) -> list[list[int]]:
        """The indexes of ``keys`` grouped by the primary serving them: one here."""
        return [list(range(len(keys)))]

    async def replicas_connected(self, keys: Sequence[str]) -> dict[str, int]:
        """The replicas connected to each primary that serves ``keys`` (INFO
        replication), by the primary's ``host:port``: one here."""
        info = await self.client.info("replication")
        return {self.primary_address(): int(info.get("connected_slaves", 0))}

    def primary_address(self) -> str:
        """The primary's ``host:port`` (a socket's path) as this topology knows it."""
        options = self._options
        if "path" in options:
            return str(options["path"])
        return f"{options.get('host', 'localhost')}:{options.get('port', 6379)}"

    def writer(self, *, replicas: int, wait_timeout_s: float, held: Held) -> Writer:
        """The journal's fenced writer on a link of its own (fenced.py). With
        ``replicas``, its reply timeout outlasts WAIT's: at least
        ``wait_timeout_s`` + 1 s. ``held`` says whether this node still holds a
        partition at an epoch (a Cluster's writer asks before it sends a write
        again)."""
        return FencedWriter(
            self.link(
                name="delaywheel-fenced",
                load=LOAD_SCRIPTS,
                min_timeout_s=_min_timeout_s(replicas, wait_timeout_s),
            ),
            replicas=replicas,
            wait_timeout_ms=_ms(wait_timeout_s),
        )

    def link(
        self,
        *,
        name: str,
        load: Sequence[Command] = (),
        min_timeout_s: float = 0.0,
        address: tuple[str, int] | None = None,
    ) -> JournalLink:
        """A write connection with the URL's settings; ``load`` is sent last in
        each connection's handshake. ``address``: one Cluster primary of
        several, whose link leaves MOVED to its caller."""
        options = self._options
        host, port = options.get("host", "localhost"), int(options.get("port", 6379))
        if address is not None:
            host, port = address
        handshake: list[Command] = []
        password = options.get("password")
        if password is not None:
            username = options.get("username")
            handshake.append(("AUTH", username, password) if username else ("AUTH", password))
        handshake += self._select()
        handshake.append(("CLIENT", "SETNAME", name))
        handshake += load
        return JournalLink(
            host,
            port,
            handshake=handshake,
            tls=_tls_context(options) if self._raw_url.startswith("rediss://") else None,
            connect_timeout_s=float(options.get("socket_connect_timeout", self.connect_timeout_s)),
            timeout_s=max(min_timeout_s, float(options.get("socket_timeout", self.timeout_s))),
            resolve=self._resolve(),
            follow_moved=address is None,
        )

    def _select(self) -> list[Command]:
        db = int(self._options.get("db", 0))
        return [("SELECT", db)] if db else []

    def _resolve(self) -> Resolve | None:
        """What a link asks for its address before each connect (None: the URL's)."""
        return None

    async def confirm_primary(self) -> bool:
        """Whether the server written to is vouched for as the primary, now."""
        return True

    async def read_on_primary(
        self, host: str, port: int, keys: Sequence[str]
    ) -> tuple[str, list[bytes | None]]:
        """``ROLE`` and a GET of each key, on the server at ``host:port`` itself,
        on a connection of its own: not through a pool that may still hold
        connections to the previous primary."""
        options = self._options
        client = Redis(
            host=host,
            port=port,
            db=int(options.get("db", 0)),
            username=options.get("username"),
            password=options.get("password"),
            socket_timeout=self.timeout_s,
            socket_connect_timeout=self.connect_timeout_s,
            client_name="delaywheel-failover",
        )
        try:
            pipe = client.pipeline(transaction=False)
            pipe.execute_command("ROLE")
            for key in keys:
                pipe.get(key)
            role, *values = await pipe.execute()
        finally:
            await client.aclose()
        name = role[0].decode() if isinstance(role[0], bytes) else str(role[0])
        return name, list(values)

    async def lay_out(self, layout: Layout, node: str) -> Spread | None:
        """The layout's step at open: one server only ever had the spread key names."""
        await self.client.hsetnx(layout.meta, "layout", SPREAD)
        return None

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await close_quietly(client)


class ClusterTopology(Topology):
    """A Redis Cluster: each partition's keys in a slot of their own, the slots
    spread over the primaries, which redis-py's slot map names."""

    cluster: RedisCluster

    def route(self, key: str) -> dict[str, Any]:
        return {"target_nodes": self.cluster.get_node_from_key(key)}

    def by_primary(self, keys: Sequence[str]) -> list[list[int]]:
        """By the slot map redis-py holds now (a slot it maps to no node: a group of its own)."""
        groups: dict[str, list[int]] = {}
        for index, key in enumerate(keys):
            node = self.cluster.get_node_from_key(key)
            groups.setdefault(f"{index}?" if node is None else node.name, []).append(index)
        return list(groups.values())

    async def replicas_connected(self, keys: Sequence[str]) -> dict[str, int]:
        """Each primary serving one of ``keys`` (by the slot map), asked once."""
        nodes = map(self.cluster.get_node_from_key, keys)
        primaries = {node.name: node for node in nodes if node is not None}
        found = {}
        for name, node in sorted(primaries.items()):
            info = await self.cluster.info("replication", target_nodes=node)
            found[name] = int(info.get("connected_slaves", 0))
        return found

    def writer(self, *, replicas: int, wait_timeout_s: float, held: Held) -> Writer:
        def link_to(host: str, port: int) -> JournalLink:
            return self.link(
                name="delaywheel-fenced",
                load=LOAD_SCRIPTS,
                min_timeout_s=_min_timeout_s(replicas, wait_timeout_s),
                address=(host, port),
            )

        return ClusterFencedWriter(
            self.cluster,
            link_to,
            replicas=replicas,
            wait_timeout_ms=_ms(wait_timeout_s),
            held=held,
        )

    def _select(self) -> list[Command]:
        return []  # a Cluster has database 0 only

    async def lay_out(self, layout: Layout, node: str) -> Spread | None:
        # A keyspace of the release that kept a Cluster's partitions in one slot.
        return await spread(self.client, layout, node=node)


def _min_timeout_s(replicas: int, wait_timeout_s: float) -> float:
    """A write link's least reply timeout: a WAIT's, and a second more."""
    return wait_timeout_s + 1.0 if replicas else 0.0


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _tls_context(options: dict[str, Any]) -> ssl.SSLContext:
    """The write links' TLS settings, from the URL's ``ssl_*`` options as
    redis-py reads them (verifying by default)."""
    context = ssl.create_default_context(cafile=options.get("ssl_ca_certs"))
    if str(options.get("ssl_cert_reqs", "required")).lower() in ("none", "cert_none"):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if options.get("ssl_certfile"):
        context.load_cert_chain(options["ssl_certfile"], options.get("ssl_keyfile"))
    return context
