"""The horizon (delaywheel/engine/horizon.py): delayed tasks due beyond it are
kept only in the store's far tier, pulled ahead of time, and every verb
answers as if they were in memory. In process, on every store (memory,
SQLite, Redis, Redis Cluster and Sentinel: conftest.py's ``store_url``), with
a manual clock: a horizon of a minute costs no wall time."""

from __future__ import annotations

import asyncio
import math
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from conftest import STORE_KINDS as CONFTEST_STORE_KINDS
from delaywheel_client.aio import AsyncClient
from delaywheel_client.partitions import partition_of
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from delaywheel.config import Settings
from delaywheel.engine.engine import Engine
from delaywheel.engine.horizon import NeedsStore
from delaywheel.errors import RequestError
from delaywheel.net.server import Server
from delaywheel.store import Store, open_store
from delaywheel.store.base import Tiers
from delaywheel.store.redis import RedisStore

pytest_plugins = ("redisfarm",)  # module_sentinels, for the Sentinel kind

# Sentinel too: the same writer and scripts as plain Redis, behind Sentinel's discovery.
STORE_KINDS = (*CONFTEST_STORE_KINDS, pytest.param("redis-sentinel", marks=pytest.mark.redis))

T = TypeVar("T")
T0 = 1_800_000_000.0
HORIZON_S = 60.0  # the watermark starts at T0 + 75 (1.25 horizons)
WHEEL: dict[str, Any] = {"slots": 10, "tick_s": 1.0}
IDS = st.sampled_from([f"k{i}" for i in range(6)])
DELAYS = st.sampled_from([1.0, 10.0, 50.0, 74.0, 76.0, 100.0, 300.0, 1000.0])


async def call(engine: Engine, verb: Callable[[], T]) -> T:
    """``verb`` as the server runs it: a store read first when it needs one."""
    for _ in range(5):
        try:
            result = verb()
        except NeedsStore as need:
            await need.fetch()
            continue
        except RequestError:
            engine.horizon.settle()
            raise
        engine.horizon.settle()
        return result
    raise AssertionError("still needs the store after 5 reads")


async def started(store: Store, now_s: float = T0, horizon_s: float | None = HORIZON_S) -> Engine:
    engine = Engine(store, now_s=now_s, horizon_s=horizon_s, **WHEEL)
    await engine.load(store.load())
    return engine


def add(engine: Engine, task_id: str, delay_s: float, now_s: float = T0, topic: str = "t") -> None:
    engine.add({"id": task_id, "topic": topic, "delay": delay_s, "body": task_id}, now_s)


async def fire_until(engine: Engine, start_s: float, end_s: float) -> list[tuple[float, str]]:
    """Advance by half seconds, pulls awaited, reserving and acking what fires."""
    fired: list[tuple[float, str]] = []
    now_s = start_s
    while now_s <= end_s:
        engine.advance(now_s)
        if engine.horizon.pulling is not None:
            await engine.horizon.pulling
        while (task := engine.try_reserve(["t"], now_s)) is not None:
            fired.append((now_s, task["id"]))
            engine.ack(task["id"])
        await engine.journal.drain()
        now_s += 0.5
    return fired


