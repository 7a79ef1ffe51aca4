"""The assignment record through real coordinators (delaywheel/ha/membership.py,
ha/assignment.py): nodes in this process, on the session's private
redis-server and on the private Redis Cluster.

The nodes follow one record; a join or a leave moves the fewest partitions
balance allows, from the nodes that own the most; and with the record and
every lease key deleted (HA scenario 5, and the record too), each node
takes back its own, never one another node serves.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import pytest
from conftest import RedisCluster
from helpers import run
from redis.asyncio import Redis
from redis.asyncio import RedisCluster as AsyncRedisCluster

from delaywheel.engine.engine import Engine
from delaywheel.ha.assignment import assignment, moved, rebalance
from delaywheel.ha.coordinator import Coordinator
from delaywheel.ha.membership import Membership, Record
from delaywheel.ha.rights import NodeRights
from delaywheel.ha.sharing import Sharing
from delaywheel.store.redis import RedisStore
from delaywheel.store.redis.layout import Layout

# Serial: it counts the partitions lost and the records written, which a lease
# renewal late on a busy machine would add to.
pytestmark = [pytest.mark.redis, pytest.mark.serial]

PARTITIONS = 16
LEASE_S = 2.0  # rounds every 0.5 s; room for a loaded machine to renew in time
SETTLE_S = 10.0
LAYOUT = Layout("delaywheel", PARTITIONS)


class Node:
    """One node's store, engine and coordinator, as the server builds them."""

    def __init__(self, url: str, name: str, port: int) -> None:
        self.name = name
        self.sharing = Sharing(
            node=name, address=f"127.0.0.1:{port}", partitions=PARTITIONS, lease_s=LEASE_S
        )
        self.rights = NodeRights(self.sharing)
        self.keyspace = RedisStore(url, partitions=PARTITIONS, owner=self.rights)
        self.coordinator: Coordinator | None = None

    async def start(self) -> None:
        await self.keyspace.open()
        engine = Engine(self.keyspace, now_s=time.time(), ownership=self.sharing)
        self.coordinator = Coordinator(
            engine, self.keyspace, self.sharing, self.rights, handoff_wait_s=0.5
        )
        await self.coordinator.start()

    async def stop(self) -> None:
        """A graceful stop (its partitions handed back), once."""
        coordinator, self.coordinator = self.coordinator, None
        if coordinator is None:
            return
        try:
            await coordinator.stop()
        finally:
            await self.keyspace.close()

    @property
    def lost(self) -> int:
        """Partitions lost (lease gone or self-fenced) so far."""
        assert self.coordinator is not None
        return self.coordinator.counts.lost

    @property
    def serving(self) -> set[int]:
        return set(self.sharing.serving)


@dataclass(frozen=True)
class Keyspace:
    url: str
    cluster: bool

    def client(self) -> Redis | AsyncRedisCluster:
        return AsyncRedisCluster.from_url(self.url) if self.cluster else Redis.from_url(self.url)


@pytest.fixture(params=["redis", "cluster"])
def keyspace(request: pytest.FixtureRequest) -> Keyspace:
    """A plain Redis database of this test's own, or the flushed Redis Cluster."""
    if request.param == "redis":
        return Keyspace(str(request.getfixturevalue("redis_url")), cluster=False)
    cluster: RedisCluster = request.getfixturevalue("redis_cluster")
    cluster.flush()
    return Keyspace(cluster.nodes[0].url, cluster=True)


async def _record(keyspace: Keyspace) -> Record | None:
    client = keyspace.client()
    try:
        return (await Membership(client, LAYOUT, "reader", "h:0").look()).record
    finally:
        await client.aclose()


async def _until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + SETTLE_S
    while not await check():
        assert time.monotonic() < deadline, f"not within {SETTLE_S} s: {what}"
        await asyncio.sleep(0.05)


def _settled_on(nodes: list[Node], record: Record | None) -> bool:
    """Every node serves exactly what ``record`` assigns it."""
    if record is None:
        return False
    return all(
        node.serving == {p for p, owner in record.owners.items() if owner == node.name}
        for node in nodes
    )


async def _settle(keyspace: Keyspace, nodes: list[Node]) -> Record:
    found: list[Record] = []

    async def settled() -> bool:
        record = await _record(keyspace)
        names = {node.name for node in nodes}
        if record is None or set(record.owners.values()) != names:
            return False
        found[:] = [record]
        return _settled_on(nodes, record)

    await _until(settled, f"{[node.name for node in nodes]} serving the record's partitions")
    return found[0]


