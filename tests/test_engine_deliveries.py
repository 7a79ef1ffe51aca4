"""Targeted tasks in the engine: attempts journaled, outcomes, retries, dead, kick, restart.

The engine is driven with a manual clock. ``send_at_once`` stands in for the
dispatcher's lanes with room for everything: each due task's attempt is
begun at once and what would be sent is collected; outcomes go back through
``Engine.delivered`` as the dispatcher reports them. The lanes themselves
and real sending are in tests/test_deliveries.py.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgpack  # type: ignore[import-untyped, unused-ignore]
import pytest
from conftest import RedisServer
from helpers import load_all

from delaywheel.delivery.allow import AllowList
from delaywheel.delivery.base import Delivery
from delaywheel.delivery.brokers import CONNECT_TIMEOUT_S, SEND_TIMEOUT_S
from delaywheel.delivery.targets import TargetRules
from delaywheel.engine.attempts import attempt_bound_s
from delaywheel.engine.engine import Engine
from delaywheel.engine.record import from_record, read_record, to_record
from delaywheel.engine.retry import RetryPolicy
from delaywheel.errors import RequestError
from delaywheel.ha.sharing import Sharing
from delaywheel.store import open_store
from delaywheel.store.memory import MemoryStore

T0 = 1_800_000_000.0
URL = "http://127.0.0.1:9/hook"
HTTP = {"type": "http", "url": URL}


def rules() -> TargetRules:
    return TargetRules(AllowList.parse("127.0.0.1"))


def make_engine(store: MemoryStore, **kwargs: Any) -> Engine:
    kwargs.setdefault("retry", RetryPolicy(jitter=lambda: 0.0))
    return Engine(store, now_s=T0, targets=rules(), **kwargs)


def send_at_once(engine: Engine, sent: list[Delivery]) -> None:
    """Begin every due task's attempt as it is queued; collect what is to be sent."""

    def ready(delivery: Delivery | None) -> bool:
        if delivery is not None:
            sent.append(delivery)
        return delivery is not None

    engine.start_deliveries(lambda task_id, *_: engine.attempts.begin(task_id, ready) and None)


def run(scenario: Callable[[Engine, MemoryStore, list[Delivery]], Awaitable[None]]) -> None:
    async def main() -> None:
        store = MemoryStore("memory://")
        await store.open()
        engine = make_engine(store)
        sent: list[Delivery] = []
        send_at_once(engine, sent)
        await scenario(engine, store, sent)
        await engine.journal.drain()

    asyncio.run(main())


async def stored(store: MemoryStore, task_id: str) -> tuple[Any, ...] | None:
    for batch in [batch async for batch in store.load()]:
        for found_id, record in batch:
            if found_id == task_id:
                return read_record(found_id, record)
    return None


def test_a_targeted_task_is_sent_once_its_attempt_is_durable() -> None:
    async def scenario(engine: Engine, store: MemoryStore, sent: list[Delivery]) -> None:
        added = engine.add({"topic": "hooks", "delay": 5, "body": {"n": 1}, "target": HTTP}, T0)
        target = engine.get(added["id"])["target"]
        assert target == {**HTTP, "method": "POST", "headers": {}, "timeout": 10.0}
        assert engine.advance(T0 + 5) == 1
        task = engine.get(added["id"])
        assert task["state"] == "delivering" and task["attempts"] == 1
        assert sent == []  # not before the attempt is in the store
        await engine.journal.drain()
        record = await stored(store, added["id"])
        assert record is not None and record[2] == 3  # the state code of delivering
        assert [(d.task_id, d.attempt, d.target) for d in sent] == [(added["id"], 1, target)]
        assert msgpack.unpackb(sent[0].body_packed) == {"n": 1}
        engine.delivered(added["id"], 1, None, T0 + 5.2)
        assert engine.get(added["id"]) is None
        await engine.journal.drain()
        assert await stored(store, added["id"]) is None

    run(scenario)


