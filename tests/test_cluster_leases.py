"""Leases, the keeper's self-fence and membership (delaywheel/ha) against
real redis-servers: the session's private one, and one of the test's own for
the test that freezes Redis with SIGSTOP."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import time
from pathlib import Path

import pytest
from conftest import RedisCluster, RedisServer
from helpers import run
from redis.asyncio import Redis
from redis.asyncio import RedisCluster as AsyncRedisCluster

from delaywheel.ha.lease import LeaseError, LeaseKeeper, Leases
from delaywheel.ha.membership import Membership, Presence, Record
from delaywheel.store.redis.layout import (
    Holder,
    Layout,
    PartitionsError,
    partition_of,
    record_partitions,
)
from delaywheel.store.redis.scripts import NodeNameError
from delaywheel.store.redis.topology import Topology

LAYOUT = Layout("delaywheel", 16)

# Leases of 1 s and keepers that must renew in time: alone, after the parallel run.
pytestmark = pytest.mark.serial


def test_a_held_lease_is_not_acquired_again(redis_url: str) -> None:
    async def scenario() -> None:
        async with Redis.from_url(redis_url) as client:
            a = Leases(client, LAYOUT, "a", "127.0.0.1:7001")
            b = Leases(client, LAYOUT, "b", "127.0.0.1:7002")
            await a.load()
            assert await a.acquire(3, 5000) == 1
            held = await b.acquire(3, 5000)
            assert isinstance(held, Holder)
            assert (held.node, held.address, held.epoch) == ("a", "127.0.0.1:7001", 1)
            assert 0 < held.ttl_ms <= 5000
            assert await a.acquire(3, 5000) != 2  # not even by its holder: no epoch bump
            assert await client.get("{delaywheel:p003}:epoch") == b"1"
            assert await client.get("{delaywheel:p003}:lease") == b"1 a 127.0.0.1:7001"
            seen = await b.holder(3)
            assert seen is not None and (seen.node, seen.epoch) == ("a", 1)
            assert await b.holder(4) is None
            assert await b.acquire(4, 5000) == 1  # partitions are independent

    run(scenario)


def two_nodes(client: Redis) -> tuple[Leases, Leases]:
    return Leases(client, LAYOUT, "a", "h:1"), Leases(client, LAYOUT, "b", "h:2")


def test_renewal_needs_the_current_node_and_epoch(redis_url: str) -> None:
    async def scenario() -> None:
        async with Redis.from_url(redis_url) as client:
            a, b = two_nodes(client)
            assert await a.acquire(0, 300) == 1
            assert await a.renew(0, 1, 5000)
            assert await client.pttl("{delaywheel:p000}:lease") > 300
            assert not await b.renew(0, 1, 5000)  # another node, same epoch
            assert not await a.renew(0, 0, 5000)  # a stale epoch
            await client.delete("{delaywheel:p000}:lease")  # redbeat#163: the lease vanishes
            assert await b.acquire(0, 5000) == 2
            assert not await a.renew(0, 1, 5000)  # the old owner does not revive it
            seen = await b.holder(0)
            assert seen is not None and (seen.node, seen.epoch) == ("b", 2)

    run(scenario)


def test_release_deletes_only_the_owners_lease(redis_url: str) -> None:
    async def scenario() -> None:
        async with Redis.from_url(redis_url) as client:
            a, b = two_nodes(client)
            assert await a.acquire(5, 5000) == 1
            assert not await b.release(5, 1)  # not its lease
            assert not await a.release(5, 7)  # not its epoch
            assert await client.get("{delaywheel:p005}:lease") == b"1 a h:1"
            assert await a.release(5, 1)
            assert await client.exists("{delaywheel:p005}:lease") == 0
            assert await b.acquire(5, 5000) == 2

    run(scenario)


def test_after_expiry_the_next_acquire_bumps_the_epoch(redis_url: str) -> None:
    async def scenario() -> None:
        async with Redis.from_url(redis_url) as client:
            a, b = two_nodes(client)
            assert await a.acquire(9, 100) == 1
            deadline = time.monotonic() + 5
            while isinstance(got := await b.acquire(9, 5000), Holder):
                assert time.monotonic() < deadline, "the lease never expired"
                await asyncio.sleep(0.02)
            assert got == 2
            assert not await a.renew(9, 1, 5000)

    run(scenario)


def test_scripts_come_back_after_script_flush(redis_url: str) -> None:
    async def scenario() -> None:
        async with Redis.from_url(redis_url) as client:
            a = Leases(client, LAYOUT, "a", "h:1")
            await a.load()
            await client.script_flush()  # as a restarted Redis would have it
            assert await a.acquire(1, 5000) == 1

    run(scenario)


def test_bad_names_and_lease_periods_are_named() -> None:
    with pytest.raises(NodeNameError, match="node 'a b'"):
        Leases(None, LAYOUT, "a b", "h:1")  # type: ignore[arg-type]
    with pytest.raises(NodeNameError, match="address ''"):
        Leases(None, LAYOUT, "a", "")  # type: ignore[arg-type]
    with pytest.raises(LeaseError, match=r"lease 0\.01 s"):
        LeaseKeeper(Leases(None, LAYOUT, "a", "h:1"), 0.01, lambda *_: None)  # type: ignore[arg-type]


def test_the_partition_count_is_fixed_at_first_use(redis_url: str) -> None:
    async def scenario() -> None:
        async with Redis.from_url(redis_url) as client:
            await record_partitions(client, Layout("ks", 16))
            await record_partitions(client, Layout("ks", 16))
            with pytest.raises(PartitionsError, match=r"'ks' has 16 partitions .* not 32"):
                await record_partitions(client, Layout("ks", 32))
            await record_partitions(client, Layout("other", 32))  # another keyspace

    run(scenario)


def test_the_keeper_renews_while_redis_answers(redis_url: str) -> None:
    async def scenario() -> None:
        lost: list[tuple[int, int, str]] = []
        async with Redis.from_url(redis_url, socket_timeout=2) as client:
            keeper = LeaseKeeper(Leases(client, LAYOUT, "a", "h:1"), 1.2, lambda *x: lost.append(x))
            assert await keeper.acquire(2) == 1
            assert await keeper.acquire(7) == 1
            keeper.start()
            await asyncio.sleep(2.5)  # two lease periods: six renewals
            assert lost == []
            assert keeper.held == {2: 1, 7: 1}
            await client.delete("{delaywheel:p007}:lease")  # someone else's doing
            await asyncio.sleep(1.0)  # the next renewal (every 0.4 s) finds it gone
            assert lost == [(7, 1, "lost")]
            assert keeper.held == {2: 1}
            await keeper.close()
            assert await client.exists("{delaywheel:p002}:lease") == 0  # released

    run(scenario)


def test_the_lease_scripts_own_lines_are_at_debug(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An acquire and a release say so at DEBUG only: the node's own lines
    (serving, handed back) are the ones an operator reads (docs/ha.md)."""

    async def scenario() -> None:
        async with Redis.from_url(redis_url, socket_timeout=2) as client:
            keeper = LeaseKeeper(Leases(client, LAYOUT, "a", "h:1"), 5.0, lambda *_: None)
            assert await keeper.acquire(3) == 1
            await keeper.close()

    with caplog.at_level(logging.DEBUG, logger="delaywheel.cluster"):
        run(scenario)
    said = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "delaywheel.cluster"]
    assert (logging.DEBUG, "acquired partition 3, epoch 1") in said, said
    assert (logging.DEBUG, "released partition 3, epoch 1") in said, said
    assert all(level == logging.DEBUG for level, _ in said), said


