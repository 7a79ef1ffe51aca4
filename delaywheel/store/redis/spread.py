"""Spreading a Redis Cluster keyspace's partitions over the primaries, at first start.

The release before this one kept, on a Redis Cluster, every partition under
the keyspace's own tag (``{<prefix>}:p007:tasks``, ``:epoch``, ``:lease``;
``Layout(single_slot=True)``): one slot, so one primary held every
partition. This release gives each partition its tag everywhere
(``{<prefix>:p007}:tasks``, layout.py), and records which layout a
keyspace has in its meta key: ``layout`` -> ``spread``.

``await spread(client, layout)`` runs at open on a Cluster (plain Redis never
had the single-slot layout):

- The meta key records the layout: nothing to do.
- It does not, and no single-slot partition key exists (one EXISTS over them
  all: they share a slot): a new keyspace. It is recorded ``spread`` and
  sealed (below).
- It does not, and single-slot keys exist: the old release's keyspace. Its
  partitions are moved one by one under the migration lock
  (``{<prefix>}:migrating``, migrate.py's: extended before each batch, taken
  over when its holder dies), then ``spread`` is recorded; the nodes that
  start meanwhile wait for that.

Moving partition p, and why it is safe:

1. **Seal** (one script in the old slot): while an old-release node's lease
   holds p, wait (every old node must be stopped first: a stopped node
   released its leases, a killed one's expire). Then the old lease is set to
   ``SEALED`` with no expiry and the old epoch is bumped: an old-release node
   started by mistake can never acquire p again (it stands by), and one
   paused mid-flush is refused ``FENCED`` by its own script.
2. **Carry the epoch**: p's new epoch key is raised to at least the old one,
   so the epochs in delivery headers keep increasing across the upgrade. The
   value it then has fences the copy, as migrate.py's does: a migrator
   paused past its lock, whose partition was moved and acquired (a new
   epoch) meanwhile, cannot bring back a task deleted since.
3. **Copy, then delete, in batches**: HSCAN the old hash, HSETNX into p's new
   hash (one script, fenced by the epoch), then HDEL what was copied from
   the old hash, until it is gone. A crash between the two leaves the same
   bytes in both places; the re-run keeps the copy and finishes.

No script spans two slots. A new keyspace is sealed too (the old lease keys
set to ``SEALED``, one MSET in their one slot), so an old-release node
pointed at it by mistake stands by instead of serving empty partitions.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from dataclasses import dataclass
from typing import Any, cast

from redis.exceptions import ResponseError

from delaywheel.store.redis.client import Client
from delaywheel.store.redis.layout import Layout, PartitionKeys, parse_holder
from delaywheel.store.redis.migrate import (
    COPY_SCRIPT,
    DEFAULT_BATCH,
    EXTEND_SCRIPT,
    LOCK_MS,
    UNLOCK_SCRIPT,
    WAIT_POLL_S,
    MigrationError,
    lock_key,
)

log = logging.getLogger("delaywheel.cluster")

SPREAD = "spread"
SINGLE_SLOT = "single-slot"
# The old layout's lease of a partition that moved: never expires, so no
# node of the old release acquires it (its value parses as epoch 0, node
# "sealed", address "-").
SEALED = "0 sealed -"

# KEYS: the old lease, the old epoch. ARGV: SEALED. Seals the partition
# unless an old node's lease holds it ({0, value, pttl} then); answers {1, old epoch}.
SEAL_SCRIPT = """
local held = redis.call('GET', KEYS[1])
if held and held ~= ARGV[1] then
  return {0, held, redis.call('PTTL', KEYS[1])}
end
redis.call('SET', KEYS[1], ARGV[1])
return {1, redis.call('INCR', KEYS[2])}
"""

# KEYS: the new epoch. ARGV: the old epoch. Raises the new one to at least
# the old one; answers it.
CARRY_SCRIPT = """
local now = tonumber(redis.call('GET', KEYS[1]) or '0')
if now < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1])
  return ARGV[1]
