"""The engine's lifecycle rules, driven by a manual clock (no sleeping)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgpack  # type: ignore[import-untyped, unused-ignore]
import pytest
from hypothesis import given
from hypothesis import strategies as st

from delaywheel.config import Settings
from delaywheel.engine.engine import Engine
from delaywheel.engine.queues import Waiter
from delaywheel.engine.record import TOPIC_FIELD, from_record, read_record, to_record
from delaywheel.engine.retry import RetryPolicy
from delaywheel.engine.task import CHANGEABLE, STATES, TRANSITIONS, Task
from delaywheel.engine.validate import Limits
from delaywheel.errors import RequestError
from delaywheel.store.memory import MemoryStore

T0 = 1_800_000_000.0


def run(scenario: Callable[[Engine, MemoryStore], Awaitable[None]], **kwargs: Any) -> None:
    async def main() -> None:
        store = MemoryStore("memory://")
        await store.open()
        engine = Engine(store, now_s=T0, **kwargs)
        await scenario(engine, store)
        await engine.journal.drain()

    asyncio.run(main())


async def durable(engine: Engine) -> None:
    await engine.journal.drain()


async def stored_ids(store: MemoryStore) -> set[str]:
    return {task_id async for batch in store.load() for task_id, _ in batch}


def code_of(call: Callable[[], object]) -> str:
    try:
        call()
    except RequestError as exc:
        return exc.code
    raise AssertionError("no error raised")


def test_add_then_due_then_reserve_then_ack() -> None:
    async def scenario(engine: Engine, store: MemoryStore) -> None:
        added = engine.add({"topic": "mail", "delay": 30, "body": b"\x00hi"}, T0)
        assert added["cycle"] == 0 and added["at"] == T0 + 30
        assert engine.try_reserve(["mail"], T0) is None
        assert engine.advance(T0 + 29.5) == 0
        assert engine.advance(T0 + 30) == 1
        task = engine.try_reserve("mail", T0 + 30)
        assert task is not None
        assert (task["state"], task["attempts"], task["body"]) == ("reserved", 1, b"\x00hi")
        assert task["deadline"] == T0 + 30 + 60
        await durable(engine)
        assert added["id"] in await stored_ids(store)
        assert engine.ack(task["id"]) is True
        await durable(engine)
        assert engine.get(task["id"]) is None
        assert added["id"] not in await stored_ids(store)

    run(scenario)


def test_kick_task_kicks_one_dead_task_by_id() -> None:
    async def scenario(engine: Engine, store: MemoryStore) -> None:
        for name in ("a", "b"):
            engine.add({"id": name, "topic": "t", "ttr": 5, "max_attempts": 1}, T0)
            assert engine.try_reserve(["t"], T0) is not None
        engine.advance(T0 + 5)
        assert [engine.get(n)["state"] for n in "ab"] == ["dead", "dead"]  # type: ignore[index]
        assert engine.kick_task("b", T0 + 6) is True
        kicked = engine.get("b")
        assert kicked is not None and (kicked["state"], kicked["attempts"]) == ("ready", 0)
        assert engine.get("a")["state"] == "dead"  # type: ignore[index]
        assert engine.events.kicked == 1
        assert code_of(lambda: engine.kick_task("b", T0 + 6)) == "conflict"
        assert code_of(lambda: engine.kick_task("nope", T0 + 6)) == "not_found"
        assert code_of(lambda: engine.kick_task(5, T0 + 6)) == "bad_request"
        await durable(engine)
        assert "b" in await stored_ids(store)

    run(scenario)


def test_ready_queue_gives_oldest_due_first_across_topics() -> None:
    async def scenario(engine: Engine, store: MemoryStore) -> None:
        engine.add({"id": "late", "topic": "a", "at": T0 - 10}, T0)
        engine.add({"id": "early", "topic": "b", "at": T0 - 50}, T0)
        engine.add({"id": "mid", "topic": "a", "at": T0 - 20}, T0)
        order = [engine.try_reserve(["a", "b"], T0)["id"] for _ in range(3)]  # type: ignore[index]
        assert order == ["early", "mid", "late"]

    run(scenario)


def test_ttr_expiry_redelivers_then_dead_then_kick() -> None:
    async def scenario(engine: Engine, store: MemoryStore) -> None:
        engine.add({"id": "j", "topic": "t", "ttr": 5, "max_attempts": 2}, T0)
        first = engine.try_reserve(["t"], T0)
        assert first is not None and first["attempts"] == 1
        engine.advance(T0 + 4)
        assert engine.get("j")["state"] == "reserved"  # type: ignore[index]
        engine.advance(T0 + 5)
        assert engine.get("j")["state"] == "ready"  # type: ignore[index]
        second = engine.try_reserve(["t"], T0 + 5)
        assert second is not None and second["attempts"] == 2
        engine.advance(T0 + 10)
        assert engine.get("j")["state"] == "dead"  # type: ignore[index]
        assert engine.try_reserve(["t"], T0 + 10) is None
        assert engine.kick("t", 10, T0 + 11) == 1
        kicked = engine.get("j")
        assert kicked is not None and (kicked["state"], kicked["attempts"]) == ("ready", 0)

    run(scenario)


def test_touch_extends_and_release_delays() -> None:
    async def scenario(engine: Engine, store: MemoryStore) -> None:
        engine.add({"id": "j", "topic": "t", "ttr": 10}, T0)
        engine.try_reserve(["t"], T0)
        assert engine.touch("j", T0 + 8) == T0 + 18
        engine.advance(T0 + 12)
        assert engine.get("j")["state"] == "reserved"  # type: ignore[index]
        assert engine.release("j", 30, T0 + 12) is True
        task = engine.get("j")
        assert task is not None and (task["state"], task["at"]) == ("delayed", T0 + 42)
        assert code_of(lambda: engine.touch("j", T0 + 13)) == "conflict"
        engine.advance(T0 + 42)
        assert engine.try_reserve(["t"], T0 + 42) is not None
        assert code_of(lambda: engine.touch("j", T0 + 53)) == "conflict"  # deadline passed

    run(scenario)


def test_release_on_last_attempt_is_dead() -> None:
    async def scenario(engine: Engine, store: MemoryStore) -> None:
        engine.add({"id": "j", "topic": "t", "max_attempts": 1}, T0)
        engine.try_reserve(["t"], T0)
        engine.release("j", 0, T0)
        assert engine.get("j")["state"] == "dead"  # type: ignore[index]

    run(scenario)


def test_ttr_zero_is_at_most_once() -> None:
    async def scenario(engine: Engine, store: MemoryStore) -> None:
        engine.add({"id": "j", "topic": "t", "ttr": 0}, T0)
        task = engine.try_reserve(["t"], T0)
        assert task is not None and task["state"] == "gone"
        assert engine.get("j") is None
        assert code_of(lambda: engine.ack("j")) == "not_found"
        await durable(engine)
        assert "j" not in await stored_ids(store)

    run(scenario)


def test_update_moves_the_task_in_the_wheel() -> None:
    async def scenario(engine: Engine, store: MemoryStore) -> None:
        engine.add({"id": "j", "topic": "t", "delay": 7200}, T0)
        assert engine.get("j")["cycle"] == 2  # type: ignore[index]
        updated = engine.update("j", {"delay": 10, "body": "new", "topic": "u"}, T0)
        assert (updated["cycle"], updated["topic"], updated["body"]) == (0, "u", "new")
        engine.advance(T0 + 10)
        assert engine.try_reserve(["u"], T0 + 10) is not None
        assert code_of(lambda: engine.update("j", {"delay": 5}, T0 + 10)) == "conflict"

    run(scenario)


def test_add_many_is_all_or_nothing() -> None:
    async def scenario(engine: Engine, store: MemoryStore) -> None:
        engine.add({"id": "taken", "topic": "t"}, T0)
        batch = [{"id": "a", "topic": "t"}, {"id": "taken", "topic": "t"}]
        assert code_of(lambda: engine.add_many(batch, T0)) == "exists"
        assert code_of(lambda: engine.add_many([{"topic": "t"}, {"topic": ""}], T0)) == (
            "bad_request"
        )
        assert engine.get("a") is None
        assert len(engine.add_many([{"topic": "t"}] * 3, T0)) == 3

    run(scenario)


def test_list_pages_with_filters_and_cursor() -> None:
    async def scenario(engine: Engine, store: MemoryStore) -> None:
        for i in range(25):
            engine.add({"id": f"t{i:02}", "topic": "even" if i % 2 == 0 else "odd"}, T0)
        engine.delete("t04")
        seen: list[str] = []
        cursor = None
        while True:
            page = engine.list_tasks({"topic": "even", "limit": 4, "cursor": cursor})
            seen += [task["id"] for task in page["tasks"]]
            cursor = page["next"]
            if cursor is None:
                break
        assert seen == [f"t{i:02}" for i in range(0, 25, 2) if i != 4]

    run(scenario)


def test_blocked_reserves_are_served_first_come_first_served() -> None:
    async def scenario(engine: Engine, store: MemoryStore) -> None:
        got: list[tuple[str, str]] = []
        for name in ("w1", "w2", "w3"):
            engine.wait_reserve(
                Waiter(["a", "b"], lambda task, n=name: got.append((n, task["id"])))
            )
        cancelled = Waiter(["a"], lambda task: got.append(("cancelled", task["id"])))
        engine.wait_reserve(cancelled)
        engine.cancel_wait(cancelled)
        engine.add({"id": "x", "topic": "b"}, T0)
        engine.add({"id": "y", "topic": "a", "delay": 1}, T0)
        engine.advance(T0 + 1)
        assert got == [("w1", "x"), ("w2", "y")]
        assert engine.queues.waiter_count() == 1

    run(scenario)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"delay": 1}, "no topic"),
        ({"topic": ""}, "topic must be"),
        ({"topic": "t", "delay": -1}, "delay must be"),
        ({"topic": "t", "delay": 1, "at": 5}, "not both"),
        ({"topic": "t", "ttr": "soon"}, "ttr must be"),
        ({"topic": "t", "max_attempts": 0}, "max_attempts"),
        ({"topic": "t", "id": "x" * 201}, "id must be"),
        ({"topic": "t", "target": {"type": "http", "url": "ftp://x/"}}, "url"),
        ({"topic": "t", "target": {"type": "mail"}}, "target"),
        ({"topic": "t", "colour": "red"}, "unknown field 'colour'"),
        ({"topic": "t", "delay": 11 * 365 * 86400}, "delay must be"),
    ],
)
def test_bad_tasks_name_the_field(fields: dict[str, Any], message: str) -> None:
    async def scenario(engine: Engine, store: MemoryStore) -> None:
        with pytest.raises(RequestError, match=message) as info:
            engine.add(fields, T0)
        assert info.value.code == "bad_request"
        assert engine.stats(T0)["tasks"] == 0

    run(scenario)


def test_body_over_the_limit_is_too_large() -> None:
    async def scenario(engine: Engine, store: MemoryStore) -> None:
        with pytest.raises(RequestError, match="1024-byte limit") as info:
            engine.add({"topic": "t", "body": b"x" * 1100}, T0)
        assert info.value.code == "too_large"

    run(scenario, limits=Limits(max_body_bytes=1024))


def test_recovery_rebuilds_every_state() -> None:
    async def scenario(engine: Engine, store: MemoryStore) -> None:
        engine.add({"id": "delayed", "topic": "t", "delay": 100}, T0)
        engine.add({"id": "ready", "topic": "t"}, T0)
        engine.add({"id": "reserved", "topic": "r", "ttr": 30}, T0)
        engine.try_reserve(["r"], T0)
        engine.add({"id": "dead", "topic": "d", "max_attempts": 1}, T0)
        engine.try_reserve(["d"], T0)
        engine.release("dead", 0, T0)
        await durable(engine)
        again = Engine(store, now_s=T0 + 50)
        assert await again.load(store.load()) == 4
        states = {i: again.get(i)["state"] for i in ("delayed", "ready", "reserved", "dead")}  # type: ignore[index]
        assert states == {
            "delayed": "delayed",
            "ready": "ready",
            "reserved": "reserved",
            "dead": "dead",
        }
        again.advance(T0 + 50)  # the reservation's deadline (T0 + 30) passed while down
        assert again.get("reserved")["state"] == "ready"  # type: ignore[index]
        assert again.advance(T0 + 100) == 1

    run(scenario)


times = st.floats(allow_nan=False, allow_infinity=False)


@given(
    state=st.sampled_from(STATES),
    topic=st.text(max_size=20),
    at_s=times,
    deadline_s=times,
    created_s=times | st.integers(0, 2**40),
    ttr_s=times | st.integers(0, 2**31),
    attempts=st.integers(0, 2**31),
    max_attempts=st.integers(1, 2**31),
    body=st.binary(max_size=50),
)
def test_a_record_gives_back_every_field(
    state: str,
    topic: str,
    at_s: float,
    deadline_s: float,
    created_s: float,
    ttr_s: float,
    attempts: int,
    max_attempts: int,
    body: bytes,
) -> None:
    task = Task(
        "id-1",
        topic,
        at_s,
        body_packed=body,
        ttr_s=ttr_s,
        max_attempts=max_attempts,
        created_s=created_s,
        attempts=attempts,
        state=state,
        deadline_s=deadline_s,
    )
    again = from_record("id-1", to_record(task))
    assert again.id == "id-1"
    assert again.created_s == created_s
    assert again.snapshot() == task.snapshot(), CHANGEABLE


def test_a_record_holds_a_whole_ttr_and_no_deadline_as_ints() -> None:
    task = Task("id-1", "t", T0 + 10, body_packed=b"\xc0", ttr_s=60.0, max_attempts=3, created_s=T0)
    task.state = "delayed"
    fields = msgpack.unpackb(to_record(task))
    assert fields[0] == 5
    assert (fields[6], fields[8]) == (60, 0)
    assert (type(fields[6]), type(fields[8])) == (int, int)
    task.ttr_s, task.deadline_s = 2.5, T0 + 5
    fields = msgpack.unpackb(to_record(task))
    assert (fields[6], fields[8]) == (2.5, T0 + 5)


def test_load_skips_each_kind_of_corrupt_record(caplog: pytest.LogCaptureFixture) -> None:
    def record(**changes: Any) -> bytes:
        """A version 3 record (the current format), with ``changes``."""
        fields = {
            "version": 3,
            "topic": "t",
            "state": 0,  # delayed
            "at": T0 + 10,
            "created": T0,
            "attempts": 0,
            "ttr": 60,  # whole: an int since version 3
            "max_attempts": 3,
            "deadline": 0,
            "body": b"\xc0",
        }
        fields.update(changes)
        return msgpack.packb(tuple(fields.values()))  # type: ignore[no-any-return]

    def record_v1(task_id: str, state: str = "delayed") -> bytes:
        """The version 1 format, which held the id and the state's name."""
        fields = (1, task_id, "t", state, T0 + 20, T0, 0, 60.0, 3, 0.0, b"\xc0")
        return msgpack.packb(fields)  # type: ignore[no-any-return]

    corrupt = {
        "bytes": b"\x93not a record",
        "int": msgpack.packb(5),
        "short": msgpack.packb((2, "t", 0)),
        "version": record(version=99),
        "state": record(state=7),
        "state-map": record(state={"a": 1}),
        "state-name": record(state="delayed"),
        "at-inf": record(at=float("inf")),
        "deadline-nan": record(state=2, deadline=float("nan")),
        "at-str": record(at="soon"),
        "v1-other-id": record_v1("someone-else"),
        "v1-state": record_v1("v1-state", state="sleeping"),
    }
    good = {
        "delayed": record(),
        "reserved": record(state=2, deadline=T0 + 5),
        "ready": record(state=1, at=T0),
        "v1-delayed": record_v1("v1-delayed"),
        "v2-ready": record(version=2, state=1, at=T0, ttr=30.0, deadline=0.0),
        "far": record(at=T0 + 10_000.0),  # laps away: loaded packed
    }

    async def batches() -> AsyncIterator[list[tuple[str, bytes]]]:
        yield list(corrupt.items())[:6] + list(good.items())
        yield list(corrupt.items())[6:]

    async def scenario(engine: Engine, store: MemoryStore) -> None:
        with caplog.at_level(logging.ERROR, logger="delaywheel"):
            assert await engine.load(batches()) == len(good)
        for task_id in corrupt:
            assert f"skipping corrupt record for task {task_id!r}" in caplog.text
            assert engine.get(task_id) is None
        assert "at inf" in caplog.text and "deadline nan" in caplog.text
        assert engine.stats(T0)["tasks"] == len(good)
        assert engine.stats(T0)["wheel"]["packed"] == 1
        assert engine.get("far")["at"] == T0 + 10_000.0  # type: ignore[index]
        assert engine.get("delayed")["ttr"] == 60.0  # type: ignore[index]
        assert type(engine.get("delayed")["ttr"]) is float  # type: ignore[index]
        assert engine.try_reserve(["t"], T0)["id"] == "ready"  # type: ignore[index]
        assert engine.try_reserve(["t"], T0)["ttr"] == 30.0  # type: ignore[index]
        assert engine.advance(T0 + 5) == 1  # the reservation expires: ready again
        assert engine.advance(T0 + 10) == 1  # and the delayed task falls due
        assert engine.advance(T0 + 20) == 1  # and the one from a version 1 record

    run(scenario)