@pytest.mark.redis
def test_the_keeper_fences_itself_when_redis_freezes(tmp_path: Path) -> None:
    server = RedisServer(tmp_path)
    server.start()
    assert server.proc is not None
    pid = server.proc.pid
    lease_s = 1.5

    async def scenario() -> float:
        fenced: list[tuple[int, int, str, float]] = []
        async with Redis(port=server.port, socket_timeout=5) as client:
            leases = Leases(client, LAYOUT, "a", "h:1")
            keeper = LeaseKeeper(
                leases, lease_s, lambda p, e, why: fenced.append((p, e, why, time.monotonic()))
            )
            assert await keeper.acquire(4) == 1
            keeper.start()
            await asyncio.sleep(2.0)
            assert fenced == []
            os.kill(pid, signal.SIGSTOP)
            stopped_s = time.monotonic()
            try:
                await asyncio.sleep(0.8 * lease_s + 1.0)
            finally:
                os.kill(pid, signal.SIGCONT)
            assert [f[:3] for f in fenced] == [(4, 1, "fenced")]
            assert keeper.held == {}
            assert keeper.renewals_failed >= 1  # the metric's count: timed out while frozen
            await keeper.close(release=False)
            return fenced[0][3] - stopped_s

    try:
        after_stop_s = run(scenario)
    finally:
        server.stop()
    # The last renewal that succeeded was sent about L/3 at most before the
    # stop, so the fence comes 0.8 L after it: within (0.8 L - L/3, 0.8 L] of
    # the stop, give or take the loop's lateness (generous margins).
    assert 0.8 * lease_s - lease_s / 3 - 0.3 <= after_stop_s <= 0.8 * lease_s + 0.5


