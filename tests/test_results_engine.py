"""Completed tasks kept (``retain``, ``done``) and dead ones bounded
(``--dead-retention``) in the engine, driven by a manual clock: their
records, their lapse on time and across a load, and blocked waits."""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack  # type: ignore[import-untyped, unused-ignore]
from test_engine import T0, code_of, durable, run, stored_ids

from delaywheel.engine.engine import Engine
from delaywheel.engine.queues import Watch
from delaywheel.engine.record import from_record, to_record
from delaywheel.engine.validate import Limits
from delaywheel.store.memory import MemoryStore


def test_a_done_tasks_record_keeps_its_completion_and_others_stay_v5() -> None:
    async def scenario(engine: Engine, store: MemoryStore) -> None:
        engine.add({"id": "kept", "topic": "t", "retain": 30}, T0)
        engine.add({"id": "plain", "topic": "t"}, T0)
        plain = engine._tasks.get("plain")
        assert plain is not None and msgpack.unpackb(to_record(plain))[0] == 5  # as before
        assert engine.try_reserve("t", T0) is not None
        assert engine.ack("kept", {"rows": 3}, T0 + 2) is True
        task = engine._tasks.get("kept")
        assert task is not None
        record = to_record(task)
        assert msgpack.unpackb(record)[0] == 6
        back = from_record("kept", record)
        assert engine.describe(back) == engine.describe(task)
        got = engine.get("kept")
        assert got is not None
        assert (got["state"], got["retain"], got["completed"], got["outcome"], got["result"]) == (
            "done",
            30.0,
            T0 + 2,
            "acked",
            {"rows": 3},
        )

    run(scenario)


def test_a_done_task_lapses_at_completed_plus_retain_and_after_a_load() -> None:
    async def scenario(engine: Engine, store: MemoryStore) -> None:
        engine.add({"id": "a", "topic": "t", "retain": 10}, T0)
        engine.add({"id": "b", "topic": "t", "retain": 100}, T0)
        for _ in range(2):
            task = engine.try_reserve("t", T0)
            assert task is not None
            engine.ack(task["id"], None, T0)
        await durable(engine)
        assert await stored_ids(store) == {"a", "b"}
        engine.advance(T0 + 9)
        assert engine.get("a") is not None
        engine.advance(T0 + 11)
        assert engine.get("a") is None
        await durable(engine)
        assert await stored_ids(store) == {"b"}  # the lapse is journaled
        # A new engine on the same store, past b's time: it goes at the first tick.
        later = Engine(store, now_s=T0 + 200)
        assert await later.load(store.load()) == 1
        assert later.get("b")["state"] == "done"  # type: ignore[index]
        assert later.stats(T0 + 200)["states"]["done"] == 1
        later.advance(T0 + 200)
        assert later.get("b") is None
        await later.journal.drain()
        assert await stored_ids(store) == set()

    run(scenario)


def test_the_topic_retain_applies_when_a_task_names_none() -> None:
    async def scenario(engine: Engine, store: MemoryStore) -> None:
        engine.topic_set("kept", {"retain": 5}, T0)
        for topic in ("kept", "other"):
            engine.add({"id": topic, "topic": topic}, T0)
            assert engine.try_reserve(topic, T0) is not None
            engine.ack(topic, "r", T0)
        engine.add({"id": "own", "topic": "kept", "retain": 0}, T0)  # its own wins
        assert engine.try_reserve("kept", T0) is not None
        engine.ack("own", "r", T0)
        assert engine.get("kept")["state"] == "done"  # type: ignore[index]
        assert engine.get("other") is None and engine.get("own") is None
        engine.advance(T0 + 5)
        assert engine.get("kept") is None

    run(scenario)


def test_waits_get_the_final_map_on_done_dead_and_gone() -> None:
    answers: dict[str, Any] = {}

    def watch(engine: Engine, task_id: str) -> Watch:
        found = Watch(task_id, lambda task: answers.__setitem__(task_id, task))
        engine.watch(found)
        return found

    async def scenario(engine: Engine, store: MemoryStore) -> None:
        engine.add({"id": "done", "topic": "a", "retain": 60}, T0)
        engine.add({"id": "dead", "topic": "b", "max_attempts": 1, "ttr": 5}, T0)
        engine.add({"id": "deleted", "topic": "c", "delay": 60}, T0)
        engine.add({"id": "cancelled", "topic": "c", "delay": 60}, T0)
        for task_id in ("done", "dead", "deleted"):
            watch(engine, task_id)
        engine.cancel_watch(watch(engine, "cancelled"))
        assert engine.wait_now("done") is None
        assert engine.try_reserve("a", T0) and engine.try_reserve("b", T0)
        engine.ack("done", 1, T0)
        engine.advance(T0 + 6)  # dead's TTR runs out on its last attempt
        engine.delete("deleted")
        engine.delete("cancelled")
        assert {task_id: task["state"] for task_id, task in answers.items()} == {
            "done": "done",
            "dead": "dead",
            "deleted": "gone",
        }
        assert engine.table.watches == {}
        assert engine.wait_now("done")["result"] == 1  # type: ignore[index]
        assert engine.wait_now("dead")["state"] == "dead"  # type: ignore[index]
        assert code_of(lambda: engine.wait_now("deleted")) == "not_found"

    run(scenario)


