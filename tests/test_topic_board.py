"""Topic settings on every node, in process: the partitions' ``topics`` hashes
(ha/topics.py) on a real Redis, and what an engine does with settings another
node holds (``topics_shared``): its share of the limits, a dead_retain that
re-times its dead tasks, and a partition handed back whose settings still
hold until their next holder publishes them."""

from __future__ import annotations

from typing import Any

from conftest import RedisCluster
from delaywheel_client.partitions import partition_of, settings_key
from helpers import run
from redis.asyncio import Redis
from redis.asyncio import RedisCluster as AsyncRedisCluster
from test_engine import T0, code_of
from test_engine import run as run_engine

from delaywheel.engine.engine import Engine
from delaywheel.engine.topics import TopicSettings, to_record
from delaywheel.ha.sharing import Owner, Sharing
from delaywheel.ha.topics import TopicBoard
from delaywheel.store.memory import MemoryStore
from delaywheel.store.redis.layout import Layout

LAYOUT = Layout("delaywheel", 4)
EVERY = [list(range(LAYOUT.partitions))]  # every partition read in one group
LIMITED = to_record(TopicSettings(rate=8.0, burst=4, concurrency=4, dead_retain=10.0))


async def publish_and_read(client: Any) -> None:
    board = TopicBoard(client, LAYOUT, "a", "h:1")
    await client.set("{delaywheel:p002}:epoch", 3)
    assert await board.read(EVERY) == ({}, set())
    assert await board.publish(2, 3, {}, {"x": b"1", "y": b"2"})
    assert await board.publish(0, 0, {}, {"z": b"3"}) is False  # no epoch: not ours
    assert await board.read(EVERY) == ({2: {"x": b"1", "y": b"2"}}, set())
    # What the hash holds and should not: gone; what changed: written.
    assert await board.publish(2, 3, {"x": b"1", "y": b"2"}, {"x": b"9"})
    assert await client.hgetall("{delaywheel:p002}:topics") == {b"x": b"9"}
    # Another node took the partition (a new epoch): a stale owner writes nothing.
    await client.set("{delaywheel:p002}:epoch", 4)
    assert not await board.publish(2, 3, {"x": b"9"}, {})
    assert await board.read(EVERY) == ({2: {"x": b"9"}}, set())


def test_a_publish_needs_the_partitions_epoch_and_writes_only_the_difference(
    redis_url: str,
) -> None:
    async def scenario() -> None:
        async with Redis.from_url(redis_url) as client:
            await publish_and_read(client)

    run(scenario)


def test_the_board_reads_and_publishes_on_a_redis_cluster(redis_cluster: RedisCluster) -> None:
    """Each partition's hash in its own slot: one pipeline reads them all across
    the primaries, and the publish script names one slot's keys."""
    redis_cluster.flush()

    async def scenario() -> None:
        client = AsyncRedisCluster(host="127.0.0.1", port=redis_cluster.nodes[0].port)
        try:
            await publish_and_read(client)
        finally:
            await client.aclose()

    run(scenario)


def two_of_four(node: str = "b") -> Sharing:
    """Node ``node`` serving partitions 0 and 1 of 4, node a the others."""
    sharing = Sharing(node=node, address="h:2", partitions=4, lease_s=10.0)
    for partition in (0, 1):
        sharing.serve(partition, 1)
    for partition in (2, 3):
        sharing.owners[partition] = Owner("a", "h:1", 1)
    return sharing


def topic_in(partitions: set[int]) -> str:
    return next(t for n in range(1000) if partition_of(settings_key(t := f"t{n}"), 4) in partitions)


def id_in(partitions: set[int]) -> str:
    return next(i for n in range(1000) if partition_of(i := f"id{n}", 4) in partitions)


def test_settings_held_elsewhere_apply_here_in_this_nodes_share() -> None:
    elsewhere, dies = topic_in({2, 3}), id_in({0, 1})  # the task served here

    async def scenario(engine: Engine, store: MemoryStore) -> None:
        engine.add({"id": dies, "topic": elsewhere, "max_attempts": 1}, T0)
        assert engine.try_reserve(elsewhere, T0) is not None
        engine.release(dies, 0, T0)  # dead at T0, kept for ever
        engine.topics_shared({elsewhere: LIMITED})
        # Half the partitions: half the rate, burst and concurrency.
        assert engine.flow.shares()[elsewhere] == {
            "paused_until": None,
            "rate": 4.0,
            "burst": 2,
            "concurrency": 2,
        }
        assert engine.topic_list(None, T0)["topics"] == []  # not held here
        assert code_of(lambda: engine.topic_get(elsewhere, T0)) == "moved"
        engine.advance(T0 + 9)
        assert engine.get(dies) is not None
        engine.advance(T0 + 10)  # the learned dead_retain re-timed it
        assert engine.get(dies) is None
        engine.topics_shared({})  # put back to the defaults where they are held
        assert engine.flow.shares() == {}

    run_engine(scenario, ownership=two_of_four())


def test_a_partition_handed_back_keeps_its_settings_applied_until_learned_again() -> None:
    here = topic_in({0})
    sharing = two_of_four()

    async def scenario(engine: Engine, store: MemoryStore) -> None:
        engine.topic_set(here, {"paused_until": T0 + 3600}, T0)
        await engine.journal.drain()
        assert engine.topic_records() == {here: to_record(TopicSettings(paused_until=T0 + 3600))}
        sharing.unserve(0)
        engine.drop_partitions({0})  # handed back: the record is not held here now
        assert engine.topic_records() == {}
        assert engine.flow.shares()[here]["paused_until"] == T0 + 3600  # still held back
        # What the next holder publishes, learned at this node's next round.
        engine.topics_shared({here: to_record(TopicSettings(rate=1.0))})
        assert engine.flow.shares()[here]["paused_until"] is None
        # One partition of four now: a quarter of the rate.
        assert engine.flow.shares()[here]["rate"] == 0.25

    run_engine(scenario, ownership=sharing)
