"""A topic's ``dead_retain``: how long its dead tasks stay, over the server's
``--dead-retention``. The engine on SQLite and on Redis, a manual clock: the
lapse at death + dead_retain, a change re-timing the dead tasks already
there, and both kept across a reload."""

from __future__ import annotations

import pytest
from test_engine_store import T0, with_store
from test_topic_settings import DEFAULT_MAP

from delaywheel.engine.engine import Engine
from delaywheel.errors import RequestError
from delaywheel.store import Store

DAY_S = 86_400.0


def dies(engine: Engine, task_id: str, topic: str, now_s: float) -> None:
    """Add a task of one attempt, reserve it and release it: dead at ``now_s``."""
    engine.add({"id": task_id, "topic": topic, "max_attempts": 1}, now_s)
    assert engine.try_reserve(topic, now_s) is not None
    engine.release(task_id, 0, now_s)
    assert engine.get(task_id)["state"] == "dead"  # type: ignore[index]


async def stored(store: Store) -> set[str]:
    return {key async for batch in store.load() for key, _ in batch}


def test_dead_tasks_go_after_their_topics_dead_retain_and_a_change_retimes_them(
    durable_store_url: str,
) -> None:
    async def first(store: Store) -> None:
        engine = Engine(store, now_s=T0, dead_retention_s=DAY_S)
        shown = engine.topic_set("brief", {"dead_retain": 30}, T0)
        assert shown == {**DEFAULT_MAP, "topic": "brief", "dead_retain": 30.0}
        dies(engine, "short", "brief", T0 + 1)
        dies(engine, "long", "other", T0 + 1)  # the server's --dead-retention
        dies(engine, "moved", "later", T0 + 1)  # kept a day, until its topic says less
        engine.advance(T0 + 30)
        assert engine.get("short") is not None
        engine.advance(T0 + 31)
        assert engine.get("short") is None and engine.get("long") is not None
        # A topic's dead_retain set after its tasks died re-times them: died at
        # T0 + 1, kept 60 s, due to go at T0 + 61.
        engine.topic_set("later", {"dead_retain": 60}, T0 + 40)
        engine.advance(T0 + 60)
        assert engine.get("moved") is not None
        engine.advance(T0 + 61)
        assert engine.get("moved") is None
        dies(engine, "kept", "later", T0 + 100)
        await engine.journal.drain()
        assert await stored(store) == {"long", "kept", "s:brief:000", "s:later:000"}

    async def reloaded(store: Store) -> None:
        engine = Engine(store, now_s=T0 + 120, dead_retention_s=DAY_S)
        assert await engine.load(store.load()) == 2
        assert engine.topic_get("later", T0 + 120)["dead_retain"] == 60.0
        engine.advance(T0 + 159)
        assert engine.get("kept") is not None
        engine.advance(T0 + 160)  # died at T0 + 100, kept 60 s: whatever the load order
        assert engine.get("kept") is None
        # Back to nil: the server's --dead-retention, a day from T0 + 1.
        engine.topic_set("brief", {"dead_retain": None}, T0 + 200)
        engine.advance(T0 + DAY_S)
        assert engine.get("long") is not None
        engine.advance(T0 + 1 + DAY_S)
        assert engine.get("long") is None
        await engine.journal.drain()
        assert await stored(store) == {"s:later:000"}  # brief's settings all defaults: gone

    with_store(durable_store_url, first)
    with_store(durable_store_url, reloaded)


def test_without_a_server_retention_a_topics_dead_retain_still_applies_and_zero_drops() -> None:
    async def scenario(store: Store) -> None:
        engine = Engine(store, now_s=T0)  # --dead-retention unset: kept for ever
        engine.topic_set("none", {"dead_retain": 0}, T0)
        dies(engine, "gone", "none", T0)
        dies(engine, "forever", "kept", T0)
        engine.advance(T0 + 1)
        assert engine.get("gone") is None and engine.get("forever") is not None
        engine.advance(T0 + 100 * DAY_S)
        assert engine.get("forever") is not None
        for bad in (-1, "1h", float("nan")):
            with pytest.raises(RequestError) as caught:
                engine.topic_set("none", {"dead_retain": bad}, T0)
            assert caught.value.code == "bad_request" and "dead_retain" in caught.value.message

    with_store("memory://", scenario)
