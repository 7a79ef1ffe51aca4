"""The task table's invariant: a task is in exactly the place its state names.

A hypothesis state machine drives an engine with every verb, the clock,
delivery attempts and their outcomes, blocked reserves and store writes that
fail (undone by the table's rollback), on a small wheel whose window packs
tasks due 20 s on. After every step it checks, from the containers' side and
from the tasks' side, that each live task is in the one container its state
names and nowhere else, and that the counts and the packed tally agree.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from contextlib import suppress
from typing import Any

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from delaywheel.delivery.allow import AllowList
from delaywheel.delivery.base import Delivery
from delaywheel.delivery.targets import TargetRules
from delaywheel.engine.engine import Engine
from delaywheel.engine.queues import Waiter, Watch
from delaywheel.engine.retry import RetryPolicy
from delaywheel.engine.table import TaskTable
from delaywheel.engine.task import (
    DEAD,
    DELAYED,
    DELIVERING,
    DONE,
    FINAL,
    READY,
    RESERVED,
    STATES,
    Task,
)
from delaywheel.errors import RequestError
from delaywheel.store.base import Changes, Done, StoreUnavailable
from delaywheel.store.memory import MemoryStore

T0 = 1_800_000_000.0
IDS = st.sampled_from([f"t{i}" for i in range(6)])
TOPICS = st.sampled_from(["a", "b"])
HTTP = {"type": "http", "url": "http://127.0.0.1:9/hook"}


class FailingStore(MemoryStore):
    """The memory store, with its next write failing when asked to."""

    def __init__(self) -> None:
        super().__init__("memory://")
        self.fail_next = False

    def submit(self, changes: Changes, done: Done) -> None:
        if self.fail_next:
            self.fail_next = False
            done(StoreUnavailable("store memory://: write failed: asked to"))
            return
        super().submit(changes, done)


def check_places(table: TaskTable) -> None:
    """Every live task in the container its state names, and in no other."""
    tasks = [task for task in table.index.by_id.values() if isinstance(task, Task)]
    packed = [record for record in table.index.by_id.values() if isinstance(record, bytes)]
    scheduled = {id(entry) for entry in table.wheel}
    ready_live: Counter[str] = Counter()
    dead = {(topic, task_id) for topic, tasks_ in table.queues._dead.items() for task_id in tasks_}
    for task in tasks:
        in_wheel = id(task) in scheduled
        assert in_wheel == task.scheduled, task.id
        assert (task.queue_seq != -1) == (task.state == READY), task.id
        assert ((task.topic, task.id) in dead) == (task.state == DEAD), task.id
        assert (table.delivering.get(task.id) is task) == (task.state == DELIVERING), task.id
        waiting = table.waiting.get(task.id) is task
        if task.state == DELAYED:
            assert in_wheel != waiting, task.id  # one or the other: never both, never neither
        else:
            assert not waiting, task.id
            # A done task waits for its lapse; a dead one for --dead-retention's.
            kept_for = table.topic_dead_retain_s(task.topic)
            kept_dead = task.state == DEAD and kept_for is not None and bool(task.deadline_s)
            assert in_wheel == (task.state in (RESERVED, DONE) or kept_dead), task.id
        if task.state == READY:
            ready_live[task.topic] += 1
    # From the containers' side: nothing in them that is not a live task there.
    assert len(scheduled) == len(table.wheel) == sum(task.scheduled for task in tasks)
    assert {topic: queue.live for topic, queue in table.queues._ready.items()} == ready_live
    assert len(dead) == sum(task.state == DEAD for task in tasks)
    for found in (table.waiting, table.delivering):
        assert all(table.index.by_id.get(task_id) is task for task_id, task in found.items())
    assert table.packed.count == len(packed)
    # The counts: packed tasks are delayed ones, counted by their record's topic.
    states = Counter(task.state for task in tasks) + Counter({DELAYED: len(packed)})
    assert table.counts.by_state() == {state: states[state] for state in STATES}
    assert sum(sum(s.values()) for s in table.counts.by_topic().values()) == len(table.index)


class TableMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.store = FailingStore()
        asyncio.run(self.store.open())
        self.now_s = T0
        self.engine = Engine(
            self.store,
            now_s=T0,
            slots=10,
            tick_s=1.0,
            targets=TargetRules(AllowList.parse("127.0.0.1")),
            retry=RetryPolicy(base_s=1.0, cap_s=4.0, jitter=lambda: 0.0),
            dead_retention_s=50.0,
        )
        self.journal = self.engine.journal
        self.journal.hold()  # as a connection on an inline store
        self.queued: list[str] = []  # due targeted tasks, as the dispatcher's lanes hold them
        self.sent: list[Delivery] = []  # attempts begun and durable, to report on
        self.served: list[dict[str, Any]] = []
        self.watched: list[dict[str, Any]] = []  # what blocked waits were answered
        self.engine.start_deliveries(lambda task_id, *_: self.queued.append(task_id))

    def apply(self, change: Any, *args: Any) -> None:
        """One request, its store write (failing when asked), as a turn would."""
        with suppress(RequestError):  # conflict, not_found, exists: nothing changed
            change(*args)
        self.journal.flush()

    @rule(
        task_id=IDS,
        topic=TOPICS,
        delay_s=st.sampled_from([-3, 0, 0, 2, 5, 25, 60]),
        ttr=st.sampled_from([0, 5, 5]),
        attempts=st.sampled_from([1, 2]),
        targeted=st.sampled_from([False, False, True]),
        retain=st.sampled_from([None, 0, 4, 30, 30]),
    )
    def add(
        self,
        task_id: str,
        topic: str,
        delay_s: int,
        ttr: int,
        attempts: int,
        targeted: bool,
        retain: int | None,
    ) -> None:
        fields: dict[str, Any] = {"id": task_id, "topic": topic, "delay": max(delay_s, 0)}
        if delay_s < 0:
            fields = {"id": task_id, "topic": topic, "at": self.now_s + delay_s}
        fields.update(ttr=ttr, max_attempts=attempts)
        if targeted:
            fields["target"] = HTTP
        if retain is not None:
            fields["retain"] = retain
        self.apply(self.engine.add, fields, self.now_s)

    @rule(topics=st.sampled_from([["a"], ["b"], ["a", "b"]]))
    def reserve(self, topics: list[str]) -> None:
        self.apply(self.engine.try_reserve, topics, self.now_s)

    @rule(task_id=IDS, result=st.sampled_from([None, "r", {"n": 1}]))
    def ack(self, task_id: str, result: Any) -> None:
        self.apply(self.engine.ack, task_id, result, self.now_s)

    @rule(result=st.sampled_from([None, {"n": 1}]))
    def ack_a_reserved_one(self, result: Any) -> None:
        """An ack that finds its task reserved (a random id rarely does)."""
        by_id = self.engine.table.index.by_id
        found = [t for t in by_id.values() if isinstance(t, Task) and t.state == RESERVED]
        if found:
            self.apply(self.engine.ack, found[0].id, result, self.now_s)

    @rule(task_id=IDS)
    def watch(self, task_id: str) -> None:
        """A blocked wait: answered with the task in a final state, once."""
        with suppress(RequestError):
            if self.engine.wait_now(task_id) is None:
                self.engine.watch(Watch(task_id, self.watched.append))

    @rule(task_id=IDS, delay_s=st.sampled_from([0, 4, 30]))
    def release(self, task_id: str, delay_s: int) -> None:
        self.apply(self.engine.release, task_id, delay_s, self.now_s)

    @rule(task_id=IDS)
    def touch(self, task_id: str) -> None:
        self.apply(self.engine.touch, task_id, self.now_s)

    @rule(task_id=IDS)
    def delete(self, task_id: str) -> None:
        self.apply(self.engine.delete, task_id)

    @rule(task_id=IDS, delay_s=st.sampled_from([0, 3, 40]), topic=TOPICS)
    def update(self, task_id: str, delay_s: int, topic: str) -> None:
        self.apply(self.engine.update, task_id, {"delay": delay_s, "topic": topic}, self.now_s)

    @rule(topic=TOPICS)
    def kick(self, topic: str) -> None:
        self.apply(self.engine.kick, topic, 2, self.now_s)

    @rule(task_id=IDS)
    def get(self, task_id: str) -> None:
        self.apply(self.engine.get, task_id)  # decodes a packed task

    @rule()
    def list_all(self) -> None:
        self.apply(self.engine.list_tasks, {"limit": 3})

    @rule(topic=TOPICS)
    def wait(self, topic: str) -> None:
        self.engine.wait_reserve(Waiter([topic], self.served.append))

    @rule(dt_s=st.sampled_from([0.5, 1.0, 3.0, 12.0, 45.0]))
    def advance(self, dt_s: float) -> None:
        self.now_s += dt_s
        self.apply(self.engine.advance, self.now_s)

    @rule(n=st.integers(1, 3))
    def begin(self, n: int) -> None:
        """A lane has room for the first queued tasks (gone or changed since: skipped)."""

        def ready(delivery: Delivery | None) -> None:
            if delivery is not None:
                self.sent.append(delivery)

        while self.queued and n:
            n -= 1
            self.apply(self.engine.attempts.begin, self.queued.pop(0), ready)

    @rule(ok=st.booleans())
    def outcome(self, ok: bool) -> None:
        if self.sent:
            delivery = self.sent.pop(0)
            error = None if ok else "refused"
            self.apply(self.engine.delivered, delivery.task_id, delivery.attempt, error, self.now_s)

    @rule()
    def fail_next_write(self) -> None:
        self.store.fail_next = True

    @invariant()
    def every_task_is_where_its_state_says(self) -> None:
        table = self.engine.table
        check_places(table)
        # What the run reached (pytest --hypothesis-show-statistics).
        for state, n in table.counts.by_state().items():
            if n:
                event(f"a {state} task")
        for name, n in [("packed", table.packed.count), ("waiting", len(table.waiting))]:
            if n:
                event(f"a {name} task")
        if self.journal.watch.failures:
            event("a write undone")
        assert all(answer["state"] in FINAL for answer in self.watched)
        if self.watched:
            event("a wait answered")


TableMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_the_task_table_keeps_every_task_where_its_state_says = TableMachine.TestCase
