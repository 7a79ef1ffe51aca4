"""One round trip per journal flush (issue 16: "Every journal flush is one
script per partition that checks the epoch and writes. It is still one round
trip per flush, pipelined as today"), counted by a private redis-server.

The keyspace's flushes are driven as the journal drives them, one ``submit``
per batch (engine/journal.py), and Redis counts what they cost: per command
(INFO commandstats) and per read of a request from a socket
(``total_reads_processed``, INFO stats). A flush of B partitions must be B
EVALSHAs and nothing else: no GET of the epoch (the script checks it), no
WAIT with ``--replicas 0``. With ``--replicas 1`` one WAIT follows them, in
the same write: the primary reads each flush once, in one read, whatever it
holds.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import RedisServer, primary_with_replica
from owners import RecordingOwner

from delaywheel.store.base import Changes, StoreError
from delaywheel.store.redis import RedisStore

pytestmark = pytest.mark.redis

PARTITIONS = 4
EPOCH = 1
# Flushes of 1 to PARTITIONS partitions, of one change (the per-request path,
# submit_one) to 150 changes: (partitions touched, changes).
BATCHES = [(1, 1), (1, 5), (2, 2), (3, 30), (4, 4), (4, 150), (2, 40), (1, 1), (3, 3), (4, 60)]


def _ids(partition: int, count: int, start: int) -> list[str]:
    """``count`` task ids of ``partition`` (zlib.crc32 % P, the protocol's hash)."""
    found: list[str] = []
    n = start
    while len(found) < count:
        task_id = f"t{n}"
        if zlib.crc32(task_id.encode()) % PARTITIONS == partition:
            found.append(task_id)
        n += 1
    return found


def _batches() -> list[Changes]:
    """BATCHES as changes: puts, spread over the partitions each names."""
    made: list[Changes] = []
    start = 0
    for touched, changes in BATCHES:
        batch: Changes = {}
        for i in range(changes):
            partition = i % touched
            (task_id,) = _ids(partition, 1, start)
            start = int(task_id[1:]) + 1
            batch[task_id] = b"record of " + task_id.encode()
        assert len(batch) == changes
        made.append(batch)
    return made


def _counts(client: redis.Redis) -> dict[str, int]:
    """Redis's counters: each command's calls, and the reads of requests. One
    INFO on one connection: a look costs the same each time."""
    info = client.info("stats", "commandstats")
    counts = {
        name.removeprefix("cmdstat_"): int(value["calls"])
        for name, value in info.items()
        if name.startswith("cmdstat_")
    }
    counts["reads"] = int(info["total_reads_processed"])
    return counts


def _spent(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {
        k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)
    }


async def _flush_all(server: RedisServer, replicas: int) -> tuple[dict[str, int], dict[str, int]]:
    """Flush BATCHES one at a time; Redis's counters spent by them, and by a
    look at the counters alone (what to take off)."""
    keyspace = RedisStore(
        server.url, partitions=PARTITIONS, replicas=replicas, owner=RecordingOwner()
    )
    await keyspace.open()
    try:
        with server.client() as client:
            for keys in keyspace.layout:
                client.set(keys.epoch, EPOCH)
        keyspace.epochs.update({p: EPOCH for p in range(PARTITIONS)})
        await _submit(keyspace, {"warm-up": b"connects and loads the script"})
        with server.client() as client:
            looked = _spent(_counts(client), _counts(client))  # a look's own cost
            before = _counts(client)
            for batch in _batches():
                await _submit(keyspace, batch)
            after = _counts(client)
        return _spent(before, after), looked
    finally:
        await keyspace.close()


async def _submit(keyspace: RedisStore, changes: Changes) -> None:
    done: asyncio.Future[StoreError | None] = asyncio.get_running_loop().create_future()
    keyspace.submit(changes, done.set_result)
    error = await done
    assert error is None, error


def _less(spent: dict[str, int], looked: dict[str, int], *also: str) -> dict[str, Any]:
    """``spent`` without what looking at the counters costs, nor ``also``."""
    left = {k: v - looked.get(k, 0) for k, v in spent.items() if k not in also}
    return {k: v for k, v in left.items() if v}


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.kill()


def test_each_flush_is_one_evalsha_per_partition_in_one_round_trip(own_redis: RedisServer) -> None:
    spent, looked = asyncio.run(_flush_all(own_redis, replicas=0))
    flushes = len(BATCHES)
    scripts = sum(touched for touched, _ in BATCHES)
    # Nothing but the scripts and their own GET of the epoch and HSET (Redis
    # counts the commands a script calls too): no GET of the node's own, no
    # WAIT, no MULTI; and each flush read by Redis at once: one round trip.
    want = {"evalsha": scripts, "get": scripts, "hset": scripts, "reads": flushes}
    assert _less(spent, looked) == want, (spent, looked)


def test_with_replicas_the_wait_goes_in_the_same_write(tmp_path: Path) -> None:
    with primary_with_replica(tmp_path) as (primary, _replica):
        spent, looked = asyncio.run(_flush_all(primary, replicas=1))
    flushes = len(BATCHES)
    scripts = sum(touched for touched, _ in BATCHES)
    # The replica's own traffic to the primary: its acknowledgements
    # (REPLCONF ACK), each one read, and nothing this node sent.
    acks = spent.get("replconf", 0)
    left = _less(spent, looked, "replconf")
    want = {"evalsha": scripts, "get": scripts, "hset": scripts, "wait": flushes}
    assert left == {**want, "reads": flushes + acks}, (spent, looked)
