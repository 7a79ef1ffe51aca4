"""A Redis store's owner for tests (delaywheel/store/redis/owner.py): the epochs
are the test's to set, and the store's calls are recorded. And ``keyspace_node``:
one node of a keyspace in the test's process, with the real owner
(``NodeRights``), for a test that drives its coordinator by hand."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from delaywheel.engine.engine import Engine
from delaywheel.ha.rights import NodeRights
from delaywheel.ha.sharing import Sharing
from delaywheel.store.redis import Holders, RedisStore


class RecordingOwner:
    def __init__(self) -> None:
        self.epochs: dict[int, int] = {}
        self.fenced_calls: list[tuple[set[int], Holders]] = []
        self.primaries: list[tuple[str, int]] = []

    def fenced(self, fenced: set[int], holders: Holders) -> None:
        self.fenced_calls.append((fenced, holders))

    def primary_changed(self, host: str, port: int) -> None:
        self.primaries.append((host, port))


@dataclass
class Node:
    sharing: Sharing
    rights: NodeRights
    keyspace: RedisStore
    engine: Engine


@contextlib.asynccontextmanager
async def keyspace_node(
    url: str, *, partitions: int, lease_s: float, **engine_args: Any
) -> AsyncIterator[Node]:
    """Node "a" on the keyspace at ``url`` (flushed first), its store open for
    the ``with``; ``engine_args`` go to its ``Engine``."""
    async with Redis.from_url(url) as client:
        await client.flushdb()
    sharing = Sharing(node="a", address="127.0.0.1:7001", partitions=partitions, lease_s=lease_s)
    rights = NodeRights(sharing)
    keyspace = RedisStore(url, partitions=partitions, owner=rights)
    await keyspace.open()
    try:
        engine = Engine(keyspace, ownership=sharing, **engine_args)
        yield Node(sharing, rights, keyspace, engine)
    finally:
        await keyspace.close()
