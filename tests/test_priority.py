"""Task priority: the order reserve and the delivery lanes hand tasks out in,
its checks, its record, driven by a manual clock (no sleeping)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import msgpack  # type: ignore[import-untyped, unused-ignore]
import pytest
from test_engine import T0, run

from delaywheel.delivery.dispatcher import Dispatcher
from delaywheel.engine.engine import Engine
from delaywheel.engine.queues import Waiter
from delaywheel.engine.record import from_record, to_record
from delaywheel.engine.task import DEFAULT_PRIORITY, MAX_PRIORITY
from delaywheel.errors import RequestError
from delaywheel.store.memory import MemoryStore


def drain_order(engine: Engine, topics: list[str], now_s: float) -> list[str]:
    """Reserve until nothing is ready: the ids in the order they came out."""
    order = []
    while (task := engine.try_reserve(topics, now_s)) is not None:
        order.append(task["body"])
    return order


def test_reserve_takes_the_most_urgent_then_the_first_ready_under_many_priorities() -> None:
    shuffled = random.Random(32)

    async def scenario(engine: Engine, store: MemoryStore) -> None:
        # 600 tasks over 40 priorities (the default among them), ready at
        # times given out of order, so that runs, the heap and the ranked
        # heap all hold some.
        added = []
        for n in range(600):
            priority = shuffled.choice([*range(0, 2000, 50), DEFAULT_PRIORITY])
            at_s = T0 - shuffled.randrange(0, 100)
            engine.add({"topic": "t", "body": n, "priority": priority, "at": at_s}, T0)
            added.append((priority, at_s, n))
        expected = [n for _, _, n in sorted(added)]  # ties: the order they became ready
        assert drain_order(engine, ["t"], T0) == expected

    run(scenario)


def test_ties_in_priority_and_time_come_out_in_the_order_they_became_ready() -> None:
    async def scenario(engine: Engine, store: MemoryStore) -> None:
        for n in range(10):
            engine.add({"topic": "t", "body": n, "priority": 7 if n % 2 else DEFAULT_PRIORITY}, T0)
        assert drain_order(engine, ["t"], T0) == [1, 3, 5, 7, 9, 0, 2, 4, 6, 8]

    run(scenario)


def test_an_update_of_priority_moves_a_ready_task_at_once() -> None:
    async def scenario(engine: Engine, store: MemoryStore) -> None:
        ids = [engine.add({"topic": "t", "body": n}, T0)["id"] for n in range(5)]
        shown = engine.update(ids[3], {"priority": 0}, T0)
        assert shown["priority"] == 0 and shown["state"] == "ready"
        engine.update(ids[0], {"priority": 5000}, T0)  # last now
        engine.update(ids[1], {"priority": 0}, T0)  # first: the only urgent one left
        # Back to the default: an update queues the task again, so among the
        # tasks of its priority and time it comes after those queued before.
        engine.update(ids[3], {"priority": DEFAULT_PRIORITY}, T0)
        assert engine.get(ids[3])["priority"] == DEFAULT_PRIORITY
        assert drain_order(engine, ["t"], T0) == [1, 2, 4, 3, 0]

    run(scenario)


def test_reserve_on_several_topics_takes_the_most_urgent_of_all() -> None:
    async def scenario(engine: Engine, store: MemoryStore) -> None:
        engine.add({"topic": "a", "body": "a-old", "at": T0 - 10}, T0)
        engine.add({"topic": "b", "body": "b-urgent", "priority": 1}, T0)
        engine.add({"topic": "c", "body": "c-lazy", "priority": 9999, "at": T0 - 20}, T0)
        engine.add({"topic": "a", "body": "a-urgent", "priority": 1}, T0)
        order = drain_order(engine, ["a", "b", "c"], T0)
        assert order == ["b-urgent", "a-urgent", "a-old", "c-lazy"]

    run(scenario)


def test_a_blocked_reserve_gets_the_most_urgent_of_what_became_ready() -> None:
    async def scenario(engine: Engine, store: MemoryStore) -> None:
        got: list[dict[str, Any]] = []
        engine.add({"topic": "t", "body": "later", "delay": 5}, T0)
        engine.add({"topic": "t", "body": "urgent", "delay": 5, "priority": 3}, T0)
        engine.wait_reserve(Waiter(["t"], got.append))
        engine.advance(T0 + 6)
        assert [task["body"] for task in got] == ["urgent"]

    run(scenario)


def test_a_released_task_keeps_its_priority() -> None:
    async def scenario(engine: Engine, store: MemoryStore) -> None:
        engine.add({"topic": "t", "body": "plain"}, T0)
        urgent = engine.add({"topic": "t", "body": "urgent", "priority": 0}, T0)["id"]
        assert engine.try_reserve(["t"], T0)["id"] == urgent
        engine.release(urgent, 0, T0 + 1)
        assert engine.try_reserve(["t"], T0 + 1)["id"] == urgent

    run(scenario)


@pytest.mark.parametrize(
    "bad", [-1, MAX_PRIORITY + 1, 1.5, "1", True, None, 2**64], ids=lambda value: repr(value)
)
def test_a_bad_priority_is_refused_naming_it(bad: Any) -> None:
    async def scenario(engine: Engine, store: MemoryStore) -> None:
        for call in (
            lambda: engine.add({"topic": "t", "priority": bad}, T0),
            lambda: engine.update(engine.add({"topic": "t"}, T0)["id"], {"priority": bad}, T0),
        ):
            with pytest.raises(RequestError) as caught:
                call()
            assert caught.value.code == "bad_request"
            assert "priority" in caught.value.message and repr(bad)[:10] in caught.value.message

    run(scenario)


def test_the_ends_of_the_range_are_taken_and_shown() -> None:
    async def scenario(engine: Engine, store: MemoryStore) -> None:
        low = engine.add({"topic": "t", "priority": MAX_PRIORITY}, T0)["id"]
        high = engine.add({"topic": "t", "priority": 0}, T0)["id"]
        plain = engine.add({"topic": "t"}, T0)["id"]
        assert [engine.get(i)["priority"] for i in (low, high, plain)] == [
            MAX_PRIORITY,
            0,
            DEFAULT_PRIORITY,
        ]
        listed = engine.list_tasks({"topic": "t"})["tasks"]
        assert [task["priority"] for task in listed] == [MAX_PRIORITY, 0, DEFAULT_PRIORITY]

    run(scenario)


def test_the_priority_is_in_the_record_and_an_older_record_loads_with_the_default() -> None:
    async def scenario(engine: Engine, store: MemoryStore) -> None:
        task_id = engine.add({"topic": "t", "priority": 77, "delay": 30}, T0)["id"]
        task = engine._tasks.get(task_id)
        assert task is not None
        record = to_record(task)
        assert msgpack.unpackb(record)[0] == 5
        assert from_record(task_id, record).priority == 77
        # A version 4 record (no priority) is a task of the default priority.
        v4 = (4, "t", 0, T0 + 30, T0, 0, 60, 5, 0, msgpack.packb("x"), None, None)
        assert from_record("old", msgpack.packb(v4, use_bin_type=True)).priority == 1024
        with pytest.raises(ValueError, match="wrong type"):
            from_record("bad", msgpack.packb((*v4[:1], *v4[1:], "high")))

    run(scenario)


def test_a_restart_keeps_priorities_and_their_order() -> None:
    async def main() -> None:
        store = MemoryStore("memory://")
        await store.open()
        engine = Engine(store, now_s=T0)
        for n, priority in enumerate([DEFAULT_PRIORITY, 5, 2000, 5, 0]):
            engine.add({"topic": "t", "body": n, "priority": priority}, T0)
        await engine.journal.drain()
        again = Engine(store, now_s=T0 + 1)
        assert await again.load(store.load()) == 5
        assert drain_order(again, ["t"], T0 + 1) == [4, 1, 3, 0, 2]
        await again.journal.drain()

    asyncio.run(main())


def test_a_delivery_lane_starts_the_most_urgent_waiting_task_first() -> None:
    started: list[str] = []

    def begin(task_id: str, ready: Callable[[Any], None]) -> bool:
        started.append(task_id)
        return True  # never ready: the lane stays full until the test ends

    dispatcher = Dispatcher(
        lambda target: None,  # type: ignore[arg-type, return-value]
        begin,
        lambda *args: None,
        http_lane_limit=1,
    )
    target = {"type": "http", "url": "http://127.0.0.1:9/"}
    dispatcher.queue("first", target, DEFAULT_PRIORITY)  # starts at once: the lane was empty
    for task_id, priority in [("d1", 1024), ("p9", 9), ("lazy", 5000), ("d2", 1024), ("p1", 1)]:
        dispatcher.queue(task_id, target, priority)
    assert dispatcher.stats()["waiting"] == 5
    lane = next(iter(dispatcher._lanes.values()))
    order = []
    while lane.waiting or lane.ranked:
        order.append(lane.next_id())
    assert started == ["first"]
    assert order == ["p1", "p9", "d1", "d2", "lazy"]
