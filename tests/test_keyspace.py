"""The Redis store's writes for a node on a plain Redis (store/redis/store.py): one
change (the one-request flush, packed by hand) and a grouped batch, written
with the epoch held, refused for a partition another node took or this node
dropped, and unknown for one dropped while its write was in flight."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from conftest import RedisServer, db_of
from delaywheel_client import Client
from delaywheel_client.errors import Moved, TryAgain
from helpers import run
from owners import RecordingOwner
from serverproc import ServerProcess
from waiting import wait_until

from delaywheel.store.base import Changes, StoreError, StoreUnavailable
from delaywheel.store.redis import FencedWrite, Holder, Holders, RedisStore
from delaywheel.store.redis.layout import partition_of

pytestmark = [pytest.mark.redis]

PARTITIONS = 4


def ids_in(partition: int, count: int) -> list[str]:
    found = (f"task-{n}" for n in range(10_000))
    return [task_id for task_id in found if partition_of(task_id, PARTITIONS) == partition][:count]


def tasks_key(partition: int) -> str:
    return f"{{delaywheel:p{partition:03d}}}:tasks"


# on_fenced's calls: (fenced, holders)
Told = list[tuple[set[int], Holders]]


def scenario_on(redis_url: str, body: Callable[[RedisStore, Told], Awaitable[None]]) -> None:
    """Run ``body`` on an open keyspace holding epoch 1 of every partition
    (set in Redis and in ``epochs``), with the coordinator's ``on_fenced``
    calls gathered in its second argument."""

    async def scenario() -> None:
        owner = RecordingOwner()
        shared = RedisStore(redis_url, partitions=PARTITIONS, owner=owner)
        await shared.open()
        try:
            for p in range(PARTITIONS):
                await shared.client.set(f"{{delaywheel:p{p:03d}}}:epoch", 1)
                shared.epochs[p] = 1
            await body(shared, owner.fenced_calls)
        finally:
            await shared.close()

    run(scenario)


async def write(shared: RedisStore, changes: Changes) -> StoreError | None:
    done: asyncio.Future[StoreError | None] = asyncio.get_running_loop().create_future()
    shared.submit(changes, done.set_result)
    return await done


def test_one_change_and_a_batch_land_with_the_epoch_held(
    redis_url: str, redis_server: RedisServer
) -> None:
    one, other = ids_in(1, 1)[0], ids_in(2, 2)

    async def body(shared: RedisStore, told: Told) -> None:
        assert await write(shared, {one: b"r1"}) is None
        assert await write(shared, {other[0]: b"a", other[1]: b"b", one: None}) is None
        assert await write(shared, {other[0]: None}) is None
        assert told == []

    scenario_on(redis_url, body)
    with redis_server.client(db_of(redis_url)) as client:
        assert client.hgetall(tasks_key(1)) == {}
        assert client.hgetall(tasks_key(2)) == {other[1].encode(): b"b"}


def test_one_change_for_a_partition_taken_or_dropped_is_refused_and_writes_nothing(
    redis_url: str, redis_server: RedisServer
) -> None:
    taken, dropped = ids_in(0, 1)[0], ids_in(3, 1)[0]

    async def body(shared: RedisStore, told: Told) -> None:
        await shared.client.set("{delaywheel:p000}:epoch", 2)  # another node acquired it
        error = await write(shared, {taken: b"late"})
        assert isinstance(error, FencedWrite)
        assert (error.fenced, error.written) == ({0}, set())
        # No lease to name (it expired too): moved, to no owner yet.
        assert error.reply_code == "moved"
        assert error.reply_data == {"partition": 0, "owner": None, "epoch": None}
        del shared.epochs[3]  # self-fenced: refused here, without a round trip
        error = await write(shared, {dropped: b"late"})
        assert isinstance(error, FencedWrite) and error.fenced == {3}
        assert told == [({0}, {}), ({3}, {})]

    scenario_on(redis_url, body)
    with redis_server.client(db_of(redis_url)) as client:
        assert client.exists(tasks_key(0), tasks_key(3)) == 0


def test_one_change_whose_partition_is_dropped_in_flight_is_of_unknown_outcome(
    redis_url: str,
) -> None:
    task_id = ids_in(2, 1)[0]

    async def body(shared: RedisStore, told: Told) -> None:
        done: asyncio.Future[StoreError | None] = asyncio.get_running_loop().create_future()
        shared.submit({task_id: b"r"}, done.set_result)
        del shared.epochs[2]  # self-fenced while the write is out
        error = await done
        assert isinstance(error, StoreUnavailable)
        assert "lost while its write was in flight: outcome unknown" in str(error)
        assert told == []

    scenario_on(redis_url, body)


def test_a_refused_write_is_answered_moved_to_the_holder_the_store_names(
    redis_url: str, redis_server: RedisServer
) -> None:
    # The refusing script reads the partition's lease: the deposed node's
    # requests are told where to go, as any moved answer (docs/protocol.md).
    one, many = ids_in(0, 1)[0], ids_in(2, 3)

    async def body(shared: RedisStore, told: Told) -> None:
        await shared.client.set("{delaywheel:p000}:epoch", 2)
        await shared.client.set("{delaywheel:p000}:lease", "2 node-b 10.0.0.2:7001", px=60_000)
        error = await write(shared, {one: b"late"})  # one change: the hand-packed flush
        assert isinstance(error, FencedWrite)
        assert error.reply_data == {"partition": 0, "owner": "10.0.0.2:7001", "epoch": 2}
        await shared.client.set("{delaywheel:p002}:epoch", 7)
        await shared.client.set("{delaywheel:p002}:lease", "7 node-c [::1]:7002", px=60_000)
        error = await write(shared, dict.fromkeys(many, b"late"))  # a batch of three
        assert isinstance(error, FencedWrite)
        assert error.reply_data == {"partition": 2, "owner": "[::1]:7002", "epoch": 7}
        assert told == [
            ({0}, {0: Holder("node-b", "10.0.0.2:7001", 2, 0)}),
            ({2}, {2: Holder("node-c", "[::1]:7002", 7, 0)}),
        ]

    scenario_on(redis_url, body)
    with redis_server.client(db_of(redis_url)) as client:
        assert client.exists(tasks_key(0), tasks_key(2)) == 0


def test_a_store_opened_alone_writes_every_partition_until_a_node_takes_one(
    redis_url: str, redis_server: RedisServer
) -> None:
    """No owner (a tool, the bench): the store takes every partition at the epoch
    Redis holds, 0 where none was ever held, without a lease; a node that
    acquires one afterwards bumps its epoch, and the store's next write of it
    is refused, not written behind the node's back (store/redis/owner.py)."""
    with redis_server.client(db_of(redis_url)) as client:
        client.set("{delaywheel:p001}:epoch", 7)  # held before, by a node now gone
    taken, other = ids_in(1, 1)[0], ids_in(2, 1)[0]

    async def scenario() -> None:
        async with RedisStore(redis_url, partitions=PARTITIONS) as store:
            assert store.epochs == {0: 0, 1: 7, 2: 0, 3: 0}
            assert await write(store, {taken: b"a", other: b"b"}) is None
            await store.client.incr("{delaywheel:p001}:epoch")  # a node acquired it
            error = await write(store, {taken: b"late"})
            assert isinstance(error, FencedWrite) and error.fenced == {1}
            assert await write(store, {other: None}) is None  # the others go on
            assert await store.client.exists("{delaywheel:p001}:lease") == 0  # no lease taken

    run(scenario)
    with redis_server.client(db_of(redis_url)) as client:
        assert client.hgetall(tasks_key(1)) == {taken.encode(): b"a"}
        assert client.hgetall(tasks_key(2)) == {}


