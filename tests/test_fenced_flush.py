"""The fenced journal flush (store/redis/fenced.py) against real redis-servers: the
epoch check at the store, big batches, a flushed script cache, and WAIT on the
same connection against a real replica and against none."""

from __future__ import annotations

import asyncio
import gc
import time
from pathlib import Path

import pytest
import redis
from conftest import RedisCluster, RedisServer, db_of, primary_with_replica
from helpers import run

from delaywheel.store import open_store
from delaywheel.store.base import Changes
from delaywheel.store.redis import RedisStore
from delaywheel.store.redis.fenced import (
    FencedWriter,
    FlushOutcome,
    PartitionWrite,
    TooFewReplicas,
    fenced_flush,
)
from delaywheel.store.redis.link import JournalLink


def part(p: int, epoch: int, changes: Changes) -> PartitionWrite:
    tag = f"{{delaywheel:p{p:03d}}}"
    return PartitionWrite(p, epoch, f"{tag}:epoch", f"{tag}:tasks", f"{tag}:lease", changes)


async def flush(writer: FencedWriter, *writes: PartitionWrite) -> FlushOutcome:
    finished: asyncio.Future[FlushOutcome] = asyncio.get_running_loop().create_future()
    writer.submit(writes, lambda _writes, outcome: finished.set_result(outcome))
    return await finished


def writer_of(store: object, *, replicas: int = 0, wait_timeout_s: float = 1.0) -> FencedWriter:
    """A fenced writer of its own on the store's Redis, as the store makes its own."""
    assert isinstance(store, RedisStore)
    writer = store.topology.writer(
        replicas=replicas, wait_timeout_s=wait_timeout_s, held=lambda _p, _e: True
    )
    assert isinstance(writer, FencedWriter)  # plain Redis: one link
    return writer


def test_a_write_with_the_current_epoch_lands(redis_url: str, redis_server: RedisServer) -> None:
    with redis_server.client(db_of(redis_url)) as client:
        client.set("{delaywheel:p003}:epoch", 3)

    async def scenario() -> None:
        async with open_store(redis_url) as store:
            writer = writer_of(store)
            outcome = await flush(writer, part(3, 3, {"a": b"1", "b": b"2", "c": b"3"}))
            assert outcome == FlushOutcome(written=[3])
            outcome = await flush(writer, part(3, 3, {"a": None, "b": b"two"}))
            assert outcome.error is None and outcome.written == [3]
            # A flush whose done held it (and it its done) was cyclic garbage, its
            # batch hanging off it: the collector's work on every add
            # (docs/performance.md). Finished flushes leave nothing to collect.
            gc.collect()
            gc.disable()
            try:
                for i in range(50):
                    assert (await flush(writer, part(3, 3, {f"t{i}": None}))).written == [3]
                assert gc.collect() == 0
            finally:
                gc.enable()
            await writer.close()

    run(scenario)
    with redis_server.client(db_of(redis_url)) as client:
        assert client.hgetall("{delaywheel:p003}:tasks") == {b"b": b"two", b"c": b"3"}


def test_a_write_with_an_old_epoch_is_refused_and_writes_nothing(
    redis_url: str, redis_server: RedisServer
) -> None:
    with redis_server.client(db_of(redis_url)) as client:
        client.set("{delaywheel:p001}:epoch", 5)
        client.set("{delaywheel:p001}:lease", "5 node-b 10.0.0.2:7001", px=60_000)
        client.set("{delaywheel:p002}:epoch", 2)
        client.hset("{delaywheel:p001}:tasks", "kept", b"old")

    async def scenario() -> FlushOutcome:
        # Four partitions: p007's keys are none of the store's (it would take them at 0).
        async with open_store(redis_url, partitions=4) as store:
            writer = writer_of(store)
            outcome = await flush(
                writer,
                part(1, 4, {"kept": None, "new": b"x"}),  # deposed: epoch 5 is someone else's
                part(2, 2, {"mine": b"y"}),  # current
                part(7, 1, {"nobody": b"z"}),  # never acquired
            )
            await writer.close()
            return outcome

    outcome = run(scenario)
    assert outcome.error is None
    assert outcome.written == [2]
    assert sorted(outcome.fenced) == [1, 7]
    assert "{delaywheel:p001}:epoch is 5, not 4" in str(outcome.fenced[1])
    # The refusal names who holds the lease now (for the moved answer), if anyone.
    assert "the lease is '5 node-b 10.0.0.2:7001'" in str(outcome.fenced[1])
    assert outcome.fenced[1].lease == "5 node-b 10.0.0.2:7001"
    assert "is unset, not 1; the lease is free" in str(outcome.fenced[7])
    assert outcome.fenced[7].lease is None
    with redis_server.client(db_of(redis_url)) as client:
        assert client.hgetall("{delaywheel:p001}:tasks") == {b"kept": b"old"}
        assert client.hgetall("{delaywheel:p002}:tasks") == {b"mine": b"y"}
        assert client.exists("{delaywheel:p007}:tasks") == 0