def test_an_attempt_the_dispatcher_did_not_take_is_not_counted_as_being_sent() -> None:
    """A handback waits for the attempts being sent from here (``sending``); one
    whose write came back after a stop closed the dispatcher is never sent, and
    was waited for until the grace ran out."""

    async def scenario(engine: Engine, store: MemoryStore, sent: list[Delivery]) -> None:
        taken = {"open": True}
        engine.start_deliveries(
            lambda task_id, *_: engine.attempts.begin(task_id, lambda _: taken["open"]) and None
        )
        first = engine.add({"topic": "hooks", "delay": 5, "target": HTTP}, T0)["id"]
        second = engine.add({"topic": "hooks", "delay": 6, "target": HTTP}, T0)["id"]
        assert engine.advance(T0 + 5) == 1
        await engine.journal.drain()
        taken["open"] = False  # closed: the next one's write comes back after
        assert engine.advance(T0 + 6) == 1
        await engine.journal.drain()
        delivering = [engine.table.delivering[first], engine.table.delivering[second]]
        assert engine.attempts.sending(delivering) == delivering[:1]

    run(scenario)


def test_a_targeted_task_never_reaches_the_ready_queue() -> None:
    async def scenario(engine: Engine, store: MemoryStore, sent: list[Delivery]) -> None:
        added = engine.add({"topic": "hooks", "target": HTTP}, T0)  # due now
        assert engine.get(added["id"])["state"] == "delayed"
        assert engine.try_reserve(["hooks"], T0) is None
        engine.advance(T0 + 1)
        assert engine.try_reserve(["hooks"], T0 + 1) is None
        for call in (lambda: engine.ack(added["id"]), lambda: engine.touch(added["id"], T0 + 1)):
            with pytest.raises(RequestError) as caught:
                call()
            assert caught.value.code == "conflict"
        with pytest.raises(RequestError) as caught:
            engine.update(added["id"], {"body": "x"}, T0 + 1)
        assert caught.value.code == "conflict" and "delivering" in caught.value.message

    run(scenario)


def test_failed_attempts_back_off_then_the_task_is_dead_and_kick_revives_it() -> None:
    async def scenario(engine: Engine, store: MemoryStore, sent: list[Delivery]) -> None:
        task = {"topic": "hooks", "delay": 1, "target": HTTP, "max_attempts": 3}
        task_id = engine.add(task, T0)["id"]
        now_s = T0 + 1
        for attempt, wait_s in ((1, 1.0), (2, 2.0)):
            engine.advance(now_s)
            await engine.journal.drain()
            assert sent[-1].attempt == attempt
            engine.delivered(task_id, attempt, "HTTP 500 from http://127.0.0.1:9/hook", now_s)
            shown = engine.get(task_id)
            assert shown["state"] == "delayed" and shown["at"] == now_s + wait_s
            assert shown["last_error"] == "HTTP 500 from http://127.0.0.1:9/hook"
            now_s += wait_s
        engine.advance(now_s)
        await engine.journal.drain()
        engine.delivered(task_id, 3, "timed out", now_s)
        shown = engine.get(task_id)
        assert shown["state"] == "dead" and shown["attempts"] == 3
        assert engine.list_tasks({"state": "dead"})["tasks"][0]["id"] == task_id
        await engine.journal.drain()
        record = await stored(store, task_id)
        assert record is not None and record[2] == 4 and record[11] == "timed out"
        assert engine.kick("hooks", 10, now_s) == 1
        assert engine.get(task_id)["state"] == "delayed"
        engine.advance(now_s + 1)
        await engine.journal.drain()
        assert sent[-1].attempt == 1  # kicked: a fresh count

    run(scenario)


def test_retry_waits_double_with_jitter_up_to_the_cap() -> None:
    policy = RetryPolicy(base_s=2.0, cap_s=60.0, jitter=lambda: 0.5)
    assert [policy.delay_s(n) for n in (1, 2, 3, 4, 5)] == [2.1, 4.2, 8.4, 16.8, 33.6]
    assert policy.delay_s(6) == 60.0
    assert policy.delay_s(10_000) == 60.0  # no overflow


def test_an_outcome_for_a_task_deleted_during_its_attempt_changes_nothing() -> None:
    async def scenario(engine: Engine, store: MemoryStore, sent: list[Delivery]) -> None:
        task_id = engine.add({"topic": "hooks", "target": HTTP}, T0)["id"]
        engine.advance(T0 + 1)
        await engine.journal.drain()
        assert engine.delete(task_id) is True
        engine.delivered(task_id, 1, None, T0 + 1)
        engine.delivered(task_id, 1, "HTTP 500", T0 + 1)
        assert engine.get(task_id) is None
        assert engine.stats(T0 + 1)["states"]["delivering"] == 0

    run(scenario)


