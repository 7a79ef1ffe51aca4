"""Tasks kept packed after a load: due later than the next time window,
decoded a window ahead or when a request names them, and the same to
clients either way."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import delaywheel.engine
from delaywheel.engine import Engine
from delaywheel.errors import RequestError
from delaywheel.packed import PackedTasks
from delaywheel.store.memory import MemoryStore

T0 = 1_800_000_000.0  # a multiple of the window below
WINDOW_S = 10.0  # the wheel's lap (10 slots of 1 s): due from T0 + 20 on, packed


def restarted(
    fill: Callable[[Engine], None],
    scenario: Callable[[Engine], Awaitable[None]],
    **wheel: Any,
) -> None:
    """``fill`` an engine at T0, then run ``scenario`` on a second engine that
    loaded the same store at T0, as after a restart. The wheel has 10 slots
    of 1 s unless ``wheel`` says otherwise."""
    wheel = {"slots": 10, "tick_s": 1.0, **wheel}

    async def main() -> None:
        store = MemoryStore("memory://")
        await store.open()
        before = Engine(store, now_s=T0, **wheel)
        fill(before)
        await before.journal.drain()
        after = Engine(store, now_s=T0, **wheel)
        await after.load(store.load())
        await scenario(after)
        await after.journal.drain()

    asyncio.run(main())


def add_delays(engine: Engine, delays: dict[str, float], topic: str = "t") -> None:
    for task_id, delay in delays.items():
        engine.add({"id": task_id, "topic": topic, "delay": delay, "body": task_id}, T0)


def packed_count(engine: Engine) -> int:
    return engine.stats(T0)["wheel"]["packed"]  # type: ignore[no-any-return]


DELAYS = {"near": 5, "mid": 15, "edge": 20, "far": 25, "farther": 95, "farthest": 1000}


def test_only_tasks_due_after_the_next_window_stay_packed() -> None:
    async def scenario(engine: Engine) -> None:
        stats = engine.stats(T0)
        assert stats["wheel"]["packed"] == 4  # edge, far, farther, farthest
        assert stats["wheel"]["pending"] == 2  # near, mid
        assert stats["tasks"] == 6
        assert stats["states"]["delayed"] == 6
        assert stats["topics"] == {"t": {"delayed": 6}}

    restarted(lambda e: add_delays(e, DELAYS), scenario)


def test_the_default_wheel_packs_what_is_due_after_the_next_minute() -> None:
    async def scenario(engine: Engine) -> None:
        assert packed_count(engine) == 2  # a window is a minute, not the lap (an hour)
        assert engine.stats(T0)["wheel"]["pending"] == 1
        assert engine.next_fire_s() == T0 + 60  # a window ahead of T0 + 125
        engine.advance(T0 + 60)
        assert packed_count(engine) == 1
        assert engine.advance(T0 + 100) == 1
        assert engine.advance(T0 + 125) == 1

    delays = {"soon": 100, "next": 125, "later": 7200}
    restarted(lambda e: add_delays(e, delays), scenario, slots=3600, tick_s=1.0)


def test_packed_tasks_fire_at_their_own_time() -> None:
    async def scenario(engine: Engine) -> None:
        fired: list[tuple[float, str]] = []
        now_s = T0
        while now_s < T0 + 1001:
            engine.advance(now_s)
            while (task := engine.try_reserve(["t"], now_s)) is not None:
                fired.append((now_s, task["id"]))
                engine.ack(task["id"], now_s)
            now_s += 0.5
        assert fired == [(T0 + delay, task_id) for task_id, delay in DELAYS.items()]
        assert packed_count(engine) == 0

    restarted(lambda e: add_delays(e, DELAYS), scenario)


def test_a_window_is_decoded_one_window_ahead_and_the_engine_wakes_for_it() -> None:
    async def scenario(engine: Engine) -> None:
        # Only packed tasks: the engine still names a time to wake up.
        assert engine.next_fire_s() == T0 + 20  # the window of T0 + 30, a window ahead
        engine.advance(T0 + 19.5)
        assert packed_count(engine) == 1
        engine.advance(T0 + 20)
        assert packed_count(engine) == 0
        assert engine.next_fire_s() == T0 + 30
        assert engine.get("x", T0 + 20)["cycle"] == 1  # type: ignore[index]

    restarted(lambda e: add_delays(e, {"x": 30}), scenario)


def test_requests_on_a_packed_task_see_and_change_it() -> None:
    async def scenario(engine: Engine) -> None:
        got = engine.get("far", T0)
        assert got is not None
        assert (got["state"], got["at"], got["body"], got["topic"]) == (
            "delayed",
            T0 + 25,
            "far",
            "t",
        )
        assert packed_count(engine) == 3
        with pytest.raises(RequestError) as exists:
            engine.add({"id": "farther", "topic": "t"}, T0)
        assert exists.value.code == "exists"
        assert packed_count(engine) == 3  # asking whether it exists decodes nothing
        updated = engine.update("farther", {"delay": 3}, T0)
        assert updated["at"] == T0 + 3
        assert engine.delete("farthest", T0) is True
        assert engine.get("farthest", T0) is None
        assert packed_count(engine) == 1  # edge
        assert engine.stats(T0)["states"]["delayed"] == 5
        assert engine.advance(T0 + 3) == 1  # the update's new time

    restarted(lambda e: add_delays(e, DELAYS), scenario)


def test_list_pages_through_packed_tasks_each_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(delaywheel.engine, "LIST_SCAN_BUDGET", 4)  # decode 4 per call
    far = {f"far-{i}": 30 + i for i in range(23)}

    async def scenario(engine: Engine) -> None:
        assert packed_count(engine) == 23
        seen: list[str] = []
        cursor = 0
        for _ in range(100):
            page = engine.list_tasks({"limit": 3, "cursor": cursor}, T0)
            seen += [task["id"] for task in page["tasks"]]
            if page["next"] is None:
                break
            cursor = page["next"]
        assert sorted(seen) == sorted([*far, "near", "a-ready"])
        assert len(seen) == len(set(seen))
        assert packed_count(engine) == 0

    def fill(engine: Engine) -> None:
        add_delays(engine, far)
        add_delays(engine, {"near": 5, "a-ready": 0})

    restarted(fill, scenario)


def test_list_with_a_filter_still_reaches_every_packed_task() -> None:
    async def scenario(engine: Engine) -> None:
        page = engine.list_tasks({"topic": "other", "limit": 10}, T0)
        assert [task["id"] for task in page["tasks"]] == ["o"]

    def fill(engine: Engine) -> None:
        add_delays(engine, {"a": 40, "b": 50})
        add_delays(engine, {"o": 60}, topic="other")

    restarted(fill, scenario)


def test_packed_bookkeeping_refuses_a_window_of_no_length() -> None:
    with pytest.raises(ValueError, match="window_s must be > 0, got 0"):
        PackedTasks(0.0, T0)


def test_held_ids_come_back_by_window() -> None:
    packed = PackedTasks(WINDOW_S, T0 + 3)
    assert packed.hold_from_s == T0 + 20
    packed.hold(["a", "b", "c"], [T0 + 35.0, T0 + 21.0, T0 + 39.0])
    assert packed.count == 3
    assert packed.next_thaw_s() == T0 + 10  # a window before b's window
    assert packed.take(10, by_s=T0 + 9.9) == []
    assert packed.take(10, by_s=T0 + 10) == ["b"]
    assert packed.take(1) == ["c"]  # no time given: the earliest, whatever window
    assert packed.take(10, by_s=T0 + 100) == ["a"]
    assert packed.next_thaw_s() is None


def test_tasks_hours_away_are_kept_by_the_hour() -> None:
    packed = PackedTasks(WINDOW_S, T0)  # from 60 windows away, 60 windows to a list
    packed.hold(["a", "b", "c", "d"], [T0 + 1234.0, T0 + 1799.0, T0 + 1800.0, T0 + 1190.0])
    assert packed.next_thaw_s() == T0 + 1180  # d's window, a window ahead
    assert packed.take(10, by_s=T0 + 1180) == ["d"]
    assert packed.next_thaw_s() == T0 + 1190  # a window ahead of the hour from T0 + 1200
    assert sorted(packed.take(10, by_s=T0 + 1190)) == ["a", "b"]
    assert packed.take(10, by_s=T0 + 1790) == ["c"]


def test_a_crowded_window_comes_in_batches_unless_it_has_begun() -> None:
    packed = PackedTasks(WINDOW_S, T0)
    packed.hold([f"x{i}" for i in range(5)], [T0 + 31.0] * 5)  # window from T0 + 30
    packed.hold([f"y{i}" for i in range(5)], [T0 + 45.0] * 5)  # window from T0 + 40
    assert len(packed.take(2, by_s=T0 + 20)) == 2
    assert packed.next_thaw_s() == T0 + 20  # the rest of that window is still due
    assert len(packed.take(2, by_s=T0 + 20)) == 2
    # The window from T0 + 30 has begun: all that is left of it, past the limit,
    # then up to the limit from the next window, whose time to decode has come.
    assert packed.take(2, by_s=T0 + 30) == ["x0", "y4"]
    assert packed.take(2, by_s=T0 + 30) == ["y2", "y3"]
    assert sorted(packed.take(1, by_s=T0 + 40)) == ["y0", "y1"]  # begun: whole
    assert packed.count == 10  # only decoding (thawed) lowers the count


def test_the_engine_decodes_a_crowded_window_over_several_advances(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(delaywheel.engine, "THAW_BATCH", 3)
    crowd = {f"c{i}": 30 + i / 10 for i in range(8)}  # one window, from T0 + 30

    async def scenario(engine: Engine) -> None:
        assert engine.next_fire_s() == T0 + 20
        left = [8]
        for _ in range(3):
            engine.advance(T0 + 20)
            left.append(packed_count(engine))
            if left[-1]:
                assert engine.next_fire_s() == T0 + 20  # wake again at once
        assert left == [8, 5, 2, 0]
        assert engine.next_fire_s() > T0 + 20  # nothing left to decode
        assert engine.advance(T0 + 31) == 8

    restarted(lambda e: add_delays(e, crowd), scenario)


def test_a_window_already_begun_is_decoded_whole_and_fires_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(delaywheel.engine, "THAW_BATCH", 3)
    crowd = {f"c{i}": 30 + i / 10 for i in range(8)}

    async def scenario(engine: Engine) -> None:
        # No advance for two windows (a stopped process): nothing may be lost.
        assert engine.advance(T0 + 45) == 8
        assert packed_count(engine) == 0

    restarted(lambda e: add_delays(e, crowd), scenario)
