"""Connecting to Redis with redis-py: a plain or a Cluster client, and Redis's own settings.

``connect()`` opens a plain client on the URL and asks the server whether it
is a Redis Cluster node (``INFO cluster``). If it is, it returns a cluster
client instead (redis-py's ``RedisCluster``, which learns the slot map from
that node and follows it as it changes), so any node of a cluster will do as
the URL. The store's topology (topology.py) takes the same steps one by one,
to know which kind it found; the broker of the store's Redis calls
``connect()`` (delivery/_redis_broker.py).

``durability_warnings()`` reads the settings that decide whether Redis keeps
what it acknowledged, on the node that the topology routes the keyspace's
meta key to.
"""

from __future__ import annotations

import contextlib
from typing import Any, cast

import hiredis
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.connection import Connection, SSLConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError, ResponseError
from redis.typing import EncodableT

from delaywheel.store.base import scrub

# Either client: the store uses only what both have (pipeline, hscan, aclose).
Client = Redis | RedisCluster

# What a failed call to Redis can raise (RedisClusterException is not a RedisError).
CLIENT_ERRORS = (RedisError, RedisClusterException, OSError)

_SETTINGS = ("appendonly", "appendfsync", "maxmemory-policy")


async def connect(url: str, *, connect_timeout_s: float, timeout_s: float) -> Client:
    """A client that has answered PING: plain, or Cluster when the node says so."""
    plain = await connect_plain(url, connect_timeout_s=connect_timeout_s, timeout_s=timeout_s)
    if not await is_cluster_node(plain):
        return plain
    await close_quietly(plain)
    return await connect_cluster(url, connect_timeout_s=connect_timeout_s, timeout_s=timeout_s)


async def connect_plain(url: str, *, connect_timeout_s: float, timeout_s: float) -> Redis:
    """A plain client on ``url`` that has answered PING."""
    tls = url.startswith("rediss://")
    plain = Redis.from_url(
        url,
        connection_class=_HiredisSSLConnection if tls else _HiredisConnection,
        socket_connect_timeout=connect_timeout_s,
        socket_timeout=timeout_s,
        # One retry, at once, on a connection error only: it reconnects a
        # pooled connection that a Redis restart closed.
        retry=Retry(NoBackoff(), retries=1, supported_errors=(RedisConnectionError,)),
        client_name="delaywheel",
    )
    try:
        await plain.ping()
    except BaseException:
        await close_quietly(plain)
        raise
    return plain


async def is_cluster_node(client: Redis) -> bool:
    """Whether the server behind ``client`` is a Redis Cluster node (INFO cluster)."""
    try:
        return bool((await client.info("cluster")).get("cluster_enabled") == 1)
    except BaseException:
        await close_quietly(client)
        raise


async def connect_cluster(url: str, *, connect_timeout_s: float, timeout_s: float) -> RedisCluster:
    """redis-py's Cluster client, the slot map read from the node of ``url``."""
    cluster = RedisCluster.from_url(
        url,
        socket_connect_timeout=connect_timeout_s,
        socket_timeout=timeout_s,
        client_name="delaywheel",
    )
    try:
        await cluster.initialize()
    except BaseException:
        await close_quietly(cluster)
        raise
    return cluster


async def close_quietly(client: Client) -> None:
    with contextlib.suppress(*CLIENT_ERRORS):  # the connections are gone either way
        await client.aclose()


async def replicas_warning(client: Client, replicas: int, **route: Any) -> str | None:
    """The start-up warning for ``--replicas N`` when fewer replicas are connected
    to the primary ``route`` names (INFO replication; redis-py's keywords for
    the node serving a key, the topology's ``route``); None when enough are.

    One line for the log: with fewer replicas than asked every change waits
    out WAIT's timeout and is answered ``unavailable`` until they connect.
    """
    if replicas <= 0:
        return None
    info = await client.info("replication", **route)
    connected = int(info.get("connected_slaves", 0))
    if connected >= replicas:
        return None
    return (
        f"--replicas {replicas} but the Redis primary has {connected} replica(s) connected:"
        " until enough connect, every change is answered unavailable after WAIT's timeout"
    )


async def durability_warnings(client: Client, secrets: list[str], **route: Any) -> list[str]:
    """What in Redis's settings would lose acknowledged writes, on the node
    ``route`` names (as for ``replicas_warning``); [] when nothing."""
    settings: dict[str, str] = {}
    try:
        for name in _SETTINGS:
            reply = await cast(Any, client).config_get(name, **route)
            for setting, value in reply.items():
                settings[_text(setting)] = _text(value).lower()
    except ResponseError as exc:  # CONFIG renamed away or forbidden (managed Redis)
        return [_unchecked(f"CONFIG GET refused: {scrub(str(exc), secrets)}")]
    if any(name not in settings for name in _SETTINGS):
        return [_unchecked("CONFIG GET did not report them")]
    found = []
    if settings["appendonly"] != "yes":
        found.append(
            "Redis has AOF off (appendonly no): acknowledged writes since"
            " the last snapshot are lost on a Redis crash"
        )
    elif settings["appendfsync"] == "no":
        found.append(
            "Redis has appendfsync no: the OS decides when the AOF reaches"
            " the disk, so an OS crash or power cut can lose ~30 s of acknowledged writes"
        )
    if settings["maxmemory-policy"] != "noeviction":
        found.append(
            f"Redis maxmemory-policy is {settings['maxmemory-policy']}: it"
            " may evict task records when memory runs out; use noeviction"
        )
    return found


def _unchecked(why: str) -> str:
    return (
        f"could not check that Redis keeps acknowledged writes ({why});"
        " make sure AOF is on (appendonly yes) and maxmemory-policy is noeviction"
    )


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class _HiredisPacking:
    """Pack commands with hiredis's C packer instead of redis-py's Python one.

    redis-py's asyncio connection packs every argument in Python, about 7 us
    per task in a write of a few hundred (measured): more than the rest of
    the server's work on an add. hiredis is already a dependency for parsing.
    (The Cluster client makes its own connections and packs in Python.)
    """

    def pack_command(self, *args: EncodableT) -> list[bytes]:
        first = args[0]
        # As redis-py does: a command name given with its subcommand
        # ("CONFIG GET") goes out as separate arguments.
        if isinstance(first, str) and " " in first:
            args = (*first.split(), *args[1:])
        return [hiredis.pack_command(cast(Any, args))]


class _HiredisConnection(_HiredisPacking, Connection):
    pass


class _HiredisSSLConnection(_HiredisPacking, SSLConnection):
    pass
