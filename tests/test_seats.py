"""The seats of a concurrency handed between the nodes (ha/seats.py), in process
on a private redis-server: the claim script (the sum never over the topic's
concurrency, a dead node's claim dropped, a claim lowered, the node that waited
longest first), and two engines taking turns at one seat through it, never
both in flight at once."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from conftest import RedisCluster
from delaywheel_client.partitions import partition_of
from helpers import run
from redis.asyncio import Redis
from redis.asyncio import RedisCluster as AsyncRedisCluster
from test_engine import T0

from delaywheel.engine.engine import Engine
from delaywheel.engine.topics import TopicSettings, to_record
from delaywheel.ha.membership import Membership
from delaywheel.ha.seats import Seats
from delaywheel.ha.sharing import Owner, Sharing
from delaywheel.store.memory import MemoryStore
from delaywheel.store.redis.layout import Layout

LAYOUT = Layout("delaywheel", 4)
TTL_MS = 60_000
LEASE_S = 20.0  # the seats hash lives 3 L: 60 s
TOPIC = "jobs"


class NoEngine:
    """A host for the script's own tests, which call ``claim`` alone."""

    def handed_topics(self) -> dict[str, int]:
        return {}

    def seat_use(self, topic: str) -> tuple[int, int]:
        return 0, 0

    def hold_seats(self, topic: str, seats: int) -> None:
        raise AssertionError("the script's tests hold no seats")


async def members(client: Any, *names: str, ttl_ms: int = TTL_MS) -> dict[str, Seats]:
    """``names`` registered (for ``ttl_ms``), each with its ``Seats``."""
    found = {}
    for name in names:
        await Membership(client, LAYOUT, name, f"h:{name}").register(ttl_ms)
        found[name] = Seats(client, LAYOUT, name, f"h:{name}", NoEngine(), LEASE_S)
    return found


async def held(client: Any) -> dict[str, int]:
    """Each node's seats as the hash holds them."""
    stored = await client.hgetall(LAYOUT.seats(TOPIC))
    return {name.decode(): int(value.split()[0]) for name, value in stored.items()}


async def claims_and_turns(client: Any) -> None:
    seats = await members(client, "a", "b", "c")
    a, b, c = seats["a"], seats["b"], seats["c"]
    assert await a.claim(TOPIC, 2, 2, 2) == (2, 0)
    assert await b.claim(TOPIC, 2, 1, 1) == (0, 0)  # none free: b waits for one
    assert await a.claim(TOPIC, 2, 2, 2) == (2, 1)  # a hears that one is waited for
    assert await held(client) == {"a": 2, "b": 0}
    await asyncio.sleep(0.01)  # c starts waiting after b, by Redis's clock
    assert await c.claim(TOPIC, 2, 1, 1) == (0, 1)  # b's seat is waited for, c's own is not
    # a lowers its claim: the seat freed is kept for b, who waited longest.
    assert await a.claim(TOPIC, 2, 1, 2) == (1, 1)
    assert await c.claim(TOPIC, 2, 1, 1) == (0, 1)
    assert await b.claim(TOPIC, 2, 1, 1) == (1, 2)  # a and c still wait: b hears it too
    assert await held(client) == {"a": 1, "b": 1, "c": 0}
    # Down to nothing wanted: the entry goes, and so does the hash with the last one.
    assert await a.claim(TOPIC, 2, 0, 0) == (0, 0)
    assert await c.claim(TOPIC, 2, 1, 1) == (1, 0)
    for node in (b, c):
        assert await node.claim(TOPIC, 2, 0, 0) == (0, 0)
    assert not await client.exists(LAYOUT.seats(TOPIC))


def test_claims_never_add_up_past_the_concurrency_and_the_longest_waiting_goes_first(
    redis_url: str,
) -> None:
    async def scenario() -> None:
        async with Redis.from_url(redis_url) as client:
            await claims_and_turns(client)

    run(scenario)


def test_random_claims_of_three_nodes_never_hold_more_than_the_concurrency(
    redis_url: str,
) -> None:
    async def scenario() -> None:
        async with Redis.from_url(redis_url) as client:
            seats = await members(client, "a", "b", "c")
            pick = random.Random(7)
            granted = 0
            for _ in range(300):
                name = pick.choice("abc")
                claim = pick.randint(0, 3)
                total = 2
                got, _ = await seats[name].claim(TOPIC, total, claim, pick.randint(claim, 3))
                assert 0 <= got <= claim
                stored = await held(client)
                assert sum(stored.values()) <= total, stored
                granted += got
            assert granted  # seats did go round

    run(scenario)