def test_every_transition_in_the_table_is_reachable_and_others_conflict() -> None:
    events = {event for _, event in TRANSITIONS}
    assert events == {
        "add",
        "due",
        "reserve",
        "ack",
        "release",
        "expire",
        "touch",
        "kick",
        "update",
        "delete",
        # A targeted task's: reached in tests/test_engine_deliveries.py.
        "deliver",
        "delivered",
        "fail",
        # A done (or, with --dead-retention, dead) task's time running out:
        # reached in tests/test_results.py and tests/test_results_engine.py.
        "lapse",
    }

    async def scenario(engine: Engine, store: MemoryStore) -> None:
        engine.add({"id": "d", "topic": "t", "delay": 100}, T0)
        assert code_of(lambda: engine.ack("d")) == "conflict"
        assert code_of(lambda: engine.release("d", 0, T0)) == "conflict"
        assert code_of(lambda: engine.kick("t", 1, T0) or engine.touch("d", T0)) == "conflict"

    run(scenario)


def test_index_restores_a_task_dropped_by_compaction_in_its_place() -> None:
    from delaywheel.engine.index import TaskIndex

    index = TaskIndex(thaw=from_record)  # nothing is packed here
    tasks = [
        Task(f"t{i}", "t", 0.0, body_packed=b"\xc0", ttr_s=1, max_attempts=1, created_s=0)
        for i in range(3000)
    ]
    for task in tasks[:2000]:
        index.add(task)
    for task in tasks[:1900]:
        index.remove(task)
    for task in tasks[2000:]:
        index.add(task)  # compacts: the removed ones leave the order list
    index.restore(tasks[5])  # an undone delete
    page, _ = index.page(0, lambda task: True, 3, 10_000)
    assert [task.id for task in page] == ["t5", "t1900", "t1901"]


