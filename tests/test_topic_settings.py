"""Topic settings: their checks, their record, kept across a reload, on a
manual clock (no sleeping)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from test_engine import T0, run

from delaywheel.engine.engine import Engine
from delaywheel.engine.queues import Waiter
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
    "dead_retain": None,
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
        ({"concurrency": 2**80}, "1208925819614629174706176"),  # schemathesis found it: a 500
        ({"burst": 2**31}, "2147483648"),
        ({"note": "\ud974"}, "surrogate"),
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


# -- what the settings hold back (engine/flow.py) -------------------------------------


def reserve_all(engine: Engine, topic: str, now_s: float) -> list[dict[str, Any]]:
    got = []
    while (task := engine.try_reserve(topic, now_s)) is not None:
        got.append(task)
    return got


def test_a_paused_topic_counts_ready_but_reserve_skips_it_until_the_pause_ends() -> None:
    async def scenario(engine: Engine, store: MemoryStore) -> None:
        ids = [engine.add({"topic": "t", "body": n, "delay": 1}, T0)["id"] for n in range(3)]
        engine.add({"topic": "other", "body": "o"}, T0)
        engine.topic_set("t", {"paused_until": T0 + 30}, T0)
        engine.advance(T0 + 2)
        assert engine.stats(T0 + 2)["topics"]["t"] == {"ready": 3}  # due, and counted ready
        assert engine.try_reserve(["t"], T0 + 2) is None
        assert engine.try_reserve(["t", "other"], T0 + 2)["body"] == "o"  # another topic goes
        got: list[dict[str, Any]] = []
        engine.wait_reserve(Waiter(["t"], got.append))
        assert engine.next_fire_s() == T0 + 30  # the ticker wakes when the pause ends
        engine.advance(T0 + 29.9)
        assert got == []
        engine.advance(T0 + 30)
        assert [task["id"] for task in got] == ids[:1]
        # Waiting changed nothing of the tasks: a first attempt, their TTR.
        assert got[0]["attempts"] == 1 and got[0]["deadline"] == T0 + 30 + 60
        assert [task["attempts"] for task in reserve_all(engine, "t", T0 + 30)] == [1, 1]

    run(scenario)


def test_resume_releases_the_backlog_to_a_blocked_reserve() -> None:
    async def scenario(engine: Engine, store: MemoryStore) -> None:
        engine.topic_set("t", {"paused_until": PAUSED_FOR_EVER_S}, T0)
        engine.add({"topic": "t", "body": "held"}, T0)
        got: list[dict[str, Any]] = []
        assert engine.try_reserve("t", T0) is None
        engine.wait_reserve(Waiter(["t"], got.append))
        assert engine.next_fire_s() is None  # no end: nothing to wake for
        engine.topic_set("t", {"paused_until": None}, T0 + 5)
        assert [task["body"] for task in got] == ["held"]

    run(scenario)


def test_concurrency_bounds_the_reserved_and_a_freed_slot_answers_a_blocked_reserve() -> None:
    async def scenario(engine: Engine, store: MemoryStore) -> None:
        engine.topic_set("t", {"concurrency": 2}, T0)
        for n in range(5):
            engine.add({"topic": "t", "body": n, "ttr": 10}, T0)
        first = reserve_all(engine, "t", T0)
        assert [task["body"] for task in first] == [0, 1]
        got: list[dict[str, Any]] = []
        engine.wait_reserve(Waiter(["t"], got.append))
        engine.ack(first[0]["id"])
        assert [task["body"] for task in got] == [2]  # at once, on the ack
        assert engine.try_reserve("t", T0 + 1) is None  # 2 reserved again
        engine.release(first[1]["id"], 0, T0 + 1)  # back to ready: a slot frees
        assert engine.try_reserve("t", T0 + 1)["body"] == 3  # due before 1's new time
        engine.wait_reserve(Waiter(["t"], got.append))
        engine.advance(T0 + 11)  # the reservation of 2 ran out: its slot frees
        assert [task["body"] for task in got] == [2, 4]
        engine.topic_set("t", {"concurrency": None}, T0 + 11)
        # No limit: the rest (2 and 3 expired, and 1), all at once.
        assert sorted(task["body"] for task in reserve_all(engine, "t", T0 + 11)) == [1, 2, 3]

    run(scenario)


def test_rate_and_burst_are_a_token_bucket_on_reserve() -> None:
    async def scenario(engine: Engine, store: MemoryStore) -> None:
        engine.topic_set("t", {"rate": 4, "burst": 3}, T0)
        for n in range(20):
            engine.add({"topic": "t", "body": n}, T0)
        assert len(reserve_all(engine, "t", T0)) == 3  # the burst
        assert engine.try_reserve("t", T0 + 0.2) is None  # 0.8 of a token
        assert engine.try_reserve("t", T0 + 0.25)["body"] == 3
        got: list[dict[str, Any]] = []
        engine.wait_reserve(Waiter(["t"], got.append))
        assert engine.next_fire_s() == pytest.approx(T0 + 0.5)
        engine.advance(T0 + 0.5)
        assert [task["body"] for task in got] == [4]
        # Over any window, no more than rate * t + burst handed out.
        handed = 5
        for step in range(1, 41):
            handed += len(reserve_all(engine, "t", T0 + 0.5 + step * 0.1))
        assert handed <= 4 * 4.5 + 3 and handed == 20

    run(scenario)


def test_a_rate_without_a_burst_banks_what_late_wakes_lose() -> None:
    """No burst given: the bucket holds 20 ms of the rate, at least one task. A
    waiting reserve answered 0.3 ms after each token is due (as a timer wakes)
    still gets the topic's rate; with a burst of 1 that lateness is lost."""

    def handed_in_a_second(engine: Engine, topic: str, start_s: float) -> int:
        got: list[dict[str, Any]] = []
        now_s = start_s
        while now_s < start_s + 1:
            answered = len(got)
            engine.wait_reserve(Waiter([topic], got.append))
            engine.advance(now_s)  # answered now when the bucket has a token
            while len(got) == answered:  # it waits for a token: wake 0.3 ms after it comes
                when_s = engine.next_fire_s()
                assert when_s is not None
                now_s = when_s + 0.0003
                engine.advance(now_s)
        return len(got)

    async def scenario(engine: Engine, store: MemoryStore) -> None:
        assert engine.topic_set("slow", {"rate": 10}, T0)["burst"] == 1
        assert engine.topic_set("fast", {"rate": 500}, T0)["burst"] == 10
        assert engine.topic_set("one", {"rate": 500, "burst": 1}, T0)["burst"] == 1
        for n in range(1000):
            engine.add({"topic": "fast", "body": n}, T0)
            engine.add({"topic": "one", "body": n}, T0)
        engine.advance(T0)  # every task ready
        # The rate over the second and the first burst; 500 / 2.3 ms with a burst of 1.
        assert 500 <= handed_in_a_second(engine, "fast", T0) <= 500 + 10
        assert 400 <= handed_in_a_second(engine, "one", T0 + 2) <= 440
        engine.topic_set("fast", {"burst": 1}, T0 + 4)
        assert engine.topic_set("fast", {"burst": None}, T0 + 4)["burst"] == 10
        assert engine.topic_set("fast", {"rate": 1e6}, T0 + 4)["burst"] == 20_000
        assert engine.topic_set("fast", {"rate": 1e300}, T0 + 4)["burst"] == 2**31 - 1

    run(scenario)


def test_a_pause_is_kept_across_a_reload() -> None:
    async def main() -> None:
        store = MemoryStore("memory://")
        await store.open()
        engine = Engine(store, now_s=T0)
        engine.add({"topic": "t", "body": "held"}, T0)
        engine.topic_set("t", {"paused_until": T0 + 60}, T0)
        await engine.journal.drain()
        again = Engine(store, now_s=T0 + 5)
        await again.load(store.load())
        again.advance(T0 + 5)
        assert again.try_reserve("t", T0 + 5) is None
        assert again.try_reserve("t", T0 + 60)["body"] == "held"
        await again.journal.drain()

    asyncio.run(main())