def test_a_task_deleted_before_its_attempt_is_durable_is_not_sent() -> None:
    async def scenario(engine: Engine, store: MemoryStore, sent: list[Delivery]) -> None:
        task_id = engine.add({"topic": "hooks", "target": HTTP}, T0)["id"]
        engine.advance(T0 + 1)
        engine.delete(task_id)  # in the same batch as the attempt
        await engine.journal.drain()
        assert sent == []

    run(scenario)


def test_update_moves_a_task_between_the_queue_and_a_target() -> None:
    async def scenario(engine: Engine, store: MemoryStore, sent: list[Delivery]) -> None:
        task_id = engine.add({"topic": "mail", "body": "hi"}, T0)["id"]
        assert engine.get(task_id)["state"] == "ready"
        updated = engine.update(task_id, {"target": HTTP}, T0)
        assert updated["state"] == "delayed" and updated["target"]["url"] == URL
        assert engine.try_reserve(["mail"], T0) is None
        back = engine.update(task_id, {"target": {"type": "queue"}, "delay": 0}, T0)
        assert back["state"] == "ready" and back["target"] == {"type": "queue"}

    run(scenario)


def test_targets_and_bodies_a_target_cannot_carry_are_refused_at_add() -> None:
    async def scenario(engine: Engine, store: MemoryStore, sent: list[Delivery]) -> None:
        cases = [
            ({"type": "http", "url": "http://10.1.2.3/"}, "x", "10.1.2.3"),
            ({"type": "queue", "url": URL}, "x", "queue target"),
            ({"type": "smtp"}, "x", "smtp"),
            (HTTP, {"raw": b"\x00"}, "JSON"),
            ({"type": "amqp", "broker": "nope", "routing_key": "k"}, "x", "nope"),
        ]
        for target, body, named in cases:
            with pytest.raises(RequestError) as caught:
                engine.add({"topic": "t", "target": target, "body": body}, T0)
            assert caught.value.code == "bad_request" and named in caught.value.message
        for fields in ({"topic": "a\nb"}, {"topic": "t", "id": "x\ry"}):
            with pytest.raises(RequestError) as caught:  # both go out as header values
                engine.add({**fields, "target": HTTP}, T0)
            assert "control character" in caught.value.message
        assert engine.stats(T0)["tasks"] == 0
        queued = engine.add({"topic": "t", "target": {"type": "queue"}}, T0)
        assert engine.get(queued["id"])["target"] == {"type": "queue"}
        with pytest.raises(RequestError):  # the body is checked against the target on update
            task_id = engine.add({"topic": "t", "delay": 60, "target": HTTP, "body": 1}, T0)["id"]
            engine.update(task_id, {"body": {"raw": b"\x00"}}, T0)
        assert engine.get(task_id)["body"] == 1

    run(scenario)


def test_an_attempt_a_crash_cut_off_is_sent_again_after_loading() -> None:
    async def main() -> None:
        store = MemoryStore("memory://")
        await store.open()
        first = make_engine(store)
        send_at_once(first, [])  # "sent", then the process dies
        task_id = first.add({"topic": "hooks", "target": HTTP, "body": b"z"}, T0)["id"]
        far_id = first.add({"topic": "hooks", "delay": 86_400, "target": HTTP}, T0)["id"]
        first.advance(T0 + 1)
        await first.journal.drain()

        second = make_engine(store)
        assert await second.load(store.load()) == 2
        assert second.get(task_id)["state"] == "delivering"
        sent: list[Delivery] = []
        send_at_once(second, sent)
        # The same attempt again: its number tells a receiver it may be a repeat.
        assert [(d.task_id, d.attempt, d.body_packed) for d in sent] == [
            (task_id, 1, msgpack.packb(b"z"))
        ]
        assert second.get(far_id)["target"]["url"] == URL  # packed and back

    asyncio.run(main())


