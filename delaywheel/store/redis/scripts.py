"""Lua scripts run through redis-py: loaded once, run by EVALSHA, reloaded on NOSCRIPT.

These are the calls that are not per request (leases, membership), so
redis-py's cost per call does not matter here (DESIGN.md's performance
notes); the journal's fenced flush goes over the hand-made link instead
(fenced.py).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Sequence
from typing import Any, cast

from redis.exceptions import NoScriptError

from delaywheel.store.redis.client import Client
from delaywheel.store.redis.layout import Layout

Arg = str | bytes | int | float


class Script:
    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    async def load(self, client: Client) -> None:
        # On a Cluster, redis-py sends SCRIPT LOAD to every primary.
        await cast(Any, client).script_load(self.source)

    async def run(self, client: Client, keys: Sequence[str], args: Sequence[Arg]) -> Any:
        runner = cast(Any, client)
        try:
            return await runner.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:  # a restarted or failed-over Redis, or SCRIPT FLUSH
            await self.load(client)
            return await runner.evalsha(self.sha, len(keys), *keys, *args)


class NodeNameError(ValueError):
    """A node name or address that cannot go into a lease or member entry."""


def check_name(what: str, value: str) -> str:
    if not value or any(c.isspace() for c in value) or len(value) > 200:
        raise NodeNameError(f"{what} {value!r}: must be 1..200 characters without spaces")
    return value


class NodeScripts:
    """A node's scripts on one redis-py client (its ``SCRIPTS``, loaded by ``load``)."""

    SCRIPTS: tuple[Script, ...] = ()

    def __init__(self, client: Client, layout: Layout, node: str, address: str) -> None:
        self.client = client
        self.layout = layout
        self.node = check_name("node", node)
        self.address = check_name("address", address)

    async def load(self) -> None:
        for script in self.SCRIPTS:
            await script.load(self.client)

    async def read_by_primary(
        self,
        groups: Sequence[Sequence[int]],
        queue: Callable[[Any, int], None],
        timeout_s: float | None,
    ) -> tuple[dict[int, Any], set[int]]:
        """One read of each partition, ``queue(pipeline, partition)`` putting its
        command in: a pipeline per group (the partitions of one primary, from
        ``Topology.by_primary``), all at once, each given ``timeout_s``.

        The replies by partition, and the partitions whose group failed or
        timed out. On a Cluster, redis-py retries a pipeline that met a dead
        primary for seconds; one pipeline for every partition held the
        coordinator's round that long, and the live primaries' partitions
        with it (tests/test_ha_cluster_primary_death.py).
        """

        async def read(group: Sequence[int]) -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for partition in group:
                queue(pipe, partition)
            return cast(list[Any], await asyncio.wait_for(pipe.execute(), timeout_s))

        replies = await asyncio.gather(*map(read, groups), return_exceptions=True)
        found: dict[int, Any] = {}
        unknown: set[int] = set()
        for group, reply in zip(groups, replies, strict=True):
            if isinstance(reply, asyncio.CancelledError):
                raise reply
            if isinstance(reply, BaseException):
                unknown.update(group)
            else:
                found.update(zip(group, reply, strict=True))
        return found, unknown


def text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