def test_list_shows_a_task_whose_delete_was_undone() -> None:
    async def scenario(engine: Engine, store: MemoryStore) -> None:
        engine.add({"id": "a", "topic": "t"}, T0)
        engine.add({"id": "b", "topic": "t"}, T0)
        await durable(engine)
        batch_before = engine.journal.pending()
        assert batch_before is None
        engine.delete("a")
        batch = engine.journal.pending()
        assert batch is not None
        engine.table.rollback(list(reversed(batch.undo)))  # as the journal does when a write fails
        assert [t["id"] for t in engine.list_tasks({})["tasks"]] == ["a", "b"]
        assert engine.stats(T0)["states"]["ready"] == 2

    run(scenario)


def test_a_rollback_leaves_alone_a_task_dropped_since() -> None:
    """A batch that fails after its task's partition was dropped (a self-fence):
    the table's object is gone, so the rollback must not put it back."""

    async def scenario(engine: Engine, store: MemoryStore) -> None:
        engine.add({"id": "a", "topic": "t", "delay": 60}, T0)
        await durable(engine)
        engine.update("a", {"delay": 10}, T0)
        batch = engine.journal.pending()
        assert batch is not None
        engine.table.drop(lambda task_id: task_id == "a")
        engine.table.rollback(list(reversed(batch.undo)))  # raised KeyError, or put it back
        assert engine.get("a") is None
        assert engine.stats(T0)["states"].get("delayed", 0) == 0

    run(scenario)