def test_an_attempt_taken_over_is_sent_again_only_after_its_deadline() -> None:
    """A partition taken over while serving (``load_partition``): an attempt
    the previous owner journaled as delivering waits out its deadline (the
    target's timeout from its start), since that owner may only be paused and
    still sending; then the same attempt is sent again."""

    async def main() -> None:
        store = MemoryStore("memory://")
        await store.open()
        first = make_engine(store)
        send_at_once(first, [])  # begun, and the owner stops answering
        target = {**HTTP, "timeout": 30}
        task_id = first.add({"topic": "hooks", "target": target}, T0)["id"]
        first.advance(T0 + 1)
        await first.journal.drain()
        assert (await stored(store, task_id)) is not None

        second = make_engine(store)
        sent: list[Delivery] = []
        send_at_once(second, sent)
        second.advance(T0 + 5)
        assert await second.load_partition(store.load()) == 1
        assert second.get(task_id)["state"] == "delivering"
        second.advance(T0 + 30)
        assert sent == []  # the first attempt began at T0 + 1, with 30 s to run
        assert second.next_fire_s() == T0 + 31
        second.advance(T0 + 31)
        assert [(d.task_id, d.attempt) for d in sent] == [(task_id, 1)]
        second.delivered(task_id, 1, None, T0 + 31)
        await second.journal.drain()
        assert await stored(store, task_id) is None

    asyncio.run(main())


def test_an_attempts_deadline_is_its_http_timeout_or_a_brokers_15_s() -> None:
    """What a new owner holds a taken-over attempt to (docs/ha.md, "Takeover"):
    an HTTP target's ``timeout``; a broker's connect and send timeouts."""
    assert attempt_bound_s({**HTTP, "timeout": 30}) == 30.0
    for target in (
        {"type": "amqp", "broker": "mq", "exchange": "x", "routing_key": "k"},
        {"type": "nats", "broker": "bus", "subject": "s"},
    ):
        assert attempt_bound_s(target) == CONNECT_TIMEOUT_S + SEND_TIMEOUT_S == 15.0


def test_a_partition_taken_over_keeps_reservations_and_fires_what_is_overdue() -> None:
    """Issue 16, takeover: after the new owner's ``load_partition`` an overdue
    task is ready at the next tick, and it keeps a reserved task's TTR deadline: it comes
    back (ready again) only when that deadline passes."""

    async def main() -> None:
        store = MemoryStore("memory://")
        await store.open()
        first = make_engine(store)
        first.add({"id": "due", "topic": "t", "delay": 2}, T0)
        first.add({"id": "held", "topic": "t", "ttr": 30}, T0)
        reserved = first.try_reserve(["t"], T0 + 1)  # by a worker of the old owner
        assert reserved is not None and reserved["id"] == "held"
        await first.journal.drain()

        second = make_engine(store)
        second.advance(T0 + 10)  # the old owner died; the new one loads 10 s on
        assert await second.load_partition(store.load()) == 2
        assert second.next_fire_s() is not None and second.next_fire_s() <= T0 + 10
        second.advance(T0 + 10)  # the next tick (the coordinator re-arms the timer)
        assert second.get("due")["state"] == "ready"  # overdue: ready at once
        assert second.get("held")["state"] == "reserved"
        assert second.try_reserve(["t"], T0 + 10)["id"] == "due"
        second.advance(T0 + 30)
        assert second.try_reserve(["t"], T0 + 30) is None  # its TTR runs to T0 + 31
        second.advance(T0 + 31.5)
        again = second.try_reserve(["t"], T0 + 31.5)
        assert again is not None and again["id"] == "held"

    asyncio.run(main())


def test_a_record_of_version_3_loads_as_a_queue_task() -> None:
    fields = (3, "mail", 0, T0 + 60, T0, 0, 60, 5, 0, msgpack.packb("hi"))
    task = from_record("old", msgpack.packb(fields, use_bin_type=True))
    assert task.target is None and task.last_error is None and task.topic == "mail"
    new_record = to_record(task)
    assert msgpack.unpackb(new_record)[0] == 5
    assert from_record("old", new_record).target is None


def test_an_outcome_the_store_failed_to_take_is_journaled_again_not_sent_again(
    redis_server: RedisServer, redis_url: str
) -> None:
    """The outcome of a sent attempt that the store did not take is undone
    (the task is delivering again, as in the store) and that same outcome is
    journaled again a retry base later, until the store takes it: the
    attempt is never sent a second time (docs/ha.md, "Duplicates")."""

    async def main() -> None:
        store = open_store(redis_url, redis_prefix=f"t-{uuid.uuid4().hex[:8]}")
        await store.open()
        engine = make_engine(store)  # type: ignore[arg-type]
        sent: list[Delivery] = []
        send_at_once(engine, sent)
        task_id = engine.add({"topic": "hooks", "target": HTTP}, T0)["id"]
        engine.advance(T0 + 1)
        await engine.journal.drain()
        assert len(sent) == 1
        redis_server.stop()  # Redis goes away before the outcome is written
        engine.delivered(task_id, 1, None, T0 + 1.5)
        await engine.journal.drain()
        shown = engine.get(task_id)
        assert shown is not None and shown["state"] == "delivering"  # undone, as in the store
        engine.advance(T0 + 3)  # a retry base later: the outcome's write fails again
        await engine.journal.drain()
        assert engine.get(task_id) is not None
        redis_server.start()
        now_s = T0 + 3
        while engine.get(task_id) is not None and now_s < T0 + 30:  # reconnects with a back-off
            await asyncio.sleep(0.05)
            now_s += 1
            engine.advance(now_s)
            await engine.journal.drain()
        assert engine.get(task_id) is None  # the outcome, journaled at last
        assert [d.attempt for d in sent] == [1]  # and the attempt sent once
        assert await load_all(store) == {}
        await store.close()

    asyncio.run(main())