def test_one_change_packed_by_hand_lands_and_an_old_epoch_is_refused(
    redis_url: str, redis_server: RedisServer
) -> None:
    """``submit_one`` packs its EVALSHA itself: ids of any UTF-8, records of any
    bytes; a written change answers None, anything else an outcome."""
    with redis_server.client(db_of(redis_url)) as client:
        client.set("{delaywheel:p003}:epoch", 3)
        client.hset("{delaywheel:p003}:tasks", "gone", b"old")
    keys = ("{delaywheel:p003}:epoch", "{delaywheel:p003}:tasks", "{delaywheel:p003}:lease")
    record = b"\r\n$5\r\n\x00\xff" + "é".encode() * 40

    async def one(writer: FencedWriter, epoch: int, task_id: str, value: bytes | None) -> object:
        answered: asyncio.Future[FlushOutcome | None] = asyncio.get_running_loop().create_future()
        writer.submit_one(3, epoch, keys, task_id, value, answered.set_result)
        return await answered

    async def scenario() -> None:
        async with open_store(redis_url) as store:
            writer = writer_of(store)
            assert await one(writer, 3, "tâche-ü:1", record) is None
            assert await one(writer, 3, "gone", None) is None
            refused = await one(writer, 2, "late", b"x")  # deposed: epoch 3 is someone else's
            assert isinstance(refused, FlushOutcome) and refused.error is None
            assert refused.written == [] and list(refused.fenced) == [3]
            assert "{delaywheel:p003}:epoch is 3, not 2" in str(refused.fenced[3])
            gc.collect()
            gc.disable()
            try:  # nothing cyclic left behind per flush, as for submit
                for i in range(50):
                    assert await one(writer, 3, f"t{i}", None) is None
                assert gc.collect() == 0
            finally:
                gc.enable()
            await writer.close()
            # With WAIT asked for, the same call goes the way of submit.
            waiting = writer_of(store, replicas=1, wait_timeout_s=0.05)
            outcome = await one(waiting, 3, "waited", b"w")
            assert isinstance(outcome, FlushOutcome) and outcome.written == [3]
            assert isinstance(outcome.error, TooFewReplicas)
            await waiting.close()

    run(scenario)
    with redis_server.client(db_of(redis_url)) as client:
        assert client.hgetall("{delaywheel:p003}:tasks") == {
            "tâche-ü:1".encode(): record,
            b"waited": b"w",
        }


def test_big_batches_and_a_flushed_script_cache(redis_url: str, redis_server: RedisServer) -> None:
    with redis_server.client(db_of(redis_url)) as client:
        client.set("{delaywheel:p000}:epoch", 1)
    puts: Changes = {f"t{n}": b"r" * 50 for n in range(5000)}

    async def scenario() -> None:
        async with open_store(redis_url) as store:
            writer = writer_of(store)
            assert (await flush(writer, part(0, 1, puts))).written == [0]
            with redis_server.client() as admin:
                admin.script_flush()  # the link's next EVALSHA meets NOSCRIPT
                noscripts = noscript_errors(admin)
            removes: Changes = {f"t{n}": None for n in range(2500)}
            outcome = await flush(writer, part(0, 1, {**removes, "extra": b"e"}))
            assert outcome == FlushOutcome(written=[0])
            with redis_server.client() as admin:
                assert noscript_errors(admin) == noscripts + 1  # met, then reloaded
            await writer.close()

    run(scenario)
    with redis_server.client(db_of(redis_url)) as client:
        assert client.hlen("{delaywheel:p000}:tasks") == 2501
        assert client.hexists("{delaywheel:p000}:tasks", "t4999")
        assert not client.hexists("{delaywheel:p000}:tasks", "t0")


def noscript_errors(admin: redis.Redis) -> int:
    return int(admin.info("errorstats").get("errorstat_NOSCRIPT", {}).get("count", 0))


