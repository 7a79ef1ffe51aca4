"""The engine on a real store: what time changes is not written, and an engine
rebuilt from the store agrees with the one that wrote it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from delaywheel.engine.engine import Engine
from delaywheel.store import Store, open_store

T0 = 1_800_000_000.0


def with_store(url: str, scenario: Callable[[Store], Awaitable[None]]) -> None:
    async def main() -> None:
        async with open_store(url) as store:
            await scenario(store)

    asyncio.run(main())


def states(engine: Engine, ids: list[str], now_s: float) -> dict[str, tuple[Any, ...]]:
    found = {task_id: engine.get(task_id) for task_id in ids}
    return {
        task_id: (task["state"], task["attempts"], task["at"], task.get("deadline"))
        for task_id, task in found.items()
        if task is not None
    }


def test_fired_tasks_write_nothing_and_load_back_the_same(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/tasks.db"
    ids = ["due", "later", "expires", "dies"]
    seen: dict[str, tuple[Any, ...]] = {}

    async def fire(store: Store) -> None:
        engine = Engine(store, now_s=T0)
        engine.add({"id": "due", "topic": "t", "delay": 10}, T0)
        engine.add({"id": "later", "topic": "t", "delay": 100}, T0)
        engine.add({"id": "expires", "topic": "r", "ttr": 5}, T0)
        engine.add({"id": "dies", "topic": "d", "ttr": 5, "max_attempts": 1}, T0)
        engine.try_reserve(["r"], T0)
        engine.try_reserve(["d"], T0)
        await engine.journal.drain()
        flushes = engine.journal.flushes
        assert engine.advance(T0 + 10) == 3  # due; and two reservations run out
        await engine.journal.drain()
        assert engine.journal.flushes == flushes
        seen.update(states(engine, ids, T0 + 10))
        assert {task_id: state[0] for task_id, state in seen.items()} == {
            "due": "ready",
            "later": "delayed",
            "expires": "ready",
            "dies": "dead",  # its one attempt was used
        }

    async def reload(store: Store) -> None:
        engine = Engine(store, now_s=T0 + 10)
        assert await engine.load(store.load()) == 4
        engine.advance(T0 + 10)  # the server's first tick
        assert states(engine, ids, T0 + 10) == seen
        assert engine.stats(T0 + 10)["states"] == {
            "delayed": 1,
            "ready": 2,
            "reserved": 0,
            "delivering": 0,
            "dead": 1,
            "done": 0,
        }

    with_store(url, fire)
    with_store(url, reload)


def test_ten_thousand_due_tasks_fire_without_a_store_write(tmp_path: Path) -> None:
    async def scenario(store: Store) -> None:
        engine = Engine(store, now_s=T0)
        tasks = [{"topic": "t", "at": T0 + 30 + i / 10_000, "body": i} for i in range(10_000)]
        engine.add_many(tasks, T0)
        await engine.journal.drain()
        flushes = engine.journal.flushes
        fired = 0
        while (next_s := engine.next_fire_s()) is not None and next_s <= T0 + 31:
            fired += engine.advance(T0 + 31)
        await engine.journal.drain()
        assert fired == 10_000
        assert engine.stats(T0 + 31)["states"]["ready"] == 10_000
        assert engine.journal.flushes == flushes

    with_store(f"sqlite:///{tmp_path}/tasks.db", scenario)