async def queuing_engine() -> tuple[Engine, list[str]]:
    """An engine on a memory store whose due deliveries are noted, never begun."""
    store = MemoryStore("memory://")
    await store.open()
    engine = make_engine(store)
    queued: list[str] = []
    engine.start_deliveries(lambda task_id, *_: queued.append(task_id))
    return engine, queued


def test_due_tasks_wait_for_their_lane_and_only_begun_attempts_are_counted() -> None:
    async def main() -> None:
        engine, queued = await queuing_engine()
        ids = [engine.add({"topic": "hooks", "target": HTTP}, T0)["id"] for _ in range(3)]
        engine.advance(T0 + 1)
        assert queued == ids  # due, in their lane, no attempt yet
        for task_id in ids:
            task = engine.get(task_id)
            assert task["state"] == "delayed" and task["attempts"] == 0
        assert engine.delete(ids[1])  # deleted while waiting
        sent: list[Delivery | None] = []
        assert engine.attempts.begin(ids[0], sent.append)
        assert not engine.attempts.begin(ids[1], sent.append)  # gone: no slot taken
        await engine.journal.drain()
        assert [d.task_id if d else None for d in sent] == [ids[0]]
        assert engine.get(ids[0])["state"] == "delivering"
        assert engine.get(ids[2])["attempts"] == 0  # still waiting, uncounted
        updated = engine.update(ids[2], {"delay": 60}, T0 + 1)  # leaves its lane
        assert updated["state"] == "delayed" and not engine.attempts.begin(ids[2], sent.append)
        stats = engine.stats(T0 + 1)["states"]
        assert (stats["delayed"], stats["delivering"]) == (1, 1)

    asyncio.run(main())


def test_a_gated_topics_due_deliveries_wait_and_go_most_urgent_first_within_its_limit() -> None:
    async def main() -> None:
        engine, queued = await queuing_engine()
        engine.topic_set("hooks", {"paused_until": T0 + 10, "concurrency": 2}, T0)
        ids = [
            engine.add({"topic": "hooks", "target": HTTP, "priority": p}, T0)["id"]
            for p in (1024, 5, 1024, 0)
        ]
        engine.advance(T0 + 1)
        assert queued == []  # due, behind the pause: still delayed, no attempt
        assert {engine.get(i)["attempts"] for i in ids} == {0}
        assert engine.next_fire_s() == T0 + 10  # the pause's end wakes the ticker
        engine.advance(T0 + 10)
        assert queued == [ids[3], ids[1]]  # the two most urgent: the concurrency
        sent: list[Delivery | None] = []
        assert engine.attempts.begin(ids[3], sent.append)
        await engine.journal.drain()
        assert queued == [ids[3], ids[1]]  # begun: still in flight, still 2
        engine.delivered(ids[3], 1, None, T0 + 11)  # its slot frees
        assert queued == [ids[3], ids[1], ids[0]]  # the first due of the default priority
        engine.topic_set("hooks", {"concurrency": None}, T0 + 11)
        assert queued == [ids[3], ids[1], ids[0], ids[2]]  # no limit: the rest
        await engine.journal.drain()

    asyncio.run(main())


