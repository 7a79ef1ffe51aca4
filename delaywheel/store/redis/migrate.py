"""Migrating a single-node keyspace to the per-partition layout, at first start.

The single-node release kept every record in one hash, ``{<prefix>}:tasks``.
The partitioned layout (layout.py) keeps partition
p's records in ``{<prefix>:p<p>}:tasks``. ``await migrate(client, layout)``
moves them over; a node calls it at start, before it acquires a partition.
It returns at once when there is nothing to move (the old hash is absent).

How it works, and why it is safe:

- **A lock.** ``{<prefix>}:migrating`` is SET NX PX with a token of this
  call's own, and extended (compare-and-extend) before each batch. A node
  that finds another's lock waits until the old hash is gone (that node
  finished) or the lock expires (that node died: this one takes over).
- **Copy, then delete, in batches.** A batch is read with HSCAN; each
  partition's share is copied with HSETNX by one script over that
  partition's epoch key and tasks hash (one hash tag, one Cluster slot);
  only then are the copied fields HDELed from the old hash (one slot too).
  A crash between the two leaves a record in both places, with the same
  bytes: the re-run's HSETNX keeps the copy and its HDEL finishes the move.
  No script spans two slots, so it all works on Redis Cluster.
- **Fenced by the epochs.** The lock can expire under a node that is only
  paused. When it resumes, another node may have finished, acquired a
  partition and deleted a task there; a blind HSETNX of the paused node's
  stale batch would bring that task back. So the migrator reads every
  partition's epoch once it holds the lock, and its copy script writes only
  while the epoch is still that value. Acquiring a partition bumps its epoch
  (lease.py), so a late copy is refused (``MIGRATION_FENCED``) and the
  late migrator stops, leaving the rest to whoever holds the lock.
- **P is recorded first** (``record_partitions``): records moved into P
  partitions are only found by nodes that agree on P.

A record already in the partition hash under the same id is kept (HSETNX),
and counted in ``Migrated.kept``: it can only be there from an earlier,
interrupted run (same bytes) or from a keyspace that was already partitioned
before an old release wrote the old hash again, in which case the partitioned
copy is the one the cluster has been serving.

Nothing may write the old hash meanwhile: every node of the old release is
stopped before the first node of this one starts (docs/operations.md,
Upgrading).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import cast

from redis.exceptions import ResponseError

from delaywheel.store.redis.client import Client
from delaywheel.store.redis.layout import Layout, partition_of, record_partitions

log = logging.getLogger("delaywheel.cluster")

# Fields read per HSCAN and moved per round: big enough that 1,000,000
# tasks take seconds, small enough that one round stays well inside a lease.
DEFAULT_BATCH = 1000
# The lock outlives a stalled round many times over; it is extended before
# each batch.
LOCK_MS = 30_000
# How often a node waiting for another's migration looks again.
WAIT_POLL_S = 0.2

# KEYS: epoch, tasks of one partition. ARGV: the epoch read at the start
# ("" when unset), then field, record pairs. Copies with HSETNX while the
# epoch is unchanged; answers how many were new.
COPY_SCRIPT = """
local epoch = redis.call('GET', KEYS[1]) or ''
if epoch ~= ARGV[1] then
  return redis.error_reply('MIGRATION_FENCED ' .. KEYS[1] .. ' is ' .. epoch .. ', was ' .. ARGV[1])
end
local new = 0
for i = 2, #ARGV, 2 do
  new = new + redis.call('HSETNX', KEYS[2], ARGV[i], ARGV[i + 1])
end
return new
"""

# KEYS: the lock. ARGV: token, ms. Extends the lock only while it is ours.
EXTEND_SCRIPT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

# KEYS: the lock. ARGV: token. Deletes the lock only while it is ours.
UNLOCK_SCRIPT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class MigrationError(RuntimeError):
    """The migration could not go on (its lock lost, or its writes fenced)."""


@dataclass(frozen=True)
class Migrated:
    """What one ``migrate`` call did."""

    moved: int  # records copied into their partition and deleted from the old hash
    kept: int  # records already in their partition (kept there), deleted from the old hash
    seconds: float
    waited: bool  # another node held the lock; this one waited for it

    @property
    def total(self) -> int:
        return self.moved + self.kept


OnBatch = Callable[[int], Awaitable[None]]


def lock_key(layout: Layout) -> str:
    """The migration lock: under the keyspace's own tag, beside the old hash."""
    return f"{{{layout.prefix}}}:migrating"