def test_members_expire_by_the_redis_clock(redis_url: str) -> None:
    async def scenario() -> None:
        async with Redis.from_url(redis_url) as client:
            a = Membership(client, LAYOUT, "a", "127.0.0.1:7001")
            b = Membership(client, LAYOUT, "b", "127.0.0.1:7002")
            await a.load()
            seconds, micros = await client.time()
            registered = await a.register(400)
            redis_now_ms = seconds * 1000 + micros // 1000
            assert redis_now_ms - 50 <= registered.now_ms <= redis_now_ms + 50
            assert registered.expires_ms == registered.now_ms + 400
            assert await client.zscore(LAYOUT.members, "a") == registered.expires_ms
            await b.register(60_000)
            assert await a.live() == {"a": "127.0.0.1:7001", "b": "127.0.0.1:7002"}
            await asyncio.sleep(0.6)
            assert await b.live() == {"b": "127.0.0.1:7002"}
            await b.register(60_000)  # a registration sweeps the expired ones out
            assert await client.zrange(LAYOUT.members, 0, -1) == [b"b"]
            assert await client.hkeys(LAYOUT.nodes) == [b"b"]
            await b.leave()
            assert await a.live() == {}

    run(scenario)


def test_presence_keeps_a_node_registered_until_stopped(redis_url: str) -> None:
    """Registered every period for the lease, by a loop of its own (not the
    coordinator's round, which can wait seconds); after a stop it lapses."""

    async def scenario() -> None:
        async with Redis.from_url(redis_url) as client:
            members = Membership(client, Layout("presence", 4), "a", "127.0.0.1:7001")
            await members.load()
            presence = Presence(members, lease_s=0.6, period_s=0.2)
            await presence.start()
            try:
                await asyncio.sleep(1.5)  # 2.5 leases
                assert await members.live() == {"a": "127.0.0.1:7001"}
            finally:
                await presence.stop()
            await asyncio.sleep(0.9)
            assert await members.live() == {}

    run(scenario)