def test_held_attempts_with_equal_deadlines_are_each_sent_once() -> None:
    """Two attempts taken over with the same deadline, one of them adopted
    twice (its partition dropped and taken back while it was held): the
    held heap never compares two tasks (it raised TypeError, and the wheel
    stopped), and each attempt is sent again once."""

    async def main() -> None:
        store = MemoryStore("memory://")
        await store.open()
        first = make_engine(store)
        send_at_once(first, [])
        target = {**HTTP, "timeout": 30}
        ids = [first.add({"topic": "hooks", "target": target}, T0)["id"] for _ in range(2)]
        first.advance(T0 + 1)  # both begun at T0 + 1: one deadline, T0 + 31
        await first.journal.drain()

        second = make_engine(store)
        sent: list[Delivery] = []
        send_at_once(second, sent)
        second.advance(T0 + 5)
        assert await second.load_partition(store.load()) == 2
        # The record loaded again: another Task of the same id, same deadline.
        records = {i: r for batch in [b async for b in store.load()] for i, r in batch}
        again = from_record(ids[0], records[ids[0]])
        second.attempts.adopt([again], second.wheel.now_s)
        assert second.next_fire_s() == T0 + 31
        second.advance(T0 + 31)
        assert sorted((d.task_id, d.attempt) for d in sent) == sorted((i, 1) for i in ids)

    asyncio.run(main())


def test_a_held_attempt_that_failed_elsewhere_is_begun_anew_when_taken_again() -> None:
    """A partition taken over while an attempt is held (its deadline to come),
    dropped, and taken again after that attempt failed at another owner:
    the task loaded as delayed is due, and begins attempt 2. It stayed
    delayed, out of the wheel and unsent: the id was still marked as an
    attempt to resend (tests/test_takeover_resend.py, with real processes)."""

    async def main() -> None:
        store = MemoryStore("memory://")
        await store.open()
        other = make_engine(store)
        send_at_once(other, [])
        task_id = other.add({"topic": "hooks", "target": {**HTTP, "timeout": 30}}, T0)["id"]
        other.advance(T0 + 1)  # attempt 1 begun: delivering until T0 + 31
        await other.journal.drain()

        sharing = Sharing(node="b", address="127.0.0.1:7002", partitions=1, lease_s=10.0)
        here = make_engine(store, ownership=sharing)
        sent: list[Delivery] = []
        send_at_once(here, sent)
        sharing.serve(0, 1)
        here.advance(T0 + 5)
        assert await here.load_partition(store.load()) == 1  # held to T0 + 31
        sharing.unserve(0)
        here.drop_partition(0)

        other.delivered(task_id, 1, "HTTP 503", T0 + 6)  # failed: due again at T0 + 7
        await other.journal.drain()
        sharing.serve(0, 2)
        assert await here.load_partition(store.load()) == 1
        here.advance(T0 + 8)
        await here.journal.drain()
        assert [(d.task_id, d.attempt) for d in sent] == [(task_id, 2)]
        assert here.get(task_id)["state"] == "delivering"

    asyncio.run(main())


def test_an_attempt_begun_here_while_a_partition_loads_is_not_adopted() -> None:
    """A partition taken over while this node is delivering (``load_partition``
    awaits the store between batches): an attempt this node begins meanwhile,
    of a task it already had, is in flight here and is not the previous
    owner's. Adopted with the loaded ones, it was sent a second time at its
    deadline, as a duplicate (scenario 6 on Redis Cluster, 2 runs in 8). Only
    the loaded attempt is held and sent again."""

    async def main() -> None:
        store = MemoryStore("memory://")
        await store.open()
        other = make_engine(store)
        send_at_once(other, [])
        target = {**HTTP, "timeout": 30}
        taken_id = other.add({"topic": "hooks", "target": target}, T0)["id"]
        other.advance(T0 + 1)  # the previous owner's attempt: delivering until T0 + 31
        await other.journal.drain()
        records = [(i, r) for batch in [b async for b in store.load()] for i, r in batch]

        here = make_engine(MemoryStore("memory://"))
        await here.store.open()
        sent: list[Delivery] = []
        send_at_once(here, sent)
        own_id = here.add({"topic": "hooks", "delay": 3, "target": target}, T0)["id"]
        await here.journal.drain()

        async def batches() -> AsyncIterator[list[tuple[str, bytes]]]:
            await asyncio.sleep(0)  # the store's round trip: this node goes on meanwhile
            here.advance(T0 + 3)  # its own task is due: its attempt begins, and is sent
            yield records

        assert await here.load_partition(batches()) == 1
        await here.journal.drain()
        assert [(d.task_id, d.attempt) for d in sent] == [(own_id, 1)]
        here.advance(T0 + 40)  # past both deadlines
        assert [(d.task_id, d.attempt) for d in sent] == [(own_id, 1), (taken_id, 1)]

    asyncio.run(main())