async def migrate(
    client: Client,
    layout: Layout,
    *,
    node: str = "",
    batch: int = DEFAULT_BATCH,
    lock_ms: int = LOCK_MS,
    on_batch: OnBatch | None = None,
) -> Migrated | None:
    """Move a single-node keyspace's records into their partitions; None if none to move.

    ``client`` is redis-py's (plain or Cluster, decode_responses off, as
    client.connect makes it). ``node`` names this node in the
    lock (shown to a node that waits). ``on_batch(done)`` is awaited before
    each batch's copy with the number of records moved so far: progress, and a
    place for tests to pause a migration. Raises ``PartitionsError`` when the
    keyspace records another P, ``MigrationError`` when this node's lock or
    writes were taken over, redis-py's errors when Redis is unreachable.
    """
    if batch < 1 or lock_ms < 1:
        raise ValueError(f"batch {batch!r}, lock {lock_ms!r} ms: must be >= 1")
    if not await client.exists(layout.single_node_tasks):
        return None
    await record_partitions(client, layout)
    started_s = time.monotonic()
    key = lock_key(layout)
    token = f"{node or 'node'} {secrets.token_hex(8)}"
    waited = False
    while not await client.set(key, token, nx=True, px=lock_ms):
        if not await client.exists(layout.single_node_tasks):
            return Migrated(0, 0, time.monotonic() - started_s, waited=True)
        if not waited:
            holder = await client.get(key)
            log.info(
                "migration: waiting for %s to finish moving %s into %d partitions",
                _text(holder).split(" ")[0] or "another node",
                layout.single_node_tasks,
                layout.partitions,
            )
            waited = True
        await asyncio.sleep(WAIT_POLL_S)
    try:
        count = await client.hlen(layout.single_node_tasks)
        log.info(
            "migration: moving %d records from %s into %d partitions",
            count,
            layout.single_node_tasks,
            layout.partitions,
        )
        epochs = await _epochs(client, layout)
        moved, kept = await _move_all(client, layout, key, token, epochs, batch, lock_ms, on_batch)
    finally:
        await client.eval(UNLOCK_SCRIPT, 1, key, token)
    seconds = time.monotonic() - started_s
    log.info(
        "migration: moved %d records into %d partitions (%d already there) in %.1f s",
        moved + kept,
        layout.partitions,
        kept,
        seconds,
    )
    return Migrated(moved, kept, seconds, waited)


async def _epochs(client: Client, layout: Layout) -> dict[int, bytes]:
    """Every partition's epoch now (b"" when unset): the copy script's fence."""
    pipe = client.pipeline(transaction=False)
    for keys in layout:
        pipe.get(keys.epoch)
    replies = await pipe.execute()
    return {p: cast("bytes | None", reply) or b"" for p, reply in enumerate(replies)}


async def _move_all(
    client: Client,
    layout: Layout,
    key: str,
    token: str,
    epochs: dict[int, bytes],
    batch: int,
    lock_ms: int,
    on_batch: OnBatch | None,
) -> tuple[int, int]:
    moved = kept = 0
    while True:
        cursor = 0
        while True:
            cursor, found = await client.hscan(layout.single_node_tasks, cursor, count=batch)
            if found:
                if not await client.eval(EXTEND_SCRIPT, 1, key, token, lock_ms):
                    raise MigrationError(
                        f"migration of {layout.single_node_tasks}: the lock {key} expired"
                        " and another node took it over; it finishes the migration"
                    )
                if on_batch is not None:  # a pause here is what the epoch fence is for
                    await on_batch(moved + kept)
                new = await _copy(client, layout, epochs, cast("dict[bytes, bytes]", found))
                await client.hdel(layout.single_node_tasks, *found)
                moved += new
                kept += len(found) - new
            if cursor == 0:
                break
        # HSCAN returns what was there throughout the scan; a record it
        # skipped (the hash rehashing) is found by the next pass.
        if not await client.exists(layout.single_node_tasks):
            return moved, kept


async def _copy(
    client: Client, layout: Layout, epochs: dict[int, bytes], found: dict[bytes, bytes]
) -> int:
    """HSETNX every record into its partition, one script per partition; how many were new."""
    shares: dict[int, list[bytes]] = {}
    for task_id, record in found.items():
        p = partition_of(task_id.decode("utf-8"), layout.partitions)  # ids are UTF-8
        shares.setdefault(p, []).extend((task_id, record))
    pipe = client.pipeline(transaction=False)
    for p, pairs in shares.items():
        keys = layout.partition(p)
        pipe.eval(COPY_SCRIPT, 2, keys.epoch, keys.tasks, epochs[p], *pairs)
    replies = await pipe.execute(raise_on_error=False)
    for p, reply in zip(shares, replies, strict=True):
        if isinstance(reply, ResponseError):
            if "MIGRATION_FENCED" in str(reply):
                raise MigrationError(
                    f"migration of {layout.single_node_tasks}: partition {p} was acquired"
                    f" meanwhile ({reply}); the node holding the lock finishes the migration"
                )
            raise reply
    return sum(cast("int", reply) for reply in replies)


def _text(value: bytes | str | None) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value or "")
