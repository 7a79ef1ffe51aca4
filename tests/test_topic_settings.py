"""Topic settings: their checks, their record, kept across a reload, on a
manual clock (no sleeping)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from test_engine import T0, run

from delaywheel.engine.engine import Engine
from delaywheel.engine.topics import PAUSED_FOR_EVER_S
from delaywheel.errors import RequestError
from delaywheel.store.memory import MemoryStore

DEFAULT_MAP = {
    "topic": "t",
    "paused": False,
    "paused_until": None,
    "rate": None,
    "burst": 1,
    "concurrency": None,
    "retain": 0.0,
    "note": "",
}


def test_a_topic_never_set_has_the_defaults_and_no_record() -> None:
    async def scenario(engine: Engine, store: MemoryStore) -> None:
        assert engine.topic_get("t", T0) == DEFAULT_MAP
        assert engine.topic_list(None, T0) == {"topics": [], "next": None}
        assert not [key async for batch in store.load() for key, _ in batch]

    run(scenario)


def test_set_changes_only_the_fields_given_and_nil_puts_one_back() -> None:
    async def scenario(engine: Engine, store: MemoryStore) -> None:
        shown = engine.topic_set("t", {"rate": 50, "burst": 10, "note": "partner API"}, T0)
        assert shown == {**DEFAULT_MAP, "rate": 50.0, "burst": 10, "note": "partner API"}
        shown = engine.topic_set("t", {"concurrency": 4, "paused_until": T0 + 60}, T0)
        assert shown["rate"] == 50.0 and shown["concurrency"] == 4 and shown["paused"]
        assert engine.topic_get("t", T0 + 61)["paused"] is False  # a timed pause ends by itself
        shown = engine.topic_set("t", {"rate": None, "paused_until": None}, T0)
        assert shown["rate"] is None and not shown["paused"] and shown["concurrency"] == 4
        engine.topic_set("t", {"concurrency": None, "burst": None, "note": None}, T0)
        assert engine.topic_list(None, T0)["topics"] == []  # all defaults: the record goes
        await engine.journal.drain()
        assert not [key async for batch in store.load() for key, _ in batch]

    run(scenario)


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"rate": 0}, "rate"),
        ({"rate": -1.5}, "-1.5"),
        ({"rate": "fast"}, "'fast'"),
        ({"burst": 0}, "burst"),
        ({"burst": 2.5}, "2.5"),
        ({"concurrency": 0}, "concurrency"),
        ({"concurrency": True}, "True"),
        ({"paused_until": "tomorrow"}, "'tomorrow'"),
        ({"paused_until": float("inf")}, "inf"),
        ({"retain": -1}, "retain"),
        ({"note": 7}, "note"),
        ({"colour": "red"}, "'colour'"),
    ],
)
def test_a_bad_setting_is_refused_naming_it(settings: dict[str, Any], named: str) -> None:
    async def scenario(engine: Engine, store: MemoryStore) -> None:
        with pytest.raises(RequestError) as caught:
            engine.topic_set("t", settings, T0)
        assert caught.value.code == "bad_request" and named in caught.value.message
        assert engine.topic_get("t", T0) == DEFAULT_MAP  # nothing changed

    run(scenario)


def test_bad_topics_queries_and_reserved_ids_are_refused() -> None:
    async def scenario(engine: Engine, store: MemoryStore) -> None:
        for call in (
            lambda: engine.topic_get("", T0),
            lambda: engine.topic_set(7, {}, T0),
            lambda: engine.topic_set("t", [1], T0),
            lambda: engine.topic_list({"paused": "yes"}, T0),
            lambda: engine.topic_list({"limit": 0}, T0),
            lambda: engine.add({"topic": "t", "id": "s:t:000"}, T0),
        ):
            with pytest.raises(RequestError) as caught:
                call()
            assert caught.value.code == "bad_request"

    run(scenario)


def test_settings_survive_a_reload_and_list_pages_by_name() -> None:
    async def main() -> None:
        store = MemoryStore("memory://")
        await store.open()
        engine = Engine(store, now_s=T0)
        engine.add({"topic": "b", "body": 1}, T0)
        for name in ("c", "a", "b"):
            engine.topic_set(name, {"concurrency": 2, "retain": 3600}, T0)
        engine.topic_set("b", {"paused_until": PAUSED_FOR_EVER_S, "note": "incident"}, T0)
        await engine.journal.drain()

        again = Engine(store, now_s=T0 + 5)
        assert await again.load(store.load()) == 1  # the task; settings are not tasks
        assert again.topic_get("b", T0 + 5) == {
            **DEFAULT_MAP,
            "topic": "b",
            "paused": True,
            "paused_until": PAUSED_FOR_EVER_S,
            "concurrency": 2,
            "retain": 3600.0,
            "note": "incident",
        }
        first = again.topic_list({"limit": 2}, T0 + 5)
        assert [t["topic"] for t in first["topics"]] == ["a", "b"] and first["next"] == "b"
        rest = again.topic_list({"cursor": first["next"]}, T0 + 5)
        assert [t["topic"] for t in rest["topics"]] == ["c"] and rest["next"] is None
        paused = again.topic_list({"paused": True}, T0 + 5)
        assert [t["topic"] for t in paused["topics"]] == ["b"]
        await again.journal.drain()

    asyncio.run(main())
