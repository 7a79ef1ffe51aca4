"""Tasks kept packed after a load, or once their add is durable: due later
than the next time window, decoded a window ahead or when a request names
them, and the same to clients either way."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import delaywheel.engine.engine
import delaywheel.engine.firing
from delaywheel.engine.cold import PackedTasks
from delaywheel.engine.engine import Engine
from delaywheel.errors import RequestError
from delaywheel.store import open_store
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


def fire_until(engine: Engine, end_s: float) -> list[tuple[float, str]]:
    """Advance from T0 in half seconds to ``end_s``, reserving and acking each
    task as it fires: (time, id) in order of firing."""
    fired: list[tuple[float, str]] = []
    now_s = T0
    while now_s < end_s:
        engine.advance(now_s)
        while (task := engine.try_reserve(["t"], now_s)) is not None:
            fired.append((now_s, task["id"]))
            engine.ack(task["id"])
        now_s += 0.5
    return fired


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
        fired = fire_until(engine, T0 + 1001)
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
        assert engine.get("x")["cycle"] == 1  # type: ignore[index]

    restarted(lambda e: add_delays(e, {"x": 30}), scenario)


def test_requests_on_a_packed_task_see_and_change_it() -> None:
    async def scenario(engine: Engine) -> None:
        got = engine.get("far")
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
        assert engine.delete("farthest") is True
        assert engine.get("farthest") is None
        assert packed_count(engine) == 1  # edge
        assert engine.stats(T0)["states"]["delayed"] == 5
        assert engine.advance(T0 + 3) == 1  # the update's new time

    restarted(lambda e: add_delays(e, DELAYS), scenario)


def test_list_pages_through_packed_tasks_each_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(delaywheel.engine.engine, "LIST_SCAN_BUDGET", 4)  # decode 4 per call
    far = {f"far-{i}": 30 + i for i in range(23)}

    async def scenario(engine: Engine) -> None:
        assert packed_count(engine) == 23
        seen: list[str] = []
        cursor = 0
        for _ in range(100):
            page = engine.list_tasks({"limit": 3, "cursor": cursor})
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
        page = engine.list_tasks({"topic": "other", "limit": 10})
        assert [task["id"] for task in page["tasks"]] == ["o"]

    def fill(engine: Engine) -> None:
        add_delays(engine, {"a": 40, "b": 50})
        add_delays(engine, {"o": 60}, topic="other")

    restarted(fill, scenario)


def running(scenario: Callable[[Engine], Awaitable[None]]) -> None:
    """``scenario`` on an engine at T0 on a fresh memory store, no restart
    (10 slots of 1 s, as ``restarted``)."""

    async def main() -> None:
        store = MemoryStore("memory://")
        await store.open()
        engine = Engine(store, now_s=T0, slots=10, tick_s=1.0)
        await scenario(engine)
        await engine.journal.drain()

    asyncio.run(main())


def test_tasks_added_far_ahead_are_packed_once_durable() -> None:
    async def scenario(engine: Engine) -> None:
        add_delays(engine, DELAYS)
        before = {task_id: engine.get(task_id) for task_id in DELAYS}
        assert packed_count(engine) == 0  # not yet in the store
        await engine.journal.drain()
        assert packed_count(engine) == 4  # edge, far, farther, farthest
        assert engine.stats(T0)["wheel"]["pending"] == 2
        assert {task_id: engine.get(task_id) for task_id in DELAYS} == before
        assert packed_count(engine) == 0  # each get decoded its task

    running(scenario)


def test_a_task_changed_after_packing_is_packed_again_as_changed() -> None:
    async def scenario(engine: Engine) -> None:
        add_delays(engine, {"far": 25, "gone": 30})
        await engine.journal.drain()
        assert packed_count(engine) == 2
        engine.update("far", {"body": "new", "delay": 50}, T0)
        assert engine.delete("gone") is True
        assert packed_count(engine) == 0  # decoded, and in a batch not yet written
        await engine.journal.drain()
        assert packed_count(engine) == 1
        got = engine.get("far")
        assert got is not None and (got["body"], got["at"]) == ("new", T0 + 50)
        assert engine.get("gone") is None

    running(scenario)


def test_a_task_changed_while_its_add_is_written_is_not_packed_as_added(
    tmp_path: Path,
) -> None:
    """The add's record reaches the store after the update was made: packing
    that record would undo the update in memory."""

    async def main() -> None:
        store = open_store(f"sqlite:///{tmp_path / 'tasks.db'}")
        await store.open()
        engine = Engine(store, now_s=T0, slots=10, tick_s=1.0)
        add_delays(engine, {"far": 25})
        await asyncio.sleep(0)  # the journal starts writing the add (a thread's job)
        assert engine.journal.pending() is not None
        engine.update("far", {"body": "new"}, T0)
        await engine.journal.drain()
        got = engine.get("far")
        assert got is not None and got["body"] == "new"
        await store.close()

    asyncio.run(main())


def test_a_task_whose_window_came_closer_while_its_add_was_written_is_scheduled() -> None:
    """Added due after the next window, it waits out of the wheel; if time
    moves on before the add is durable, packing it would miss its decoding
    time, so it is scheduled in the wheel instead, and fires when due."""

    async def scenario(engine: Engine) -> None:
        add_delays(engine, {"soon-enough": 20})  # T0 + 20: packable at T0
        assert engine.stats(T0)["wheel"]["pending"] == 0  # waiting for the store
        assert engine.advance(T0 + 10) == 0  # before the journal's write starts
        await engine.journal.drain()
        assert packed_count(engine) == 0
        assert engine.stats(T0 + 10)["wheel"]["pending"] == 1
        assert engine.advance(T0 + 19.5) == 0
        assert engine.advance(T0 + 20) == 1

    running(scenario)


def test_a_task_packed_at_run_time_fires_on_time_and_lists() -> None:
    async def scenario(engine: Engine) -> None:
        add_delays(engine, DELAYS)
        await engine.journal.drain()
        page = engine.list_tasks({"limit": 100})
        assert sorted(task["id"] for task in page["tasks"]) == sorted(DELAYS)
        add_delays(engine, {"later": 500})
        await engine.journal.drain()
        fired = fire_until(engine, T0 + 1001)
        expected = sorted([*DELAYS.items(), ("later", 500)], key=lambda item: item[1])
        assert fired == [(T0 + delay, task_id) for task_id, delay in expected]

    running(scenario)


def test_packed_bookkeeping_refuses_a_window_of_no_length() -> None:
    with pytest.raises(ValueError, match="window_s must be > 0, got 0"):
        PackedTasks(0.0)


def test_held_ids_come_back_by_window() -> None:
    packed = PackedTasks(WINDOW_S)
    assert packed.hold_from(T0 + 3) == T0 + 20
    packed.hold(["a", "b", "c"], [T0 + 35.0, T0 + 21.0, T0 + 39.0], T0 + 3)
    assert packed.count == 3
    assert packed.next_thaw_s() == T0 + 10  # a window before b's window
    assert packed.take(10, by_s=T0 + 9.9) == []
    assert packed.take(10, by_s=T0 + 10) == ["b"]
    assert packed.take(1) == ["c"]  # no time given: the earliest, whatever window
    assert packed.take(10, by_s=T0 + 100) == ["a"]
    assert packed.next_thaw_s() is None


def test_tasks_hours_away_are_kept_by_the_hour() -> None:
    packed = PackedTasks(WINDOW_S)  # from 60 windows away, 60 windows to a list
    packed.hold(["a", "b", "c", "d"], [T0 + 1234.0, T0 + 1799.0, T0 + 1800.0, T0 + 1190.0], T0)
    assert packed.next_thaw_s() == T0 + 1180  # d's window, a window ahead
    assert packed.take(10, by_s=T0 + 1180) == ["d"]
    assert packed.next_thaw_s() == T0 + 1190  # a window ahead of the hour from T0 + 1200
    assert sorted(packed.take(10, by_s=T0 + 1190)) == ["a", "b"]
    assert packed.take(10, by_s=T0 + 1790) == ["c"]


def test_the_hours_are_counted_from_the_time_of_hold() -> None:
    packed = PackedTasks(WINDOW_S)  # an "hour" is 60 windows: 600 s, T0 on one
    later_s = T0 + 5 * 600  # hours after the first hold
    packed.hold(["start"], [T0 + 1234.0], T0)  # by the hour: from T0 + 1200
    # The hour of later_s + 300 is under way: that task is kept in its own
    # window, not in the hour's first one, whose time to decode has passed.
    packed.hold(["near", "hours"], [later_s + 300.0, later_s + 1234.0], later_s)
    assert packed.next_thaw_s() == T0 + 1190
    assert packed.take(10, by_s=T0 + 1190) == ["start"]
    assert packed.next_thaw_s() == later_s + 290
    assert packed.take(10, by_s=later_s + 290) == ["near"]
    assert packed.next_thaw_s() == later_s + 1190  # from later_s + 1200, by the hour


def test_a_crowded_window_comes_in_batches_unless_it_has_begun() -> None:
    packed = PackedTasks(WINDOW_S)
    packed.hold([f"x{i}" for i in range(5)], [T0 + 31.0] * 5, T0)  # window from T0 + 30
    packed.hold([f"y{i}" for i in range(5)], [T0 + 45.0] * 5, T0)  # window from T0 + 40
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
    monkeypatch.setattr(delaywheel.engine.firing, "THAW_BATCH", 3)
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
    monkeypatch.setattr(delaywheel.engine.firing, "THAW_BATCH", 3)
    crowd = {f"c{i}": 30 + i / 10 for i in range(8)}

    async def scenario(engine: Engine) -> None:
        # No advance for two windows (a stopped process): nothing may be lost.
        assert engine.advance(T0 + 45) == 8
        assert packed_count(engine) == 0

    restarted(lambda e: add_delays(e, crowd), scenario)