end
return tostring(now)
"""


@dataclass(frozen=True)
class Spread:
    """What one ``spread`` call did."""

    moved: int  # records copied into their partition's new hash
    kept: int  # already there (an interrupted run), deleted from the old hash
    seconds: float
    waited: bool  # another node held the lock; this one waited for it


async def recorded_layout(client: Client, layout: Layout) -> str | None:
    reply = await client.hget(layout.meta, "layout")
    return None if reply is None else _text(reply)


async def spread(
    client: Client,
    layout: Layout,
    *,
    node: str = "",
    batch: int = DEFAULT_BATCH,
    lock_ms: int = LOCK_MS,
) -> Spread | None:
    """Spread an old single-slot keyspace's partitions; None when there was nothing
    to move (see the module docstring). P must be recorded first (record_partitions)."""
    if await recorded_layout(client, layout) is not None:
        return None
    old = Layout(layout.prefix, layout.partitions, single_slot=True)
    found = await client.exists(*[k.epoch for k in old], *[k.tasks for k in old])
    if not found:
        await client.mset({keys.lease: SEALED for keys in old})
        await client.hsetnx(layout.meta, "layout", SPREAD)
        return None
    started_s = time.monotonic()
    key = lock_key(layout)
    token = f"{node or 'node'} {secrets.token_hex(8)}"
    waited = False
    while not await client.set(key, token, nx=True, px=lock_ms):
        if await recorded_layout(client, layout) is not None:
            return Spread(0, 0, time.monotonic() - started_s, waited=True)
        if not waited:
            log.info(
                "layout: waiting for %s to spread the %d partitions over the primaries",
                _text(await client.get(key)).split(" ")[0] or "another node",
                layout.partitions,
            )
            waited = True
        await asyncio.sleep(WAIT_POLL_S)
    try:
        if await recorded_layout(client, layout) is not None:  # done while we waited
            return Spread(0, 0, time.monotonic() - started_s, waited)
        log.info(
            "layout: spreading %d partitions of %r over the Cluster's primaries",
            layout.partitions,
            layout.prefix,
        )
        mover = _Mover(client, key, token, batch, lock_ms)
        for partition in range(layout.partitions):
            await mover.move(old.partition(partition), layout.partition(partition))
        await client.hset(layout.meta, "layout", SPREAD)
    finally:
        await client.eval(UNLOCK_SCRIPT, 1, key, token)
    seconds = time.monotonic() - started_s
    log.info(
        "layout: spread %d partitions over the primaries, %d records moved"
        " (%d already there) in %.1f s",
        layout.partitions,
        mover.moved + mover.kept,
        mover.kept,
        seconds,
    )
    return Spread(mover.moved, mover.kept, seconds, waited)


class _Mover:
    """Moves partitions from the old layout to the new under the lock ``key``."""

    def __init__(self, client: Client, key: str, token: str, batch: int, lock_ms: int) -> None:
        self.client = client
        self.key = key
        self.token = token
        self.batch = batch
        self.lock_ms = lock_ms
        self.moved = 0
        self.kept = 0

    async def _extend(self, what: str) -> None:
        if not await self.client.eval(EXTEND_SCRIPT, 1, self.key, self.token, self.lock_ms):
            raise MigrationError(
                f"spreading the partitions: the lock {self.key} expired while {what};"
                " the node that took it over finishes"
            )

    async def move(self, old: PartitionKeys, new: PartitionKeys) -> None:
        client = self.client
        told = False
        while True:
            await self._extend(f"sealing partition {old.partition}")
            reply: list[Any] = await client.eval(SEAL_SCRIPT, 2, old.lease, old.epoch, SEALED)
            if reply[0] == 1:
                break
            if not told:  # an old-release node still holds it (docs/operations.md: stop them)
                log.warning(
                    "layout: partition %d is still leased by %s of the old release;"
                    " waiting for it to stop (its lease ends in %d ms)",
                    old.partition,
                    parse_holder(_text(reply[1]), 0).node or "a node",
                    int(reply[2]),
                )
                told = True
            await asyncio.sleep(WAIT_POLL_S)
        epoch = await client.eval(CARRY_SCRIPT, 1, new.epoch, int(reply[1]))
        cursor = 0
        while True:
            cursor, found = await client.hscan(old.tasks, cursor, count=self.batch)
            if found:
                await self._extend(f"moving partition {old.partition}")
                records = cast("dict[bytes, bytes]", found)
                pairs = [item for pair in records.items() for item in pair]
                try:
                    new_count = await client.eval(
                        COPY_SCRIPT, 2, new.epoch, new.tasks, epoch, *pairs
                    )
                except ResponseError as exc:
                    if "MIGRATION_FENCED" in str(exc):
                        raise MigrationError(
                            f"spreading the partitions: partition {old.partition} moved and"
                            f" was acquired meanwhile ({exc}); the lock's holder finishes"
                        ) from None
                    raise
                await client.hdel(old.tasks, *found)
                self.moved += int(new_count)
                self.kept += len(found) - int(new_count)
            if cursor == 0:
                if not await client.exists(old.tasks):
                    return
                cursor = 0  # HSCAN may skip a record while the hash rehashes: again


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value or "")
