"""The Redis store's own write connection (store/redis/link.py), against real
redis-servers: pipelined writes in order, a Redis that stops answering, an
error reply, AUTH, and a Cluster slot that moves to another node. The store
has one partition here, so every record is in ``KEY``."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
import redis
from conftest import RedisCluster, RedisServer
from helpers import load_all, run

from delaywheel.store import StoreError, StoreUnavailable, open_store
from delaywheel.store.redis import RedisStore

KEY = "{delaywheel:p000}:tasks"
# The partition's other key that a write names (its lease key need not exist).
EPOCH_KEY = "{delaywheel:p000}:epoch"


def one_partition(url: str) -> RedisStore:
    return RedisStore(url, partitions=1)


def test_submitted_writes_apply_and_complete_in_order(redis_url: str) -> None:
    async def scenario() -> None:
        async with open_store(redis_url) as store:
            finished: list[int] = []
            errors: list[StoreError | None] = []
            all_done = asyncio.get_running_loop().create_future()

            def done(n: int, error: StoreError | None) -> None:
                finished.append(n)
                errors.append(error)
                if len(finished) == 300:
                    all_done.set_result(None)

            for n in range(300):  # none waits for the one before: all in flight at once
                changes = {"a": str(n).encode(), f"t{n}": b"x", f"t{n - 1}": None}
                store.submit(changes, lambda error, n=n: done(n, error))
            await all_done
            assert finished == list(range(300))
            assert errors == [None] * 300
            assert await load_all(store) == {"a": b"299", "t299": b"x"}

    run(scenario)


def test_a_redis_that_stops_answering_times_out_then_recovers(
    redis_server: RedisServer, redis_url: str
) -> None:
    assert redis_server.proc is not None
    pid = redis_server.proc.pid

    async def scenario() -> None:
        store = RedisStore(redis_url, partitions=1, timeout_s=0.3)
        async with store:
            await store.write({"before": b"1"})
            os.kill(pid, signal.SIGSTOP)
            try:
                started = time.monotonic()
                with pytest.raises(StoreUnavailable, match=r"no reply within 0.3 s"):
                    await store.write({"during": b"2"})
                assert time.monotonic() - started < 2
            finally:
                os.kill(pid, signal.SIGCONT)
            await store.write({"after": b"3"})  # on a new connection
            # "during" may or may not have landed (Redis ran it once it woke).
            records = await load_all(store)
            assert {"before", "after"} <= set(records) <= {"before", "during", "after"}

    try:
        run(scenario)
    finally:
        os.kill(pid, signal.SIGCONT)


def test_an_error_reply_fails_its_write_alone(redis_server: RedisServer, redis_url: str) -> None:
    db = int(redis_url.rsplit("/", 1)[1])

    async def scenario() -> None:
        async with one_partition(redis_url) as store:
            await store.write({"a": b"1"})
            with redis_server.client(db) as client:
                client.delete(KEY)
                client.set(KEY, "not a hash")  # what another program might do
            for _ in range(2):
                with pytest.raises(StoreUnavailable, match="WRONGTYPE"):
                    await store.write({"b": b"2"})
            with redis_server.client(db) as client:
                client.delete(KEY)
            await store.write({"c": b"3"})
            assert await load_all(store) == {"c": b"3"}

    run(scenario)


def test_writes_authenticate_with_the_urls_password(
    redis_server: RedisServer, redis_url: str
) -> None:
    db = int(redis_url.rsplit("/", 1)[1])
    secured = redis_url.replace("redis://", "redis://default:s3cret-pw@")
    with redis_server.client() as client:
        client.config_set("requirepass", "s3cret-pw")

    async def scenario() -> None:
        async with one_partition(secured) as store:
            await store.write({"a": b"1", "b": b"2"})
            await store.write({"b": None})
            assert await load_all(store) == {"a": b"1"}

    try:
        run(scenario)
        with redis.Redis(port=redis_server.port, db=db, password="s3cret-pw") as client:
            assert client.hgetall(KEY) == {b"a": b"1"}  # in the URL's database
    finally:
        with redis.Redis(port=redis_server.port, password="s3cret-pw") as client:
            client.config_set("requirepass", "")


def test_submit_after_close_fails_at_once(redis_url: str) -> None:
    async def scenario() -> None:
        store = open_store(redis_url)
        await store.open()
        await store.close()
        errors: list[StoreError | None] = []
        store.submit({"a": b"1"}, errors.append)
        assert len(errors) == 1
        assert isinstance(errors[0], StoreUnavailable)
        assert "closed" in str(errors[0])

    run(scenario)


def test_writes_follow_the_slot_to_its_new_node(redis_cluster: RedisCluster) -> None:
    """A slot migrated while the store runs: the write gets MOVED, goes to the
    new owner (store/redis/fenced_cluster.py), and lands there."""
    redis_cluster.flush()
    source = redis_cluster.owner_of(KEY)
    target = next(node for node in redis_cluster.nodes if node is not source)
    url = redis_cluster.far_node_url(KEY)

    async def scenario() -> None:
        async with one_partition(url) as store:
            await store.write({"before": b"1"})
            _migrate(source, target, KEY)
            await store.write({"after": b"2"})
        with target.client() as client:
            assert client.hgetall(KEY) == {b"before": b"1", b"after": b"2"}

    try:
        run(scenario)
    finally:  # the cluster is shared by the session: give the slot back
        if redis_cluster.owner_of(KEY) is target:
            _migrate(target, source, KEY)


def _migrate(source: RedisServer, target: RedisServer, key: str) -> None:
    """Move the slot of ``key`` (and the key) from ``source`` to ``target``."""
    with source.client() as src, target.client() as dst:
        slot = src.execute_command("CLUSTER KEYSLOT", key)
        src_id = src.execute_command("CLUSTER MYID")
        dst_id = dst.execute_command("CLUSTER MYID")
        dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", src_id)
        src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", dst_id)
        # The partition's keys share the slot: its epoch goes along.
        keys = [k for k in (key, EPOCH_KEY) if src.exists(k)]
        src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)
        for client in (dst, src):
            client.execute_command("CLUSTER SETSLOT", slot, "NODE", dst_id)