def test_a_result_over_the_limit_is_too_large() -> None:
    async def scenario(engine: Engine, store: MemoryStore) -> None:
        engine.add({"id": "r", "topic": "t", "retain": 60}, T0)
        assert engine.try_reserve("t", T0) is not None
        assert code_of(lambda: engine.ack("r", "x" * 100, T0)) == "too_large"
        assert engine.ack("r", "x" * 10, T0)

    run(scenario, limits=Limits(max_result_bytes=20))


def test_dead_retention_drops_dead_tasks_after_it_and_keeps_them_without() -> None:
    async def scenario(engine: Engine, store: MemoryStore) -> None:
        engine.add({"id": "d", "topic": "t", "max_attempts": 1}, T0)
        assert engine.try_reserve("t", T0) is not None
        engine.release("d", 0, T0 + 1)
        assert engine.get("d")["state"] == "dead"  # type: ignore[index]
        engine.advance(T0 + 30)
        assert engine.get("d") is not None
        engine.advance(T0 + 62)
        assert engine.get("d") is None
        await durable(engine)
        assert await stored_ids(store) == set()

    run(scenario, dead_retention_s=60.0)

    async def kept(engine: Engine, store: MemoryStore) -> None:
        engine.add({"id": "d", "topic": "t", "max_attempts": 1}, T0)
        assert engine.try_reserve("t", T0) is not None
        engine.release("d", 0, T0 + 1)
        engine.advance(T0 + 10_000)
        assert engine.get("d")["state"] == "dead"  # type: ignore[index]
        assert engine.kick("t", 1, T0 + 10_000) == 1

    run(kept)


def test_an_ack_the_store_refuses_leaves_the_task_reserved_without_a_completion() -> None:
    from test_table import FailingStore

    async def main() -> None:
        store = FailingStore()
        await store.open()
        engine = Engine(store, now_s=T0)
        engine.add({"id": "r", "topic": "t", "retain": 60}, T0)
        assert engine.try_reserve("t", T0) is not None
        await engine.journal.drain()
        answers: list[dict[str, Any]] = []
        engine.watch(Watch("r", answers.append))
        store.fail_next = True
        engine.ack("r", "lost", T0)
        assert [a["state"] for a in answers] == ["done"]  # the connection sends it once durable
        await engine.journal.drain()
        task = engine.get("r")
        assert task is not None and task["state"] == "reserved"
        assert "completed" not in task and "result" not in task and task["retain"] == 60
        assert engine.stats(T0)["states"]["done"] == 0
        assert engine.ack("r", "kept", T0 + 1)
        await engine.journal.drain()
        assert engine.get("r")["result"] == "kept"  # type: ignore[index]

    asyncio.run(main())


def test_a_wait_on_a_task_whose_partition_leaves_is_told_so() -> None:
    answers: list[Any] = []

    async def scenario(engine: Engine, store: MemoryStore) -> None:
        engine.add({"id": "moving", "topic": "t", "delay": 60}, T0)
        engine.add({"id": "staying", "topic": "t", "delay": 60}, T0)
        await durable(engine)
        engine.watch(Watch("moving", answers.append))
        engine.watch(Watch("staying", answers.append))
        engine.table.drop(lambda task_id: task_id == "moving")  # as a handoff drops it
        assert answers == [None]  # the connection answers tryagain: ask the new owner
        assert list(engine.table.watches) == ["staying"]

    run(scenario)


def test_a_done_occurrence_is_not_in_flight_for_its_schedule() -> None:
    async def scenario(engine: Engine, store: MemoryStore) -> None:
        engine.add({"id": "occ", "topic": "t", "retain": 60}, T0)
        assert engine._in_flight("occ")
        assert engine.try_reserve("t", T0) is not None
        engine.ack("occ", None, T0)
        assert engine.get("occ")["state"] == "done"  # type: ignore[index]
        assert not engine._in_flight("occ")  # overlap: skip does not wait for it

    run(scenario)