def test_bad_wait_settings_are_named() -> None:
    with pytest.raises(ValueError, match="replicas -1"):
        fenced_flush([], replicas=-1)
    with pytest.raises(ValueError, match="wait 0 ms"):
        fenced_flush([], replicas=1, wait_timeout_ms=0)


def test_wait_with_no_replica_times_out_and_says_so(
    redis_url: str, redis_server: RedisServer
) -> None:
    with redis_server.client(db_of(redis_url)) as client:
        client.set("{delaywheel:p004}:epoch", 1)

    async def scenario() -> tuple[FlushOutcome, float]:
        async with open_store(redis_url) as store:
            writer = writer_of(store, replicas=1, wait_timeout_s=0.2)
            started_s = time.monotonic()
            outcome = await flush(writer, part(4, 1, {"a": b"1"}))
            took_s = time.monotonic() - started_s
            await writer.close()
            return outcome, took_s

    outcome, took_s = run(scenario)
    assert isinstance(outcome.error, TooFewReplicas)
    assert "WAIT 1: 0 replica(s) confirmed in time" in str(outcome.error)
    assert outcome.replicas == 0
    assert outcome.written == [4]  # on the primary, but not known to survive a failover
    assert took_s >= 0.15  # WAIT waited for its timeout (no upper bound asserted)


@pytest.mark.redis
def test_wait_one_is_confirmed_by_a_real_replica(tmp_path: Path) -> None:
    with primary_with_replica(tmp_path) as (primary, replica):
        with primary.client() as client:
            client.set("{delaywheel:p009}:epoch", 2)

        async def scenario() -> FlushOutcome:
            async with open_store(primary.url) as store:
                writer = writer_of(store, replicas=1, wait_timeout_s=5.0)
                outcome = await flush(writer, part(9, 2, {"a": b"1", "b": b"2"}))
                await writer.close()
                return outcome

        outcome = run(scenario)
        assert outcome == FlushOutcome(written=[9], replicas=1)
        with replica.client() as client:  # WAIT said so: the replica has it already
            assert client.hgetall("{delaywheel:p009}:tasks") == {b"a": b"1", b"b": b"2"}


def test_fenced_flushes_are_legal_on_redis_cluster(redis_cluster: RedisCluster) -> None:
    """One partition per flush, sent to any node: each follows MOVED to the
    node of its slot, whose connection loads the script first; no CROSSSLOT."""
    redis_cluster.flush()
    with redis.RedisCluster(host="127.0.0.1", port=redis_cluster.nodes[0].port) as admin:
        for p in range(16):
            admin.set(f"{{delaywheel:p{p:03d}}}:epoch", 1)

        async def scenario() -> list[FlushOutcome]:
            first = redis_cluster.nodes[0]
            link = JournalLink("127.0.0.1", first.port, handshake=FencedWriter.handshake())
            writer = FencedWriter(link)
            outcomes = [await flush(writer, part(p, 1, {f"t{p}": b"r"})) for p in range(16)]
            outcomes.append(await flush(writer, part(3, 0, {"stale": b"x"})))
            await writer.close()
            return outcomes

        outcomes = run(scenario)
        assert [o.written for o in outcomes[:16]] == [[p] for p in range(16)]
        assert all(o.error is None and not o.fenced for o in outcomes[:16])
        assert list(outcomes[16].fenced) == [3]
        for p in range(16):
            assert admin.hget(f"{{delaywheel:p{p:03d}}}:tasks", f"t{p}") == b"r"
        assert not admin.hexists("{delaywheel:p003}:tasks", "stale")


def test_replicas_warning_counts_the_connected_replicas(redis_url: str, tmp_path: Path) -> None:
    from delaywheel.store.redis.client import connect, replicas_warning

    async def warnings(url: str, replicas: int) -> str | None:
        client = await connect(url, connect_timeout_s=2, timeout_s=5)
        try:
            return await replicas_warning(client, replicas)  # one server: no route
        finally:
            await client.aclose()

    assert run(lambda: warnings(redis_url, 0)) is None
    warned = run(lambda: warnings(redis_url, 1))
    assert warned is not None and "--replicas 1 but the Redis primary has 0 replica(s)" in warned
    with primary_with_replica(tmp_path) as (primary, _replica):
        assert run(lambda: warnings(primary.url, 1)) is None
        assert "--replicas 2 but the Redis primary has 1 replica(s)" in str(
            run(lambda: warnings(primary.url, 2))
        )
