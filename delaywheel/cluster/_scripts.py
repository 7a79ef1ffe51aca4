"""Lua scripts run through redis-py: loaded once, run by EVALSHA, reloaded on NOSCRIPT.

These are the calls that are not per request (leases, membership), so
redis-py's cost per call does not matter here (DESIGN.md's performance
notes); the journal's fenced flush goes over the hand-made link instead
(store/fenced.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, cast

from redis.asyncio import Redis, RedisCluster
from redis.exceptions import NoScriptError

Client = Redis | RedisCluster
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


def text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