def test_only_topics_that_got_a_task_are_looked_at_for_waiters() -> None:
    # With many idle consumers, an add must not scan every waiting topic.
    from delaywheel.engine.queues import Queues
    from delaywheel.engine.task import READY, Task

    queues = Queues()
    for i in range(1000):
        queues.add_waiter(Waiter([f"t{i}"], lambda task: None))
    task = Task(
        "x", "t5", 0.0, body_packed=b"\xc0", ttr_s=1, max_attempts=1, created_s=0, state=READY
    )
    queues.push_ready(task)
    other = Task(
        "y",
        "nobody-waits",
        0.0,
        body_packed=b"\xc0",
        ttr_s=1,
        max_attempts=1,
        created_s=0,
        state=READY,
    )
    queues.push_ready(other)
    assert queues.waiting_topics() == ["t5"]
    assert queues.waiting_topics() == []  # reported once


def test_a_burst_is_made_ready_a_batch_per_advance(monkeypatch: pytest.MonkeyPatch) -> None:
    import delaywheel.engine.firing

    monkeypatch.setattr(delaywheel.engine.firing, "FIRE_BATCH", 4)

    async def scenario(engine: Engine, store: MemoryStore) -> None:
        for i in range(10):
            engine.add({"id": f"b{i}", "topic": "t", "at": T0 + 30 + i / 100}, T0)
        engine.add({"id": "later", "topic": "t", "at": T0 + 31.5}, T0)
        counts = []
        while True:
            counts.append(engine.advance(T0 + 31))
            next_s = engine.next_fire_s()
            assert next_s is not None
            if next_s > T0 + 31:
                break
        assert counts == [4, 4, 2]
        order = [engine.try_reserve(["t"], T0 + 31)["id"] for _ in range(10)]  # type: ignore[index]
        assert order == [f"b{i}" for i in range(10)]
        assert engine.get("later")["state"] == "delayed"  # type: ignore[index]

    run(scenario)