class Overlaps:
    """Watches, every 5 ms, that no partition is served by two nodes at once."""

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = nodes
        self.seen: list[set[int]] = []
        self._task = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            served: set[int] = set()
            for node in self.nodes:
                if both := served & node.serving:
                    self.seen.append(both)
                served |= node.serving
            await asyncio.sleep(0.005)

    async def close(self) -> list[set[int]]:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        return self.seen


def test_nodes_follow_one_record_and_a_join_or_leave_moves_the_fewest(
    keyspace: Keyspace, caplog: pytest.LogCaptureFixture
) -> None:
    url = keyspace.url
    names = ["a", "b", "c"]

    async def scenario() -> None:
        a, b, c = (Node(url, name, 7001 + i) for i, name in enumerate(names))
        watch = Overlaps([a, b, c])  # handoffs: a holder lets go before the next one takes
        await a.start()
        try:
            first = await _settle(keyspace, [a])
            assert first.generation == 1 and a.serving == set(range(PARTITIONS))
            await b.start()
            second = await _settle(keyspace, [a, b])
            # b took its share from a; a kept the rest, nothing else moved.
            assert second.generation == 2
            assert second.owners == rebalance(first.owners, ["a", "b"], PARTITIONS)
            assert moved(first.owners, second.owners) == len(b.serving) == 8
            await c.start()
            third = await _settle(keyspace, [a, b, c])
            assert third.generation == 3
            assert moved(second.owners, third.owners) == len(c.serving) == 5
            await c.stop()
            fourth = await _settle(keyspace, [a, b])
            assert fourth.generation == 4
            # Only c's partitions moved; a and b kept theirs.
            assert moved(third.owners, fourth.owners) == 5
            for node in (a, b):
                kept = {p for p, owner in third.owners.items() if owner == node.name}
                assert kept <= node.serving
            assert await watch.close() == []
        finally:
            for node in (a, b, c):
                await node.stop()

    with caplog.at_level(logging.INFO, logger="delaywheel.cluster"):
        run(scenario)
    # One line per record, from its writer alone.
    assert [r.getMessage() for r in caplog.records if "assignment" in r.getMessage()] == [
        "assignment generation 1: 1 node(s), 0 partition(s) move",
        "assignment generation 2: 2 node(s), 8 partition(s) move",
        "assignment generation 3: 3 node(s), 5 partition(s) move",
        "assignment generation 4: 2 node(s), 5 partition(s) move",
    ]


def test_with_the_record_and_every_lease_deleted_each_node_takes_back_its_own(
    keyspace: Keyspace, caplog: pytest.LogCaptureFixture
) -> None:
    """A node's copy of the record is written back: no partition moves, and none
    is served by two nodes meanwhile. (Computed from the member list alone, the
    assignment would differ, and a node would claim partitions whose owner had
    not yet found its lease gone.)"""
    url = keyspace.url
    history = rebalance(dict.fromkeys(range(PARTITIONS), "a"), ["a", "b"], PARTITIONS)
    assert history != assignment(["a", "b"], PARTITIONS)  # the case worth testing

    async def scenario() -> None:
        a, b = Node(url, "a", 7001), Node(url, "b", 7002)
        await a.start()
        try:
            await _settle(keyspace, [a])
            await b.start()
            before = await _settle(keyspace, [a, b])
            assert before.owners == history
            served = (set(a.serving), set(b.serving))
            watch = Overlaps([a, b])
            client = keyspace.client()
            try:
                for key in (LAYOUT.assignment, *(keys.lease for keys in LAYOUT)):
                    await client.delete(key)  # one at a time: other slots on a Cluster
            finally:
                await client.aclose()
            # Each node drops its partitions at its next renewal (within L/3),
            # then claims them again with new epochs.
            await _until(
                lambda: _dropped_and_back(a, b, served), "every partition dropped and taken back"
            )
            after = await _settle(keyspace, [a, b])
            assert await watch.close() == []
            assert (after.owners, after.generation) == (before.owners, before.generation + 1)
            assert (a.serving, b.serving) == served
        finally:
            for node in (a, b):
                await node.stop()

    with caplog.at_level(logging.INFO, logger="delaywheel.cluster"):
        run(scenario)
    restored = [r for r in caplog.records if "assignment record missing" in r.getMessage()]
    assert len(restored) == 1 and restored[0].levelno == logging.WARNING, caplog.text


async def _dropped_and_back(a: Node, b: Node, served: tuple[set[int], set[int]]) -> bool:
    lost = a.lost + b.lost
    return lost == PARTITIONS and (a.serving, b.serving) == served