def test_membership_ignores_the_local_clock(redis_url: str) -> None:
    """An expiry written as Redis's now (as if a node's clock ran late) is already
    expired: liveness is judged by Redis's TIME alone."""

    async def scenario() -> None:
        async with Redis.from_url(redis_url) as client:
            a = Membership(client, LAYOUT, "a", "h:1")
            seconds, micros = await client.time()
            await client.zadd(LAYOUT.members, {"late": seconds * 1000 + micros // 1000})
            await client.zadd(LAYOUT.members, {"early": (seconds + 3600) * 1000})
            assert set(await a.live()) == {"early"}

    run(scenario)


def test_the_assignment_record_is_written_only_over_the_version_read(redis_url: str) -> None:
    """Compare-and-set: a write over a version another node replaced is refused
    and answered with the stored record, which a look gives every node alike."""
    everything_a = dict.fromkeys(range(16), "a")
    halves = {p: "ab"[p % 2] for p in range(16)}

    async def scenario() -> None:
        async with Redis.from_url(redis_url) as client:
            a = Membership(client, LAYOUT, "a", "h:1")
            b = Membership(client, LAYOUT, "b", "h:2")
            await a.load()
            await a.register(60_000)
            empty = await a.look()
            assert (empty.live, empty.version, empty.record) == ({"a": "h:1"}, None, None)
            first = Record.new(1, everything_a)
            assert await a.propose(None, first) == (True, first)
            # b read no record too: its write is refused, and it is given a's.
            assert await b.propose(None, Record.new(1, halves)) == (False, first)
            seen = await b.look()
            assert (seen.version, seen.record) == (first.version, first)
            assert seen.record is not None and seen.record.generation == 1
            # A look that knows the version gets no body.
            assert (await b.look(first.version)).record is None
            second = Record.new(2, halves)
            assert await b.propose(first.version, second) == (True, second)
            assert await a.propose(first.version, Record.new(2, everything_a)) == (False, second)
            assert await client.hgetall(LAYOUT.assignment) == {
                b"version": second.version.encode(),
                b"nodes": b"a b",
                b"owners": b"0 1 " * 7 + b"0 1",
            }
            # Deleted: a write over the version read is refused, and none is stored.
            await client.delete(LAYOUT.assignment)
            assert await a.propose(second.version, Record.new(3, halves)) == (False, None)
            assert (await a.look(second.version)).version is None

    run(scenario)


def test_a_record_that_is_not_the_keyspaces_assigns_nothing() -> None:
    """Written by hand, say: the next round writes a whole one over it."""
    assert Record.decode(b"4:ab", b"a b", b"0 1 1", 16).owners == {}
    assert Record.decode(b"4:ab", b"a b", b"0 1 2" + b" 0" * 13, 16).owners == {}
    assert Record.decode(b"x", b"a", b"0" + b" 0" * 15, 16) == Record(
        "x", dict.fromkeys(range(16), "a")
    )
    assert Record("x", {}).generation == 0


def test_every_script_is_legal_on_redis_cluster(redis_cluster: RedisCluster) -> None:
    """Each partition's keys in one slot, the keyspace's own under {prefix}: no
    CROSSSLOT, and the partitions spread over the primaries."""
    redis_cluster.flush()

    async def scenario() -> None:
        client = AsyncRedisCluster(host="127.0.0.1", port=redis_cluster.nodes[0].port)
        try:
            leases = Leases(client, LAYOUT, "a", "h:1")
            await leases.load()
            members = Membership(client, LAYOUT, "a", "h:1")
            await record_partitions(client, LAYOUT)
            await members.register(60_000)
            assert await members.live() == {"a": "h:1"}
            record = Record.new(1, dict.fromkeys(range(16), "a"))
            assert await members.propose(None, record) == (True, record)
            assert (await members.look()).record == record
            for p in range(16):
                assert await leases.acquire(p, 5000) == 1
                assert await leases.renew(p, 1, 5000)
                assert await leases.release(p, 1)
        finally:
            await client.aclose()

    run(scenario)
    owners = {redis_cluster.owner_of(keys.lease).port for keys in LAYOUT}
    assert len(owners) == 3


@pytest.mark.slow
def test_a_first_round_that_loads_for_longer_than_the_lease_keeps_every_partition(
    redis_url: str,
) -> None:
    """The node's first round acquires and loads all its partitions before it
    serves; its leases are renewed meanwhile. (They were not: a load longer than
    0.8 L self-fenced the partitions taken first, and a start of 1,000,000
    tasks served 375,664.)"""
    from delaywheel.app import _assemble, _take_partitions, shared_store
    from delaywheel.config import Settings
    from delaywheel.engine.record import to_record
    from delaywheel.engine.task import READY, Task

    lease_s, tasks = 1.0, 300_000
    layout = Layout("slowstart", 16)
    task = Task("x", "t", 0.0, body_packed=b"\xa2hi", ttr_s=60.0, max_attempts=5, created_s=0.0)
    task.state = READY
    record = to_record(task)
    # Each record in its partition's hash: a load of 2 to 3 s here, 2 to 3 L.
    by_partition: dict[int, dict[str, bytes]] = {p: {} for p in range(16)}
    for n in range(tasks):
        by_partition[partition_of(f"t{n}", 16)][f"t{n}"] = record

    async def scenario() -> None:
        async with Redis.from_url(redis_url) as client:
            for p, fields in by_partition.items():
                await client.hset(layout.partition(p).tasks, mapping=fields)
        settings = Settings(
            store_url=redis_url, redis_prefix="slowstart", node="n1", lease_s=lease_s
        )
        store, keyspace = shared_store(settings)
        await store.open()
        server, coordinator = _assemble(settings, store, keyspace)
        assert coordinator is not None
        thresholds = gc.get_threshold()
        try:
            started_s = time.monotonic()
            # As a starting server does (collector off).
            await _take_partitions(coordinator, server, store)
            took_s = time.monotonic() - started_s
            assert coordinator.counts.lost == 0, f"self-fenced during a {took_s:.2f} s start"
            assert sorted(coordinator.sharing.serving) == list(range(16))
            assert len(server.engine.table.index) == tasks
            print(f"first round {took_s:.2f} s with L = {lease_s} s: every partition kept")
        finally:
            gc.unfreeze()  # what the start froze, and its thresholds: this process goes on
            gc.set_threshold(*thresholds)
            await coordinator.stop()
            await store.close()

    run(scenario)


def test_a_read_of_every_partition_waits_on_no_primary_but_its_own(
    redis_cluster: RedisCluster,
) -> None:
    """The coordinator's read of every lease, a pipeline per primary with a
    timeout: a primary that does not answer (paused) leaves its own partitions
    unknown, and the others are read at once. (In one pipeline, redis-py's
    retries against a dead primary held every partition's read for seconds.)"""
    redis_cluster.flush()
    layout = Layout("byprimary", 16)
    paused = redis_cluster.owner_of(layout.partition(0).lease)
    url = f"redis://127.0.0.1:{redis_cluster.nodes[0].port}/0"

    async def scenario() -> None:
        topology = await Topology(url, shown=url, connect_timeout_s=1, timeout_s=5).open()
        try:
            leases = Leases(topology.client, layout, "a", "h:1")
            await leases.load()
            for p in range(16):
                assert await leases.acquire(p, 60_000) == 1
            groups = topology.by_primary([keys.lease for keys in layout])
            assert sorted(p for group in groups for p in group) == list(range(16))
            assert len(groups) == 3
            own = next(set(group) for group in groups if 0 in group)
            with paused.client() as admin:
                admin.execute_command("CLIENT", "PAUSE", 3000, "ALL")
            started_s = time.monotonic()
            holders, unknown = await leases.holders(groups, timeout_s=0.3)
            took_s = time.monotonic() - started_s
            assert unknown == own
            assert sorted(holders) == sorted(set(range(16)) - own)
            assert {holder.node for holder in holders.values()} == {"a"}
            assert took_s < 2.0, f"the read waited {took_s:.2f} s on the paused primary"
        finally:
            with paused.client() as admin:
                admin.execute_command("CLIENT", "UNPAUSE")
            await topology.close()

    run(scenario)