@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("push"), st.integers(0, 20)),  # a due time (few: many ties)
            st.tuples(st.just("drop"), st.integers(0, 1000)),  # which live task
            st.tuples(st.just("take"), st.just(0)),  # reserve the head
        ),
        max_size=300,
    )
)
def test_a_ready_queue_gives_the_oldest_due_first_in_and_out_of_order(ops: list[Any]) -> None:
    """The run-plus-heap ready queue against a plain sort: whatever the order
    tasks become ready in, the head is the live task with the least (at, seq)."""
    from delaywheel.engine.queues import Queues
    from delaywheel.engine.task import READY

    queues = Queues()
    live: list[Task] = []
    made = 0
    for op, value in ops:
        if op == "push":
            made += 1
            task = Task(
                f"t{made}", "t", float(value), body_packed=b"\xc0", ttr_s=1,
                max_attempts=1, created_s=0, state=READY,
            )  # fmt: skip
            queues.push_ready(task)
            live.append(task)
        elif op == "drop" and live:
            task = live.pop(value % len(live))
            queues.drop_ready(task)
            task.state = "gone"
        elif op == "take" and live:
            head = queues.oldest_ready(["t"])
            assert head is min(live, key=lambda t: (t.at_s, t.queue_seq))
            live.remove(head)
            queues.drop_ready(head)
            head.state = "gone"
        expected = min(live, key=lambda t: (t.at_s, t.queue_seq)) if live else None
        assert queues.oldest_ready(["t"]) is expected