def test_a_dead_nodes_claim_is_dropped_once_its_registration_expires(redis_url: str) -> None:
    async def scenario() -> None:
        async with Redis.from_url(redis_url) as client:
            dead = (await members(client, "dead", ttl_ms=300))["dead"]
            b = (await members(client, "b"))["b"]
            assert await dead.claim(TOPIC, 1, 1, 1) == (1, 0)
            assert await b.claim(TOPIC, 1, 1, 1) == (0, 0)
            assert await dead.claim(TOPIC, 1, 1, 1) == (1, 1)  # b waits for it
            await asyncio.sleep(0.5)  # the registration lapses, nothing renews it
            assert await b.claim(TOPIC, 1, 1, 1) == (1, 0)
            assert await held(client) == {"b": 1}
            # A caller not live itself is granted nothing (the others would drop it).
            assert await dead.claim(TOPIC, 1, 1, 1) == (0, 0)
            assert await held(client) == {"b": 1}
            ttl_ms = await client.pttl(LAYOUT.seats(TOPIC))
            assert 0 < ttl_ms <= 3 * LEASE_S * 1000  # a hash no node calls on goes by itself

    run(scenario)


def test_the_claim_script_is_legal_on_redis_cluster(redis_cluster: RedisCluster) -> None:
    """The seats hash is in the {prefix} slot, with the members: no CROSSSLOT."""
    redis_cluster.flush()

    async def scenario() -> None:
        client = AsyncRedisCluster(host="127.0.0.1", port=redis_cluster.nodes[0].port)
        try:
            await claims_and_turns(client)
        finally:
            await client.aclose()

    run(scenario)


# -- two engines at one seat ------------------------------------------------------------


def half_of_four(node: str) -> Sharing:
    """``node`` (a or b) serving two of 4 partitions, the other node the rest."""
    mine, theirs = ((0, 1), (2, 3)) if node == "a" else ((2, 3), (0, 1))
    other = "b" if node == "a" else "a"
    sharing = Sharing(node=node, address=f"h:{node}", partitions=4, lease_s=10.0)
    for partition in mine:
        sharing.serve(partition, 1)
    for partition in theirs:
        sharing.owners[partition] = Owner(other, f"h:{other}", 1)
    return sharing


def ids_of(node: str, count: int) -> list[str]:
    mine = {0, 1} if node == "a" else {2, 3}
    found = (i for n in range(1000) if partition_of(i := f"{node}{n}", 4) in mine)
    return [next(found) for _ in range(count)]


def test_two_engines_take_turns_at_one_seat_and_never_both_hold_it(redis_url: str) -> None:
    """Concurrency 1 on two nodes: each node's tasks all go out, one at a time
    over both, each node passing the seat on after a round while the other waits."""
    per_node = 4

    async def scenario() -> None:
        async with Redis.from_url(redis_url) as client:
            engines, seats = {}, {}
            for name in "ab":
                await Membership(client, LAYOUT, name, f"h:{name}").register(TTL_MS)
                store = MemoryStore("memory://")
                await store.open()
                engine = Engine(store, now_s=T0, ownership=half_of_four(name))
                engine.topics_shared({TOPIC: to_record(TopicSettings(concurrency=1))})
                for task_id in ids_of(name, per_node):
                    engine.add({"id": task_id, "topic": TOPIC}, T0)
                engines[name] = engine
                seats[name] = Seats(client, LAYOUT, name, f"h:{name}", engine, LEASE_S)
            assert engines["a"].flow.shares()[TOPIC]["concurrency"] == 0  # none before a round
            holding: dict[str, str] = {}  # node -> the task it has out
            order = []
            for _ in range(60):
                for name in "ab":  # a round on each, then each worker's turn
                    await seats[name].round()
                for name, engine in engines.items():
                    if name in holding:  # done with it: acked
                        assert engine.ack(holding.pop(name), None, T0)
                    elif (task := engine.try_reserve(TOPIC, T0)) is not None:
                        holding[name] = task["id"]
                        order.append(name)
                    assert len(holding) <= 1, holding  # never both
                if len(order) == 2 * per_node and not holding:
                    break
            assert sorted(order) == sorted("a" * per_node + "b" * per_node)
            # Turns while both had tasks: the seat moved before either ran dry.
            assert order[: per_node + 1].count("a") < per_node + 1
            assert order[: per_node + 1].count("b") < per_node + 1
            for engine in engines.values():
                await engine.journal.drain()

    run(scenario)
