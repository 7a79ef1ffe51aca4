"""A handoff's drain (engine/journal.py, ``drain(lanes)``): the lanes it hands back,
once, and not while their server's writes fail (docs/ha.md, "Graceful handoff").

The store is the memory store with two lanes (a keyspace's partitions are its
lanes) whose second lane's writes the test holds or fails: a store of the tests'
own, as tests/test_log_lines.py's ``FlakyStore``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import ClassVar

import pytest

from delaywheel.engine.engine import Engine
from delaywheel.store.base import Changes, Done, LanesDone, StoreError, StoreUnavailable
from delaywheel.store.memory import MemoryStore

T0 = 1_800_000_000.0


class TwoLanes(MemoryStore):
    """Ids starting with "a" in lane 0, the others in lane 1; lane 1's writes are
    held while ``holding`` (until ``release``) and fail while ``failing``."""

    inline: ClassVar[bool] = False
    lanes = 2

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.holding = False
        self.failing = False
        self.held: list[Callable[[], None]] = []

    def lane_of(self, key: str) -> int:
        return 0 if key.startswith("a") else 1

    def submit_lane(self, lane: int, changes: Changes, done: Done) -> None:
        self.submit_lanes([(lane, changes)], lambda outcomes: done(outcomes[0][1]))

    def submit_lanes(self, writes: Sequence[tuple[int, Changes]], done: LanesDone) -> None:
        loop = asyncio.get_running_loop()
        for lane, changes in writes:
            if lane == 1 and self.failing:
                error: StoreError = StoreUnavailable("store memory://: write failed: test")
                loop.call_soon(done, [(lane, error)])
            elif lane == 1 and self.holding:
                self.held.append(lambda c=changes, lane=lane: self._write(lane, c, done))
            else:
                loop.call_soon(self._write, lane, changes, done)

    def _write(self, lane: int, changes: Changes, done: LanesDone) -> None:
        self.submit(changes, lambda error: done([(lane, error)]))

    def release(self) -> None:
        held, self.held = self.held, []
        for write in held:
            write()


async def _engine() -> tuple[Engine, TwoLanes]:
    store = TwoLanes("memory://")
    await store.open()
    return Engine(store, now_s=T0), store


def _add(engine: Engine, task_id: str) -> None:
    engine.add({"topic": "t", "id": task_id, "delay": 3600}, T0)


def test_a_drain_of_some_lanes_waits_for_those_alone() -> None:
    async def main() -> None:
        engine, store = await _engine()
        store.holding = True
        _add(engine, "a1")
        _add(engine, "b1")
        await asyncio.wait_for(engine.drain([0]), 2)  # lane 1's write is still held
        assert store.held
        with pytest.raises(TimeoutError):  # every lane: it waits for lane 1
            await asyncio.wait_for(asyncio.shield(engine.drain()), 0.2)
        store.release()
        await asyncio.wait_for(engine.drain(), 2)

    asyncio.run(main())


def test_a_drain_of_lanes_whose_server_fails_writes_does_not_wait() -> None:
    async def main() -> None:
        engine, store = await _engine()
        store.failing = True
        _add(engine, "b1")
        await asyncio.wait_for(engine.drain(), 2)  # failed: lane 1 is lost
        assert engine.journal.watch.lost
        store.failing, store.holding = False, True
        _add(engine, "b2")  # held: it would not return
        _add(engine, "a2")  # lane 0, the same server (one group): failing too
        await asyncio.wait_for(engine.drain([0, 1]), 0.5)
        assert store.held
        store.release()
        await asyncio.wait_for(engine.drain(), 2)
        assert not engine.journal.watch.lost  # a write landed: the outage is over

    asyncio.run(main())