def test_the_settings_defaults_are_the_engines_own() -> None:
    """Each limit and retry default is defined once, by the engine, and the
    settings (which the CLI's flags default to) take it from there."""
    settings = Settings()
    assert settings.limits == Limits()
    policy = RetryPolicy()
    assert (settings.retry_base_s, settings.retry_cap_s) == (policy.base_s, policy.cap_s)


def test_a_node_of_a_shared_keyspace_serves_only_its_partitions() -> None:
    """Issue 16, routing: ``add`` without an id gets one in a partition this node
    serves; an id elsewhere is ``moved`` (the owner known) or ``tryagain`` (none);
    with no partition served, an id-less ``add`` is ``tryagain`` too."""
    from delaywheel_client.partitions import partition_of

    from delaywheel.ha.sharing import Owner, Sharing

    sharing = Sharing(node="a", address="10.0.0.1:3450", partitions=16, lease_s=10.0)

    async def scenario(engine: Engine, store: MemoryStore) -> None:
        assert code_of(lambda: engine.add({"topic": "t"}, T0)) == "tryagain"  # serves none yet
        sharing.serve(3, 7)
        sharing.serve(11, 2)
        sharing.owners[5] = Owner("b", "10.0.0.2:3450", 4)
        made = [engine.add({"topic": "t"}, T0)["id"] for _ in range(50)]
        assert {partition_of(i, 16) for i in made} == {3, 11}  # both, and only those
        moved_id = next(f"x{n}" for n in range(1000) if partition_of(f"x{n}", 16) == 5)
        free_id = next(f"x{n}" for n in range(1000) if partition_of(f"x{n}", 16) == 6)
        for call in (
            lambda: engine.add({"id": moved_id, "topic": "t"}, T0),
            lambda: engine.get(moved_id),
            lambda: engine.ack(moved_id),
        ):
            with pytest.raises(RequestError) as moved:
                call()
            assert moved.value.code == "moved"
            assert moved.value.data == {"partition": 5, "owner": "10.0.0.2:3450", "epoch": 4}
        with pytest.raises(RequestError) as tryagain:
            engine.get(free_id)
        assert tryagain.value.code == "tryagain"
        assert tryagain.value.data == {"partition": 6, "retry_after_ms": 250}

    run(scenario, ownership=sharing)


