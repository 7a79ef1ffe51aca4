"""Migrating a single-node keyspace into partitions (delaywheel/store/redis/migrate.py)
against real redis-servers: written by today's store, moved, re-run, killed
with -9 mid-way and re-run, two nodes at once, a late migrator fenced by an
acquired epoch, and on Redis Cluster."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis
from conftest import RedisCluster, RedisServer
from helpers import run

from delaywheel.store.redis.client import Client, close_quietly, connect
from delaywheel.store.redis.layout import Layout, PartitionsError, partition_of
from delaywheel.store.redis.migrate import Migrated, MigrationError, lock_key, migrate

REPO = Path(__file__).resolve().parents[1]


def records(count: int) -> dict[str, bytes]:
    # Binary records and non-ASCII ids: bytes must move untouched.
    return {f"task-{i}-é": bytes([i % 256, 0, 255]) + str(i).encode() for i in range(count)}


async def write_single_node(url: str, tasks: dict[str, bytes]) -> None:
    """Write ``tasks`` the way the single-node release did: in one hash."""
    async with client_for(url) as client:
        await client.hset(Layout("delaywheel", 1).single_node_tasks, mapping=dict(tasks))


@contextlib.asynccontextmanager
async def client_for(url: str) -> AsyncIterator[Client]:
    client = await connect(url, connect_timeout_s=2.0, timeout_s=5.0)
    try:
        yield client
    finally:
        await close_quietly(client)


async def partitioned(client: Client, layout: Layout) -> dict[str, tuple[int, bytes]]:
    """Every record in the partition hashes: id -> (partition, record)."""
    found: dict[str, tuple[int, bytes]] = {}
    for keys in layout:
        for task_id, record in (await client.hgetall(keys.tasks)).items():
            name = task_id.decode("utf-8")
            assert name not in found, f"{name!r} in two partitions"
            found[name] = (keys.partition, record)
    return found


def assert_moved(found: dict[str, tuple[int, bytes]], tasks: dict[str, bytes], p: int) -> None:
    assert {task_id: record for task_id, (_, record) in found.items()} == tasks
    for task_id, (partition, _) in found.items():
        assert partition == partition_of(task_id, p), task_id


def test_a_single_node_keyspace_moves_into_its_partitions(redis_url: str) -> None:
    tasks = records(2500)
    layout = Layout("delaywheel", 16)

    async def scenario() -> None:
        await write_single_node(redis_url, tasks)
        async with client_for(redis_url) as client:
            seen: list[int] = []

            async def progress(done: int) -> None:
                seen.append(done)

            result = await migrate(client, layout, node="n1", batch=300, on_batch=progress)
            assert result is not None
            assert (result.moved, result.kept, result.waited) == (2500, 0, False)
            assert len(seen) >= 2500 // 300 and seen == sorted(seen) and seen[0] == 0
            assert not await client.exists(layout.single_node_tasks, lock_key(layout))
            assert await client.hget(layout.meta, "partitions") == b"16"
            assert_moved(await partitioned(client, layout), tasks, 16)
            # Idempotent: a second start finds nothing to move.
            assert await migrate(client, layout) is None
            assert_moved(await partitioned(client, layout), tasks, 16)

    run(scenario)


def test_an_empty_or_fresh_keyspace_has_nothing_to_move(redis_url: str) -> None:
    async def scenario() -> None:
        async with client_for(redis_url) as client:
            assert await migrate(client, Layout("delaywheel", 4)) is None
            assert await client.dbsize() == 0  # not even the meta key: nothing was touched

    run(scenario)


def test_a_copy_interrupted_before_its_delete_is_finished(redis_url: str) -> None:
    """A crash between HSETNX and HDEL leaves records in both places: kept once."""
    tasks = records(400)
    layout = Layout("delaywheel", 8)

    async def scenario() -> Migrated | None:
        await write_single_node(redis_url, tasks)
        async with client_for(redis_url) as client:
            for task_id in list(tasks)[:150]:  # copied, not yet deleted
                await client.hset(layout.of(task_id).tasks, task_id, tasks[task_id])
            result = await migrate(client, layout, batch=64)
            assert_moved(await partitioned(client, layout), tasks, 8)
            assert not await client.exists(layout.single_node_tasks)
            return result

    result = run(scenario)
    assert result is not None and (result.moved, result.kept) == (250, 150)


def test_another_partition_count_is_refused_and_nothing_moves(redis_url: str) -> None:
    async def scenario() -> None:
        await write_single_node(redis_url, records(10))
        async with client_for(redis_url) as client:
            await client.hset("{delaywheel}:meta", "partitions", 8)
            with pytest.raises(PartitionsError, match=r"has 8 partitions .* not 16"):
                await migrate(client, Layout("delaywheel", 16))
            assert await client.hlen("{delaywheel}:tasks") == 10
            assert not await client.exists(lock_key(Layout("delaywheel", 16)))

    run(scenario)


def test_two_nodes_starting_together_migrate_once(redis_url: str) -> None:
    tasks = records(3000)
    layout = Layout("delaywheel", 16)

    async def scenario() -> list[Migrated | None]:
        await write_single_node(redis_url, tasks)
        async with client_for(redis_url) as c0, client_for(redis_url) as c1:
            clients = [c0, c1]
            results = await asyncio.gather(
                *(migrate(c, layout, node=f"n{i}", batch=100) for i, c in enumerate(clients))
            )
            assert_moved(await partitioned(clients[0], layout), tasks, 16)
            return results

    results = run(scenario)
    assert all(r is not None for r in results)
    movers = [r for r in results if r is not None and r.total]
    waiters = [r for r in results if r is not None and r.waited and not r.total]
    assert len(movers) == 1 and movers[0].total == 3000 and len(waiters) == 1


def test_a_late_migrator_cannot_bring_back_a_task_deleted_after_takeover(
    redis_url: str,
) -> None:
    """A pauses mid-batch, its lock expires, B migrates everything, a node acquires
    a partition and deletes a task there; A's resumed copy is fenced by the epoch."""
    tasks = records(50)
    layout = Layout("delaywheel", 4)
    victim = "task-7-é"
    keys = layout.of(victim)

    async def scenario() -> None:
        await write_single_node(redis_url, tasks)
        paused, resume = asyncio.Event(), asyncio.Event()

        async def pause(done: int) -> None:
            paused.set()
            await resume.wait()

        async with client_for(redis_url) as a, client_for(redis_url) as b:
            late = asyncio.create_task(migrate(a, layout, node="a", lock_ms=300, on_batch=pause))
            await paused.wait()
            result = await migrate(b, layout, node="b")  # waits out A's lock, then moves all
            assert result is not None and result.total == 50 and result.waited
            await b.incr(keys.epoch)  # a node acquires the victim's partition ...
            await b.hdel(keys.tasks, victim)  # ... and the task is deleted
            resume.set()
            with pytest.raises(MigrationError, match=f"partition {keys.partition} was acquired"):
                await late
            assert not await b.hexists(keys.tasks, victim)
            del tasks[victim]
            assert_moved(await partitioned(b, layout), tasks, 4)

    run(scenario)


CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from delaywheel.store.redis.migrate import migrate
    from delaywheel.store.redis.layout import Layout
    from delaywheel.store.redis.client import connect

    async def main():
        client = await connect(sys.argv[1], connect_timeout_s=2, timeout_s=5)
        async def slowly(done):
            print(done, flush=True)
            await asyncio.sleep(0.02)
        await migrate(client, Layout("delaywheel", 16), node="child", batch=50,
                      lock_ms=1500, on_batch=slowly)
        print("finished", flush=True)

    asyncio.run(main())
    """
)


@pytest.mark.process
def test_kill_9_mid_migration_then_a_restart_completes(
    redis_url: str, redis_server: RedisServer
) -> None:
    tasks = records(4000)
    layout = Layout("delaywheel", 16)
    run(lambda: write_single_node(redis_url, tasks))
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, redis_url],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert child.stdout is not None
    try:
        for line in child.stdout:  # progress: records moved so far, before each batch
            if line.strip() != "finished" and int(line) >= 1000:
                break
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
    db = int(redis_url.rsplit("/", 1)[1])
    with redis_server.client(db) as admin:
        left = admin.hlen(layout.single_node_tasks)
        assert 0 < left <= 3000, "the kill came mid-way"
        assert admin.exists(lock_key(layout)), "the dead migrator's lock is still there"

    async def restart() -> Migrated | None:
        async with client_for(redis_url) as client:
            started_s = time.monotonic()
            result = await migrate(client, layout, node="restarted")
            assert time.monotonic() - started_s < 10  # the dead lock (1.5 s) expired
            assert_moved(await partitioned(client, layout), tasks, 16)
            assert not await client.exists(layout.single_node_tasks, lock_key(layout))
            return result

    result = run(restart)
    assert result is not None and result.waited
    assert 0 < result.total <= left  # what the child had not deleted; some maybe copied


def test_migrates_on_redis_cluster(redis_cluster: RedisCluster) -> None:
    redis_cluster.flush()
    url = redis_cluster.nodes[0].url
    tasks = records(2000)
    layout = Layout("delaywheel", 16)

    async def scenario() -> Migrated | None:
        await write_single_node(url, tasks)
        async with client_for(url) as client:
            assert isinstance(client, redis.asyncio.RedisCluster)
            result = await migrate(client, layout, batch=250)
            assert_moved(await partitioned(client, layout), tasks, 16)
            assert not await client.exists(layout.single_node_tasks)
            return result

    result = run(scenario)
    assert result is not None and result.moved == 2000
    # The partitions really are spread over the cluster's primaries.
    holders = {redis_cluster.owner_of(keys.tasks).port for keys in layout}
    assert len(holders) == 3