@pytest.mark.process
def test_a_refused_partition_answers_moved_about_itself_and_the_others_their_results(
    redis_url: str, redis_server: RedisServer
) -> None:
    """Issue 29: every reply is about the request's own partition. A pipeline of
    adds over every partition, one of which another node took meanwhile: its
    adds are answered ``moved`` naming it, each other add with its result, in
    order (before the journal's lanes, the whole flush was refused, every add
    answered ``moved`` naming the refused partition)."""
    partitions = 16
    node = ServerProcess(
        *("--node", "a", "--partitions", str(partitions), "--lease", "3"), store=redis_url
    )
    try:
        with Client(*node.address) as dw:
            wait_until(lambda: len(dw.stats()["partitions"]) == partitions, 20, "all served")
            taken = 5
            with redis_server.client(db_of(redis_url)) as client:
                client.incr(f"{{delaywheel:p{taken:03d}}}:epoch")  # another node acquired it
            ids = [f"lane-{n}" for n in range(200)]
            pipe = dw.pipeline()
            for task_id in ids:
                pipe.add("t", {}, id=task_id, delay=3600)
            results = pipe.execute(raise_on_error=False)
        for task_id, result in zip(ids, results, strict=True):
            p = partition_of(task_id, partitions)
            if p == taken:
                assert isinstance(result, Moved | TryAgain), result  # tryagain: dropped by then
                assert result.data["partition"] == taken, result
            else:
                assert isinstance(result, dict) and result["id"] == task_id, (p, result)
        with redis_server.client(db_of(redis_url)) as client:
            stored = {
                task_id
                for p in range(partitions)
                for task_id in (f.decode() for f in client.hkeys(tasks_key(p)))
            }
        assert stored == {i for i in ids if partition_of(i, partitions) != taken}
    finally:
        node.kill()