def test_a_node_that_owns_every_partition_asks_its_ownership_nothing_per_request() -> None:
    """The ownership interface's short cut (delaywheel/ha/ownership.py): while
    ``owns_all`` holds (a single node always, a node of several serving every
    partition), add, get and ack make no call to it: no hash, no call per
    request. Served partitions come and go through ``serve`` and ``unserve``,
    which keep ``owns_all`` true to them."""
    from delaywheel.ha.ownership import WholeKeyspace
    from delaywheel.ha.sharing import Sharing

    asked: list[str] = []

    class Counting(WholeKeyspace):
        def check(self, task_id: str) -> None:
            asked.append(task_id)

        def new_id(self, first: str, more: Callable[[], str]) -> str:
            asked.append(first)
            return first

    sharing = Sharing(node="a", address="10.0.0.1:3450", partitions=2, lease_s=10.0)
    assert not sharing.owns_all
    sharing.serve(0, 1)
    assert not sharing.owns_all and sharing.owners[0].node == "a"
    sharing.serve(1, 1)
    assert sharing.owns_all and sharing.owns("any id") and sharing.epoch_of("any id") == 1

    async def scenario(engine: Engine, store: MemoryStore) -> None:
        made = engine.add({"topic": "t"}, T0)["id"]
        engine.add({"topic": "t", "id": "given"}, T0)
        assert engine.get("given") is not None and engine.get(made) is not None
        reserved = engine.try_reserve(["t"], T0)
        assert reserved is not None and engine.ack(reserved["id"])
        assert asked == []

    run(scenario, ownership=Counting())
    run(scenario)  # no ownership given: the whole keyspace
    assert sharing.unserve(1) == 1 and not sharing.owns_all and sharing.unserve(1) is None


def test_partitions_handed_back_together_leave_in_one_drop() -> None:
    """A handoff of several partitions drops all their tasks in one pass and
    leaves the others; ``among`` looks only at the ids it is given (the second
    step of a handoff: the attempts kept in flight)."""
    from delaywheel_client.partitions import partition_of

    from delaywheel.ha.sharing import Sharing

    sharing = Sharing(node="a", address="10.0.0.1:3450", partitions=16, lease_s=10.0)

    async def scenario(engine: Engine, store: MemoryStore) -> None:
        for partition in (3, 5, 11):
            sharing.serve(partition, 1)
        made = [engine.add({"topic": "t", "delay": 5 * (n % 2)}, T0)["id"] for n in range(90)]
        by_partition = {p: {i for i in made if partition_of(i, 16) == p} for p in (3, 5, 11)}
        assert all(by_partition.values())
        assert engine.drop_partitions({3, 11}) == []  # none in flight
        assert set(engine.table.index.by_id) == by_partition[5]
        stats = engine.stats(T0)
        assert stats["tasks"] == sum(stats["states"].values()) == len(by_partition[5])
        one, *rest = sorted(by_partition[5])
        engine.drop_partitions({5}, among=[one, "not-a-task"])
        assert set(engine.table.index.by_id) == set(rest)

    run(scenario, ownership=sharing)


def test_an_exists_rewrite_never_undoes_a_later_change_of_its_batch() -> None:
    """``exists`` journals the task's record again; a delete or an update of the
    task in the same batch must win over that rewrite in the store (a task in
    the wheel and a packed one)."""

    async def scenario(engine: Engine, store: MemoryStore) -> None:
        engine.add({"topic": "t", "id": "near", "delay": 30}, T0)
        engine.add({"topic": "t", "id": "far", "delay": 7 * 86_400}, T0)
        await durable(engine)
        for task_id in ("near", "far"):
            assert code_of(lambda t=task_id: engine.add({"topic": "t", "id": t}, T0)) == "exists"
        assert engine.delete("near") is True
        engine.update("far", {"topic": "moved"}, T0)
        await durable(engine)
        assert await stored_ids(store) == {"far"}
        records = {task_id: record async for batch in store.load() for task_id, record in batch}
        assert read_record("far", records["far"])[TOPIC_FIELD] == "moved"

    run(scenario)