async def added_many(engine: Engine, tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``add_many`` as a connection answers it: its reply once its write is
    durable, or the write's error (``exists`` for a blind put refused)."""
    added = await call(engine, lambda: engine.add_many(tasks, T0))
    wait = engine.journal.pending()
    await engine.journal.drain()
    if wait is not None and wait.error is not None:
        error = wait.error
        raise RequestError(getattr(error, "reply_code", "unavailable"), str(error))
    return added


def in_memory(engine: Engine) -> int:
    return len(engine.table.index)


async def reopened(store: Store, url: str) -> Store:
    """The store as a restarted server opens it (memory://: the same object,
    whose records go with it when closed)."""
    if url == "memory://":
        return store
    await store.close()
    store = open_store(url)
    await store.open()
    return store


def test_far_tasks_leave_memory_and_stay_counted(store_url: str) -> None:
    async def main() -> None:
        store = open_store(store_url)
        await store.open()
        engine = await started(store)
        for i in range(10):
            add(engine, f"t{i}", 30 + 30 * i, topic="t" if i % 2 else "u")
        await engine.journal.drain()
        assert in_memory(engine) == 2  # t0, t1: below the watermark, T0 + 75
        stats = engine.stats(T0)
        assert (stats["tasks"], stats["states"]["delayed"], stats["wheel"]["far"]) == (10, 10, 8)
        assert stats["topics"] == {"t": {"delayed": 5}, "u": {"delayed": 5}}
        assert await far_counts(store) == {"t": 4, "u": 4}
        # After a restart the counts are the store's counters (no scan), and
        # the far tier stays where it is; again after some have fired.
        for _ in range(2):
            store = await reopened(store, store_url)
            engine = await started(store)
            stats = engine.stats(T0)
            assert (stats["tasks"], stats["wheel"]["far"], in_memory(engine)) == (10, 8, 2)
            assert stats["topics"] == {"t": {"delayed": 5}, "u": {"delayed": 5}}
        await fire_until(engine, T0, T0 + 125)  # t0 .. t3 fire (topic t: t1, t3 acked)
        store = await reopened(store, store_url)
        engine = await started(store, now_s=T0 + 125)
        engine.advance(T0 + 125)
        stats = engine.stats(T0 + 125)
        assert stats["tasks"] == 8 and stats["states"]["ready"] == 2  # t0, t2 of topic u
        assert stats["topics"] == {"t": {"delayed": 3}, "u": {"delayed": 3, "ready": 2}}
        await store.close()

    asyncio.run(main())


def test_each_verb_on_a_far_a_near_and_across(store_url: str) -> None:
    async def main() -> None:
        store = open_store(store_url)
        await store.open()
        engine = await started(store)
        add(engine, "near", 10)
        for name in ("far", "far2", "far3", "far4", "far5"):
            add(engine, name, 500)
        await engine.journal.drain()
        assert in_memory(engine) == 1
        # get: a far task reads the store, and goes back out of memory.
        shown = await call(engine, lambda: engine.get("far"))
        assert shown is not None and shown["at"] == T0 + 500 and shown["body"] == "far"
        assert in_memory(engine) == 1
        assert await call(engine, lambda: engine.get("none")) is None
        # add of an id only the store holds: exists, answered from the write.
        add(engine, "far", 5)
        wait = engine.journal.pending()
        await engine.journal.drain()
        assert wait is not None and wait.error is not None
        assert getattr(wait.error, "reply_code", None) == "exists"
        assert (await call(engine, lambda: engine.get("far")))["at"] == T0 + 500  # type: ignore[index]
        # add of a new id while far tasks exist: a blind put that the store took.
        add(engine, "new", 5)
        wait = engine.journal.pending()
        await engine.journal.drain()
        assert wait is not None and wait.error is None
        assert engine.get("new") is not None
        with pytest.raises(RequestError) as raised:
            add(engine, "new", 5)
        assert raised.value.code == "exists"
        # update across: far to near, near to far, far to far.
        await call(engine, lambda: engine.update("far2", {"delay": 3}, T0))
        await call(engine, lambda: engine.update("near", {"delay": 900}, T0))
        await call(engine, lambda: engine.update("far3", {"delay": 800, "body": "x"}, T0))
        await engine.journal.drain()
        assert engine.stats(T0)["wheel"]["far"] == 5  # far, far3, far4, far5, near
        assert (await call(engine, lambda: engine.get("far3")))["body"] == "x"  # type: ignore[index]
        # delete: a far one, a near one, an absent one.
        assert await call(engine, lambda: engine.delete("far4")) is True
        assert await call(engine, lambda: engine.delete("new")) is True
        assert await call(engine, lambda: engine.delete("none")) is False
        await engine.journal.drain()
        assert engine.stats(T0)["tasks"] == 5  # far, far2, far3, far5, near
        # ack / release / touch of a far (delayed) task: conflict, as in memory.
        with pytest.raises(RequestError) as raised:
            await call(engine, lambda: engine.ack("far5"))
        assert raised.value.code == "conflict"
        assert in_memory(engine) == 1  # far2 alone, near went far
        # add_many naming a far id: exists, and nothing added.
        with pytest.raises(RequestError) as raised:
            await added_many(engine, [{"id": "m1", "topic": "t"}, {"id": "far5", "topic": "t"}])
        assert raised.value.code == "exists"
        assert await call(engine, lambda: engine.get("m1")) is None
        # Everything fires once, on time: far2 at 3, far at 500, far5 at 500, ...
        fired = await fire_until(engine, T0, T0 + 901)
        assert sorted((at - T0, name) for at, name in fired) == [
            (3.0, "far2"),
            (500.0, "far"),
            (500.0, "far5"),
            (800.0, "far3"),
            (900.0, "near"),
        ]
        assert engine.stats(T0 + 901)["tasks"] == 0
        assert await far_counts(store) == {}
        await store.close()

    asyncio.run(main())


def test_list_pages_over_both_tiers_with_one_cursor(store_url: str) -> None:
    async def main() -> None:
        store = open_store(store_url)
        await store.open()
        engine = await started(store)
        names = [f"n{i}" for i in range(7)] + [f"f{i}" for i in range(23)]
        for i, name in enumerate(names):
            add(engine, name, 5 + i if name[0] == "n" else 100 + i, topic="t" if i % 2 else "u")
        await engine.journal.drain()
        for query in ({}, {"topic": "t"}, {"state": "delayed"}, {"state": "ready"}):
            seen: list[str] = []
            cursor: Any = None
            while True:
                page = await call(
                    engine,
                    lambda q=query, c=cursor: engine.list_tasks({**q, "cursor": c, "limit": 4}),
                )
                seen += [task["id"] for task in page["tasks"]]
                cursor = page["next"]
                if cursor is None:
                    break
            expected = [
                name
                for i, name in enumerate(names)
                if query.get("topic") in (None, "t" if i % 2 else "u")
                and query.get("state") in (None, "delayed")
            ]
            assert sorted(seen) == sorted(expected), query
            assert len(seen) == len(set(seen))
        with pytest.raises(RequestError):
            await call(engine, lambda: engine.list_tasks({"cursor": "fx:y"}))
        await store.close()

    asyncio.run(main())


def test_a_store_written_before_the_horizon_is_moved_at_the_first_start(tmp_path: Path) -> None:
    """The upgrade: far tasks in the near tier move at the first start, a batch
    per write; a start that stops midway leaves the rest for the next one."""
    url = f"sqlite:///{tmp_path}/old.db"

    async def main() -> None:
        store = open_store(url)
        await store.open()
        old = await started(store, horizon_s=None)  # as the release before: all in memory
        for i in range(50):
            add(old, f"t{i}", 10 + 20 * i)
        await old.journal.drain()
        assert await far_counts(store) == {}
        await store.close()

        # A first start killed after its first write of far tasks.
        store = open_store(url)
        await store.open()
        engine = Engine(store, now_s=T0, horizon_s=HORIZON_S, **WHEEL)
        engine.horizon.start(T0)
        pushes = 0

        async def one_push_then_killed(records: list[tuple[str, bytes, float, str]]) -> None:
            nonlocal pushes
            pushes += 1
            if pushes > 1:
                raise KeyboardInterrupt  # the process ends here
            await engine.horizon.push(records)

        async def small_batches() -> Any:
            async for batch in store.load():
                for start in range(0, len(batch), 10):
                    yield batch[start : start + 10]

        with pytest.raises(KeyboardInterrupt):
            await engine.table.cold.load(small_batches(), T0 + 75, one_push_then_killed)
        moved = (await far_counts(store))["t"]
        assert 0 < moved < 46  # one batch's far tasks moved, the rest not yet
        await store.close()

        # The next start finishes the move.
        store = open_store(url)
        await store.open()
        engine = await started(store)
        assert engine.stats(T0)["tasks"] == 50
        assert engine.stats(T0)["wheel"]["far"] == 46  # due from T0 + 75: t4 .. t49
        assert in_memory(engine) == 4
        fired = await fire_until(engine, T0, T0 + 1000)
        assert [name for _, name in fired] == [f"t{i}" for i in range(50)]
        assert all(at == T0 + 10 + 20 * int(name[1:]) for at, name in fired)
        await store.close()

    asyncio.run(main())


def test_pulls_bring_tasks_a_horizon_ahead_in_batches(store_url: str, monkeypatch: Any) -> None:
    monkeypatch.setattr("delaywheel.engine.far_pull.PULL_BATCH", 7)

    async def main() -> None:
        store = open_store(store_url)
        await store.open()
        engine = await started(store)
        for i in range(100):  # many at one time: a batch boundary inside equal due times
            add(engine, f"t{i:03}", 200 + (i // 10) * 10)
        await engine.journal.drain()
        assert in_memory(engine) == 0
        # The pull starts once now + horizon reaches the watermark.
        assert engine.next_fire_s() == T0 + 15
        engine.advance(T0 + 150)
        assert engine.horizon.pulling is not None
        await engine.horizon.pulling
        assert engine.horizon.watermark_s == T0 + 150 + 75
        assert in_memory(engine) == 30  # due at 200, 210, 220
        fired = await fire_until(engine, T0 + 150, T0 + 300)
        assert len(fired) == 100 and len({name for _, name in fired}) == 100
        assert all(at == T0 + 200 + (int(name[1:]) // 10) * 10 for at, name in fired)
        await store.close()

    asyncio.run(main())


def test_a_horizon_below_two_minutes_is_refused() -> None:
    with pytest.raises(Exception, match="horizon must be at least 120 s"):
        Settings(horizon_s=60)
    assert Settings().horizon == 3600
    assert Settings(slots=10, tick_s=1).horizon == 3600  # a short lap: an hour still
    assert Settings(slots=7200, tick_s=1).horizon == 7200
    assert Settings(horizon_s=150).horizon == 150


def test_tiers_in_one_write(store_url: str) -> None:
    """The store's side (base.py, Tiers): far puts, was_far, blind puts."""

    async def main() -> None:
        store = open_store(store_url)
        await store.open()
        tiers = Tiers()
        tiers.far = {"a": (5.0, "x"), "b": (3.0, "y"), "c": (3.0, "x")}
        await store.write({"a": b"A", "b": b"B", "c": b"C", "n": b"N"}, tiers)
        assert await far_range(store, None, None, 10) == ["b", "c", "a"]
        assert await far_range(store, (3.0, "b"), 5.0, 10) == ["c"]
        assert await far_counts(store) == {"x": 2, "y": 1}
        assert await store.far_get(["a", "n", "z"]) == {"a": (5.0, b"A")}
        assert dict(await _loaded(store)) == {"n": b"N"}
        # blind: refused where either tier has the id; the rest applied.
        tiers = Tiers()
        tiers.blind = {"a", "n", "new"}
        await store.write({"a": b"A2", "n": b"N2", "new": b"W"}, tiers)
        assert tiers.conflicts == {"a", "n"}
        assert dict(await _loaded(store)) == {"n": b"N", "new": b"W"}
        # was_far: out of the far tier, to near or removed; counts follow.
        tiers = Tiers()
        tiers.was_far = {"a": "x", "b": "y"}
        await store.write({"a": b"A3", "b": None}, tiers)
        assert await far_counts(store) == {"x": 1}
        assert await store.far_get(["a", "b"]) == {}
        assert dict(await _loaded(store)) == {"n": b"N", "new": b"W", "a": b"A3"}
        await store.close()

    asyncio.run(main())


async def far_counts(store: Store) -> dict[str, int]:
    """The far tier's counts by topic over every lane (a Redis partition each)."""
    total: dict[str, int] = {}
    for lane in range(store.lanes):
        for topic, n in (await store.far_counts(lane)).items():
            total[topic] = total.get(topic, 0) + n
    return total


async def far_range(
    store: Store, after: tuple[float, str] | None, before_s: float | None, limit: int
) -> list[str]:
    """The far tier's ids over every lane, in (due, id) order."""
    found = []
    for lane in range(store.lanes):
        found += await store.far_range(lane, after, before_s, limit)
    return [task_id for task_id, _, _ in sorted(found, key=lambda r: (r[1], r[0]))[:limit]]


async def _loaded(store: Store) -> list[tuple[str, bytes]]:
    return [item async for batch in store.load() for item in batch]


def test_over_the_wire_far_tasks_answer_as_near_ones() -> None:
    """A real server and client: get, update, delete, add, list of far tasks
    go through the connection's store reads, in order, pipelined."""

    async def main() -> None:
        config = Settings(port=0, store_url="memory://", tick_s=0.05)
        store = open_store("memory://")
        await store.open()
        import time

        engine = Engine(store, now_s=time.time(), tick_s=0.05, horizon_s=120.0)
        await engine.load(store.load())
        server = Server(config, engine)
        host, port = await server.start()
        try:
            async with AsyncClient(host, port) as client:
                for i in range(20):
                    await client.add("t", i, id=f"f{i}", delay=1000 + i)
                assert len(engine.table.index) == 0
                assert (await client.get("f3"))["body"] == 3  # type: ignore[index]
                pipe = client.pipeline()
                pipe.delete("f4")
                pipe.add("t", "again", id="f4", delay=5)
                pipe.get("f4")
                pipe.update("f5", delay=2000)
                pipe.delete("nothing")
                pipe.add("t", "dup", id="f6")
                pipe.add_many([{"topic": "t", "id": "n1"}, {"topic": "t", "id": "f7"}])
                pipe.get("n1")
                answers = await pipe.execute(raise_on_error=False)
                assert answers[0] is True
                assert answers[1]["id"] == "f4"
                assert answers[2]["body"] == "again"
                assert answers[3]["at"] > time.time() + 1500
                assert answers[4] is False
                assert getattr(answers[5], "code", None) == "exists"
                # add_many: blind and together, exists from its write, none put.
                assert getattr(answers[6], "code", None) == "exists"
                assert "task 1: a task with id 'f7' already exists" in str(answers[6])
                assert answers[7] is None
                seen = [task["id"] async for task in client.iter_tasks()]
                assert sorted(seen) == sorted(f"f{i}" for i in range(20))
                stats = await client.stats()
                assert stats["tasks"] == 20 and stats["wheel"]["far"] == 19
        finally:
            await server.stop()
            await store.close()

    asyncio.run(main())


def test_no_horizon_on_a_store_without_a_far_tier() -> None:
    class Plain(type(open_store("memory://"))):  # type: ignore[misc]
        tiered = False

    async def main() -> None:
        store = Plain("memory://")
        await store.open()
        engine = await started(store)
        add(engine, "far", 5000)
        await engine.journal.drain()
        assert engine.horizon.on is False and engine.horizon.watermark_s == math.inf
        assert in_memory(engine) == 1

    asyncio.run(main())


class HorizonMachine(RuleBasedStateMachine):
    """Adds, updates, deletes, clock advances and restarts against a model
    (id -> due time): every task fires once, on time, never early."""

    url = "memory://"

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        if self.url != "memory://":
            self.url = f"sqlite:///{tempfile.mkdtemp()}/m.db"
        self.store = open_store(self.url)
        self.now_s = T0
        self.model: dict[str, float] = {}
        self.loop.run_until_complete(self.store.open())
        self.engine = self.loop.run_until_complete(started(self.store))

    def teardown(self) -> None:
        try:
            if self.model:  # the end: whatever is left fires, each once, on time
                self._check_fired(
                    self._run(
                        fire_until(self.engine, self.now_s + 0.5, max(self.model.values()) + 2)
                    )
                )
                assert not self.model, self.model
        finally:
            self.loop.run_until_complete(self.store.close())
            self.loop.close()

    def _check_fired(self, fired: list[tuple[float, str]]) -> None:
        for at_s, name in fired:
            due_s = self.model.pop(name)  # fired once: a second firing finds none
            assert due_s <= at_s < due_s + 1.5, (name, due_s - T0, at_s - T0)

    def _run(self, scenario: Awaitable[T]) -> T:
        return self.loop.run_until_complete(scenario)

    async def _written(self, verb: Callable[[], T]) -> T:
        """``verb`` run as the server runs it, its write awaited; its error raised."""
        result = await call(self.engine, verb)
        wait = self.engine.journal.pending()
        await self.engine.journal.drain()
        if wait is not None and wait.error is not None:
            raise RequestError(getattr(wait.error, "reply_code", "unavailable"), str(wait.error))
        return result

    @rule(name=IDS, delay_s=DELAYS)
    def add(self, name: str, delay_s: float) -> None:
        fields = {"id": name, "topic": "t", "delay": delay_s}
        try:
            self._run(self._written(lambda: self.engine.add(fields, self.now_s)))
        except RequestError as exc:
            assert exc.code == "exists" and name in self.model
            return
        assert name not in self.model
        self.model[name] = self.now_s + delay_s

    @rule(name=IDS, delay_s=DELAYS)
    def update(self, name: str, delay_s: float) -> None:
        try:
            self._run(
                self._written(lambda: self.engine.update(name, {"delay": delay_s}, self.now_s))
            )
        except RequestError as exc:
            assert exc.code == "not_found" and name not in self.model
            return
        self.model[name] = self.now_s + delay_s

    @rule(name=IDS)
    def delete(self, name: str) -> None:
        deleted = self._run(self._written(lambda: self.engine.delete(name)))
        assert deleted == (name in self.model)
        self.model.pop(name, None)

    @rule(step_s=st.sampled_from([0.5, 3.0, 20.0, 70.0, 200.0]))
    def advance(self, step_s: float) -> None:
        end_s = self.now_s + step_s
        self._check_fired(self._run(fire_until(self.engine, self.now_s + 0.5, end_s)))
        self.now_s = end_s

    @rule()
    def restart(self) -> None:
        self.store = self._run(reopened(self.store, self.url))
        self.engine = self._run(started(self.store, now_s=self.now_s))

    @invariant()
    def counts_agree(self) -> None:
        stats = self.engine.stats(self.now_s)
        assert stats["tasks"] == len(self.model)


class HorizonMachineSqlite(HorizonMachine):
    url = "sqlite"


TestHorizonMachine = HorizonMachine.TestCase
TestHorizonMachine.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None, derandomize=True
)
TestHorizonMachineSqlite = HorizonMachineSqlite.TestCase
TestHorizonMachineSqlite.settings = settings(
    max_examples=10, stateful_step_count=30, deadline=None, derandomize=True
)


def test_concurrent_changes_of_far_tasks_over_the_wire(tmp_path: Path) -> None:
    """Four clients add, move across the horizon and delete at once: a store
    read of one never misses what another's write just put back far."""

    async def worker(tag: str, address: tuple[str, int]) -> list[str]:
        wrong: list[str] = []
        async with AsyncClient(*address) as client:
            for i in range(300):
                task_id = f"{tag}-{i}"
                await client.add(tag, id=task_id, delay=(0, 3600, 3 * 86400)[i % 3])
                if i % 2:
                    await client.update(task_id, delay=2 * 86400 + i)
                if i % 5 == 1 and await client.delete(task_id) is not True:
                    wrong.append(task_id)
        return wrong

    async def main() -> None:
        import time

        url = f"sqlite:///{tmp_path}/c.db"
        store = open_store(url)
        await store.open()
        engine = Engine(store, now_s=time.time(), tick_s=0.05, horizon_s=3600.0)
        await engine.load(store.load())
        server = Server(Settings(port=0, store_url=url, tick_s=0.05), engine)
        address = await server.start()
        try:
            wrong = await asyncio.gather(*(worker(f"w{n}", address) for n in range(4)))
            assert wrong == [[], [], [], []]
            stats = engine.stats(time.time())
            assert stats["tasks"] == 4 * 240 and stats["wheel"]["far"] > 400
        finally:
            await server.stop()
            await store.close()

    asyncio.run(main())


def test_an_idle_server_pulls_and_fires_far_tasks_on_time() -> None:
    """Nothing but the ticker wakes the server: its pulls keep coming, and a
    far task is reserved at its time (a horizon of a second here)."""

    async def main() -> None:
        import time

        store = open_store("memory://")
        await store.open()
        engine = Engine(store, now_s=time.time(), slots=20, tick_s=0.05, horizon_s=1.0)
        await engine.load(store.load())
        server = Server(Settings(port=0, store_url="memory://", tick_s=0.05), engine)
        address = await server.start()
        try:
            async with AsyncClient(*address) as client:
                added = await client.add("t", "far", delay=2.3)
                assert len(engine.table.index) == 0 and engine.horizon.far_total == 1
                task = await client.reserve("t", timeout=5)
                late_s = time.time() - added["at"]
                assert task is not None and task["id"] == added["id"]
                assert 0 <= late_s < 0.3, late_s
        finally:
            await server.stop()
            await store.close()

    asyncio.run(main())


@pytest.mark.redis
def test_a_takeover_reads_a_partitions_far_tier_up_to_the_horizon(redis_url: str) -> None:
    """A node taking partitions (docs/ha.md) loads each one's tasks hash, then
    its far tier up to the watermark and its counts; handing them back
    forgets those counts. The coordinator's calls, made by hand."""

    async def main() -> None:
        store = open_store(redis_url, partitions=4)
        await store.open()
        before = await started(store)
        for i in range(40):
            add(before, f"t{i}", 30 + 30 * i)  # t0, t1 near; the rest far
        await before.journal.drain()
        await store.close()

        store = open_store(redis_url, partitions=4)
        await store.open()
        assert isinstance(store, RedisStore)
        node = Engine(store, now_s=T0, horizon_s=HORIZON_S, **WHEEL)
        for p in (0, 1):
            await node.load_partition(store.load_partition(p), p)
        mine = [f"t{i}" for i in range(40) if partition_of(f"t{i}", 4) in (0, 1)]
        stats = node.stats(T0)
        assert stats["tasks"] == len(mine)
        assert stats["wheel"]["far"] == len([n for n in mine if n not in ("t0", "t1")])
        far_one = next(n for n in mine if n not in ("t0", "t1"))
        assert (await call(node, lambda: node.get(far_one)))["id"] == far_one  # type: ignore[index]
        assert await call(node, lambda: node.delete(far_one)) is True
        await node.journal.drain()
        assert node.stats(T0)["tasks"] == len(mine) - 1
        node.drop_partitions([0, 1])
        stats = node.stats(T0)
        assert (stats["tasks"], stats["wheel"]["far"], stats["states"]["delayed"]) == (0, 0, 0)
        await store.close()

    asyncio.run(main())


@pytest.mark.redis
def test_a_handover_forgets_far_counts_a_step_per_topic(redis_url: str) -> None:
    """Handing a partition back forgets its far tier's counts in one step per
    topic, not one per far task: a partition whose counts say 30 million far
    tasks (the store's farcount hash, as a store with that many keeps it) is
    taken and handed back in well under the seconds a step per task took."""
    far = 30_000_000

    async def main() -> None:
        import time

        import redis.asyncio as aioredis

        store = open_store(redis_url, partitions=4)
        await store.open()
        assert isinstance(store, RedisStore)
        raw = aioredis.Redis.from_url(redis_url)
        try:
            far_counts = store.layout.partition(1).far_counts
            await raw.hset(far_counts, mapping={"a": far - 5, "b": 5})
        finally:
            await raw.aclose()
        node = Engine(store, now_s=T0, horizon_s=HORIZON_S, **WHEEL)
        for p in (0, 1):
            await node.load_partition(store.load_partition(p), p)
        stats = node.stats(T0)
        assert (stats["tasks"], stats["wheel"]["far"]) == (far, far)
        assert stats["topics"] == {"a": {"delayed": far - 5}, "b": {"delayed": 5}}
        started = time.perf_counter()
        node.drop_partitions([1])
        took_s = time.perf_counter() - started
        stats = node.stats(T0)
        assert (stats["tasks"], stats["wheel"]["far"], stats["states"]["delayed"]) == (0, 0, 0)
        assert stats["topics"] == {}
        assert took_s < 0.5, took_s  # a step per far task took 9.1 s here
        await store.close()

    asyncio.run(main())


def test_add_many_of_an_id_only_the_far_tier_holds_answers_exists_from_its_write(
    store_url: str,
) -> None:
    """``add_many`` naming an id that only the far tier holds needs no read of
    the store: its tasks are put blind, together, in the write that answers
    it (``exists`` for that id, by its index, and none of the batch put); a
    batch of ids the store does not hold is added by the same one write."""

    async def main() -> None:
        store = open_store(store_url)
        await store.open()
        engine = await started(store)
        add(engine, "far", 500)
        await engine.journal.drain()
        assert in_memory(engine) == 0 and engine.horizon.far_total == 1
        # On Redis, ids of far's partition (a group is one partition's write),
        # and no id made by the server (it may fall in any partition served).
        lane_of, lanes = engine.horizon.lane_of, engine.horizon.lanes
        m1, m2 = [name for n in range(2000) if lane_of(name := f"m{n}") == lane_of("far")][:2]
        made = [{"topic": "t"}] if lanes == 1 else [{"id": m2, "topic": "t"}]
        batch = [{"id": m1, "topic": "t"}, {"id": "far", "topic": "t"}, *made]
        engine.add_many(batch, T0)  # no NeedsStore: nothing to read first
        wait = engine.journal.pending()
        assert wait is not None
        await engine.journal.drain()
        assert wait.error is not None
        assert str(wait.error) == "task 1: a task with id 'far' already exists"
        assert engine.horizon.fetched == [] and not engine.horizon.unconfirmed
        stats = engine.stats(T0)
        assert (stats["tasks"], stats["wheel"]["far"], engine.events.added) == (1, 1, 1)
        for name in (m1, m2):
            assert await call(engine, lambda name=name: engine.get(name)) is None
        assert (await call(engine, lambda: engine.get("far")))["at"] == T0 + 500  # type: ignore[index]
        # The batch without the far id: one write adds the others.
        added = engine.add_many([batch[0], *made], T0)
        wait = engine.journal.pending()
        await engine.journal.drain()
        assert wait is not None and wait.error is None
        assert in_memory(engine) == 2 and engine.stats(T0)["tasks"] == 3
        fired = [name for _, name in await fire_until(engine, T0, T0 + 501)]
        assert sorted(fired) == sorted(["far", *(task["id"] for task in added)])
        await store.close()

    asyncio.run(main())
