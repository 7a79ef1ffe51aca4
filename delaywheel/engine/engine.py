"""The engine: the request verbs, applied to the task table and the store.

Each verb checks its request (``validate``), decides what it means for the
task, and makes the change through the task table (``delaywheel.engine.table``),
which owns every container and is the only writer of task state: its
``move`` checks the transition table, puts the task where its new state
keeps it and journals it. The modules beside this one do the rest: time's
changes (``firing``), delivery attempts of targeted tasks (``attempts``),
cold tasks and loading (``cold``).

A verb whose outcome depends on the time takes ``now_s`` instead of reading
a clock (``get``, ``list_tasks``, ``delete`` and ``ack`` do not). Mutating verbs
return at once; the server holds their replies until ``journal.pending()`` is durable.
A blocked ``reserve`` is a ``Waiter`` that gets its task when one becomes
ready; handing it over is itself a journaled change.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Collection, Iterable
from typing import Any, TypeVar

from delaywheel_client.partitions import is_record_key, is_settings_key

from delaywheel import checks
from delaywheel.checks import bad
from delaywheel.delivery.targets import TargetRules
from delaywheel.engine import validate
from delaywheel.engine.attempts import Attempts
from delaywheel.engine.firing import Firing
from delaywheel.engine.horizon import MAX_FETCHES, NeedsStore, far_cursor
from delaywheel.engine.queues import Waiter, Watch
from delaywheel.engine.retry import RetryPolicy
from delaywheel.engine.schedules import Hooks, ScheduleTable
from delaywheel.engine.snapshot import Snapshot
from delaywheel.engine.table import TaskTable
from delaywheel.engine.task import (
    DEAD,
    DELAYED,
    DONE,
    GONE,
    READY,
    RESERVED,
    Task,
    place_of,
)
from delaywheel.engine.validate import Limits
from delaywheel.errors import RequestError
from delaywheel.ha.ownership import Ownership, WholeKeyspace
from delaywheel.schedules.occurrence import Occurrence
from delaywheel.store.base import Store
from delaywheel.store.watch import DEFAULT_SLOW_FLUSH_S

T = TypeVar("T")

# How many tasks one list call may look at before it returns a short page: a
# filter that matches little must not stall the loop scanning millions.
LIST_SCAN_BUDGET = 20_000


class Engine:
    def __init__(
        self,
        store: Store,
        *,
        now_s: float,
        slots: int = 3600,
        tick_s: float = 1.0,
        limits: Limits | None = None,
        targets: TargetRules | None = None,
        retry: RetryPolicy | None = None,
        ownership: Ownership | None = None,
        slow_flush_s: float = DEFAULT_SLOW_FLUSH_S,
        dead_retention_s: float | None = None,
        horizon_s: float | None = None,
    ) -> None:
        """``horizon_s``: delayed tasks due beyond it are kept only in the store
        (engine/horizon.py); None: every task in memory."""
        self.store = store
        self.dead_retention_s = dead_retention_s  # --dead-retention: None, for ever
        # Which ids this node serves (ha/ownership.py): all of them unless given.
        self.ownership = own = WholeKeyspace() if ownership is None else ownership
        self.limits = limits or Limits()
        self.targets = targets or TargetRules()
        self.table = table = TaskTable(
            store,
            slots=slots,
            tick_s=tick_s,
            now_s=now_s,
            ownership=own,
            occurrence_of=self._occurrence_of,
            slow_flush_s=slow_flush_s,
            topic_dead_retain_s=self.topic_dead_retain_s,
            horizon_s=horizon_s,
        )
        self.horizon = table.horizon
        # The table's parts the verbs use (and the server reads).
        self.wheel, self.queues, self.journal = table.wheel, table.queues, table.journal
        self._tasks, self.events = table.index, table.events
        self.attempts = Attempts(table, retry or RetryPolicy(), self.limits.max_result_bytes)
        self.firing = Firing(table, self.attempts)
        self.started_s = now_s
        self.schedules = ScheduleTable(
            self.journal,
            Hooks(
                check_template=self._check_template,
                put_occurrence=self._put_occurrence,
                in_flight=self._in_flight,
                check_served=self._check_served,
            ),
            tick_s,
        )
        self.topics, self.flow = table.topics, table.flow

    # -- requests ------------------------------------------------------------

    def add(self, fields: Any, now_s: float) -> dict[str, Any]:
        task = self.table.create(self._checked(fields, now_s), now_s)
        self.table.serve_waiters(now_s)
        return self._added(task)

    def add_many(self, tasks: Any, now_s: float) -> list[dict[str, Any]]:
        if type(tasks) is not list:
            raise bad(f"add_many takes a list of tasks, got {checks.show(tasks)}")
        checked = []
        seen: set[str] = set()
        for index, fields in enumerate(tasks):
            try:
                new = self._checked(fields, now_s)
                if new.id:  # given, not SERVER_MADE_ID
                    if new.id in self._tasks:
                        raise self.table.exists(new.id)
                    if new.id in seen:
                        raise RequestError("exists", f"a task with id {new.id!r} already exists")
                    seen.add(new.id)
            except RequestError as exc:
                raise RequestError(exc.code, f"task {index}: {exc.message}") from None
            checked.append(new)
        horizon = self.horizon
        if seen and (horizon.far_total or horizon.unconfirmed):
            # The far tier may hold a given id: put them all blind, together,
            # or read the store first (engine/horizon.py, ``together``).
            given = [new.id for new in checked if new.id]
            together = horizon.together(given, len(given) < len(checked))
            if together:
                created = self.table.create_together(checked, now_s)
                return [self._added(task) for task in created]
            if together is not None:
                horizon.misses(given)
        created = [self.table.create(new, now_s) for new in checked]
        self.table.serve_waiters(now_s)
        return [self._added(task) for task in created]

    def _checked(self, fields: Any, now_s: float) -> Task:
        """A new task, its fields checked, its target too (``add_many`` checks
        every task before it creates any: all or nothing)."""
        new = validate.new_task(fields, now_s, self.limits)
        if new.id.startswith("s:"):  # the only cost to other ids
            if is_record_key(new.id):
                raise bad(f"id {new.id!r} is kept for a schedule's record (s:{{id}}:00)")
            if is_settings_key(new.id):
                raise bad(f"id {new.id!r} is kept for a topic's settings (s:{{topic}}:000)")
        if new.id and not self.ownership.owns_all:  # given, and not one node
            self.ownership.check(new.id)
        if new.target is not None:
            new.target = self.targets.check(
                new.target, new.body_packed, task_id=new.id or None, topic=new.topic
            )
        return new

    def _added(self, task: Task) -> dict[str, Any]:
        cycle, slot = place_of(task, self.wheel)
        return {"id": task.id, "at": task.at_s, "cycle": cycle, "slot": slot}

    def update(self, task_id: Any, fields: Any, now_s: float) -> dict[str, Any]:
        task = self._find(task_id)
        changes = validate.changes(fields, now_s, self.limits)
        # Changes' fields are named as the task's: the ones given become them.
        new = {name: value for name, value in vars(changes).items() if value is not None}
        if changes.target is not None or (task.target and (changes.body_packed or changes.topic)):
            # Checked against the task it will be (a new body must suit the target).
            target = task.target if changes.target is None else changes.target
            assert target is not None
            new["target"] = self.targets.check(
                target,
                new.get("body_packed", task.body_packed),
                task_id=task.id,
                topic=new.get("topic", task.topic),
            )
        to = task.state
        if changes.at_s is not None:
            to = DELAYED if changes.at_s > now_s else READY
            if task.state == DEAD:
                new["attempts"] = 0  # a dead task given a new time starts afresh
        if to == READY and new.get("target", task.target) is not None:
            to = DELAYED  # a targeted task is never ready: due now, the next tick sends it
            new.setdefault("at_s", now_s)
        self.table.move(task, "update", to, **new)
        self.events.updated += 1
        self.table.serve_waiters(now_s)
        return self.describe(task)

    def delete(self, task_id: Any) -> bool:
        task = self._lookup(self._served(task_id))
        if task is None:
            return False
        self.table.move(task, "delete", GONE)
        self.events.deleted += 1
        if self.flow.limited:  # a slot freed: a blocked reserve may take it
            self.table.serve_waiters(self.wheel.now_s)
        return True

    def get(self, task_id: Any) -> dict[str, Any] | None:
        task = self._lookup(self._served(task_id))
        return None if task is None else self.describe(task)

    def list_tasks(self, query: Any) -> dict[str, Any]:
        q = validate.list_query(query)
        if type(q.cursor) is str:  # a page of the far tier (engine/horizon.py)
            return self.horizon.list_page(q.cursor, q.topic, q.state, q.limit)

        def wanted(task: Task) -> bool:
            return (q.topic is None or task.topic == q.topic) and (
                q.state is None or task.state == q.state
            )

        # Packed tasks join the creation order as they are decoded, after
        # every task there: a client paging to the end meets each once.
        self.table.cold.thaw(LIST_SCAN_BUDGET)
        assert type(q.cursor) is int
        tasks, cursor = self._tasks.page(q.cursor, wanted, q.limit, LIST_SCAN_BUDGET)
        if cursor is None and self.table.packed.count:  # more to decode: come back
            cursor = max(q.cursor, self._tasks.last_seq())
        shown = [self.describe(task) for task in tasks]
        if cursor is None and self.horizon.far_total and q.state in (None, DELAYED):
            # Then the far tier's tasks, from this page on if it has room.
            start = far_cursor(self.horizon.brought)
            if len(shown) == q.limit:
                return {"tasks": shown, "next": start}
            far = self.horizon.list_page(start, q.topic, q.state, q.limit - len(shown))
            return {"tasks": shown + far["tasks"], "next": far["next"]}
        return {"tasks": shown, "next": cursor}

    def try_reserve(self, topics: Any, now_s: float) -> dict[str, Any] | None:
        """Reserve the most urgent ready task of ``topics`` now (of those whose
        gate is open: engine/flow.py), or return None."""
        names = validate.topics(topics)
        if self.flow.limited:
            names = self.flow.open_topics(names, now_s)
        task = self.queues.oldest_ready(names)
        return None if task is None else self.table.reserve(task, now_s)

    def wait_reserve(self, waiter: Waiter) -> None:
        self.queues.add_waiter(waiter)

    def cancel_wait(self, waiter: Waiter) -> None:
        self.queues.cancel_waiter(waiter)

    def ack(self, task_id: Any, result: Any = None, now_s: float | None = None) -> bool:
        """The reserved task is done: kept ``done`` with ``result`` for its
        ``retain`` seconds from ``now_s`` (the wheel's now when not given:
        a request's route gives it), or gone (``TaskTable.complete``)."""
        if now_s is None:
            now_s = self.wheel.now_s
        task = self._find(task_id)
        result_packed = None if result is None else validate.packed_result(result, self.limits)
        self.table.complete(task, "ack", "acked", result_packed, now_s)
        self.events.acked += 1
        if self.flow.limited:  # a slot freed: a blocked reserve may take it
            self.table.serve_waiters(self.wheel.now_s)
        return True

    def topic_dead_retain_s(self, topic: str) -> float | None:
        """How long a dead task of ``topic`` is kept after it died: the topic's
        ``dead_retain`` setting, else ``--dead-retention``; None: for ever."""
        kept_s = self.topics.of(topic).dead_retain
        return self.dead_retention_s if kept_s is None else kept_s

    def wait_now(self, task_id: Any) -> dict[str, Any] | None:
        """``wait``'s answer now: the task's map when it is done or dead, None
        while it may still run (``not_found`` when there is no such task)."""
        task = self._find(task_id)
        return self.describe(task) if task.state in (DONE, DEAD) else None

    def watch(self, watch: Watch) -> None:
        """A blocked ``wait``: ``watch.deliver`` gets the task's map once it is
        done, dead or gone (``TaskTable._answer_watches``)."""
        self.table.watch(watch)

    def cancel_watch(self, watch: Watch) -> None:
        self.table.cancel_watch(watch)

    def release(self, task_id: Any, delay_s: Any, now_s: float) -> bool:
        task = self._find(task_id)
        delay = checks.number(
            "delay", 0 if delay_s is None else delay_s, high=self.limits.max_delay_s
        )
        if task.state == RESERVED and task.attempts >= task.max_attempts:
            self.table.move(task, "release", DEAD, deadline_s=now_s)  # when it died
            self.events.deaths += 1
        else:
            at_s = now_s + delay
            self.table.move(task, "release", DELAYED if delay > 0 else READY, at_s=at_s)
        self.events.released += 1
        self.table.serve_waiters(now_s)
        return True

    def touch(self, task_id: Any, now_s: float) -> float:
        task = self._find(task_id)
        if task.state == RESERVED and now_s > task.deadline_s:
            raise RequestError(
                "conflict",
                f"cannot touch task {task.id!r}: its deadline passed at {task.deadline_s}",
            )
        self.table.move(task, "touch", RESERVED, deadline_s=now_s + task.ttr_s)
        self.events.touched += 1
        return task.deadline_s

    def kick(self, topic: Any, count_: Any, now_s: float) -> int:
        name = validate.topic(topic)
        if type(count_) is not int or count_ < 1:
            raise bad(f"count must be an int >= 1, got {checks.show(count_)}")
        kicked = self.queues.oldest_dead(name, count_)
        for task in kicked:
            self._revive(task, now_s)
        self.events.kicked += len(kicked)
        self.table.serve_waiters(now_s)
        return len(kicked)

    def kick_task(self, task_id: Any, now_s: float) -> bool:
        """Kick one dead task by id (beanstalkd's ``kick-job``): ``not_found``
        when there is none, ``conflict`` when it is not dead."""
        task = self._find(task_id)
        if task.state != DEAD:
            raise RequestError(
                "conflict", f"cannot kick task {task.id!r}: it is {task.state}, not dead"
            )
        self._revive(task, now_s)
        self.events.kicked += 1
        self.table.serve_waiters(now_s)
        return True

    # -- schedules (engine/schedules.py) ---------------------------------------

    def schedule_add(self, schedule: Any, now_s: float) -> dict[str, Any]:
        return self.schedules.add(schedule, now_s)

    def schedule_update(
        self, schedule_id: Any, changes: Any, expected_version: Any, now_s: float
    ) -> dict[str, Any]:
        return self.schedules.update(schedule_id, changes, expected_version, now_s)

    def schedule_pause(self, schedule_id: Any, note: Any) -> dict[str, Any]:
        return self.schedules.pause(schedule_id, note)

    def schedule_resume(self, schedule_id: Any, now_s: float) -> dict[str, Any]:
        return self.schedules.resume(schedule_id, now_s)

    def schedule_delete(self, schedule_id: Any) -> bool:
        return self.schedules.delete(schedule_id)

    def schedule_get(self, schedule_id: Any) -> dict[str, Any] | None:
        return self.schedules.get(schedule_id)

    def schedule_list(self, query: Any) -> dict[str, Any]:
        return self.schedules.page(query)

    def schedule_next(self, schedule: Any, n: Any, now_s: float) -> dict[str, Any]:
        """A schedule's next ``n`` times from now, with its description."""
        return self.schedules.next(schedule, n, now_s)

    def schedule_trigger(self, schedule_id: Any, now_s: float) -> dict[str, Any]:
        return self.schedules.trigger(schedule_id, now_s)

    def schedule_backfill(
        self, schedule_id: Any, start: Any, end: Any, now_s: float
    ) -> dict[str, Any]:
        return self.schedules.backfill(schedule_id, start, end, now_s)

    def _check_template(self, template: dict[str, Any], task_id: str, now_s: float) -> None:
        self._checked(dict(template, id=task_id), now_s)

    def _put_occurrence(
        self, task_id: str, template: dict[str, Any], at_s: float, now_s: float
    ) -> bool:
        """An occurrence's task, put if no task has its id (the fire step's no-op)."""
        if task_id in self._tasks:
            return False
        new = self._checked(dict(template, id=task_id, at=max(at_s, now_s)), now_s)
        self.table.create(new, now_s)
        self.table.serve_waiters(now_s)
        return True

    def _in_flight(self, task_id: str) -> bool:
        task = self._tasks.get(task_id)
        return task is not None and task.state not in (DEAD, DONE, GONE)  # done: kept, not running

    def _check_served(self, schedule_id: str) -> None:
        self.ownership.check(schedule_id)

    # -- topic settings (engine/topics.py) ---------------------------------------

    def topic_get(self, topic: Any, now_s: float) -> dict[str, Any]:
        return self.topics.get(topic, now_s)

    def topic_set(self, topic: Any, settings: Any, now_s: float) -> dict[str, Any]:
        shown = self.topics.set(topic, settings, now_s)
        self.table.serve_waiters(now_s)  # a gate may have opened
        if self.attempts.gated:
            self.attempts.release_gated(now_s)
        return shown

    def topic_list(self, query: Any, now_s: float) -> dict[str, Any]:
        return self.topics.page(query, now_s)

    def topic_records(self) -> dict[str, bytes]:
        """The records of the topic settings this node holds, by topic: what it
        publishes to the other nodes (ha/topics.py)."""
        return self.topics.records()

    def topics_shared(self, elsewhere: dict[str, bytes]) -> None:
        """The settings the other nodes hold, as they published them, after a
        look at who serves which partitions: both applied here, each topic's
        limits in this node's share (engine/shares.py)."""
        self.topics.learn(elsewhere)
        self._reshare()

    def _reshare(self) -> None:
        self.flow.reshare()
        self._through_opened_gates()

    def _through_opened_gates(self) -> None:
        if self.flow.woken:  # a gate may have opened
            now_s = self.wheel.now_s
            self.table.serve_waiters(now_s)
            if self.attempts.gated:
                self.attempts.release_gated(now_s)

    # The seats of a concurrency handed between the nodes (ha/seats.py).

    def handed_topics(self) -> dict[str, int]:
        """The topics whose concurrency is handed between the nodes, with it."""
        return self.flow.handed()

    def seat_use(self, topic: str) -> tuple[int, int]:
        """``topic``'s tasks in flight here, and those waiting for a seat (ready,
        or due deliveries behind its gate)."""
        gated = self.attempts.gated.get(topic, ())
        return self.flow.in_flight(topic), self.flow.ready_count(topic) + len(gated)

    def hold_seats(self, topic: str, seats: int) -> None:
        """This node holds ``seats`` of ``topic``'s concurrency now."""
        self.flow.seat(topic, seats)
        self._through_opened_gates()

    def _occurrence_of(self, task_id: str) -> Occurrence | None:
        """A schedule's occurrence as its task's map and deliveries show it (the
        table's look-up: each schedule knows its zone)."""
        return self.schedules.occurrence(task_id)

    def _revive(self, task: Task, now_s: float) -> None:
        """A dead task back to life with its attempts counted afresh."""
        if task.target is None:
            self.table.move(task, "kick", READY, attempts=0)
        else:  # due now: the next tick sends it
            self.table.move(task, "kick", DELAYED, attempts=0, at_s=now_s)

    def snapshot(self) -> Snapshot:
        """The figures ``stats`` and ``/metrics`` show (``delaywheel.engine.snapshot``)."""
        return Snapshot.of(
            self.table,
            store=self.store.url,
            started_s=self.started_s,
            delivery_deaths=self.attempts.deaths,
            lateness=self.firing.lateness,
        )

    def stats(self, now_s: float) -> dict[str, Any]:
        """The engine's part of the ``stats`` reply."""
        return self.snapshot().stats(now_s)

    # -- time ------------------------------------------------------------------

    def advance(self, now_s: float) -> int:
        """Fire what is due (``delaywheel.engine.firing``) and the schedules due
        (``delaywheel.engine.schedules``); returns how many moved."""
        lapsed = self.events.lapsed
        moved = self.firing.advance(now_s)
        if self.horizon.on:
            self.horizon.advance(now_s)
        if self.flow.limited:  # a timed pause's end, a token
            self.table.serve_waiters(now_s)
        if self.attempts.gated:
            self.attempts.release_gated(now_s)
        fired = self.schedules.advance(now_s)
        if fired or self.events.lapsed != lapsed:
            # No reply waits for what a schedule's fire step (or a kept
            # task's lapse) journaled: the next request's reply must not
            # wait for its partitions too.
            self.journal.pending()
        return moved + fired

    def next_fire_s(self) -> float | None:
        """When ``advance`` next has work: a task's timer or a schedule's, or
        a topic's gate opening for a blocked reserve (engine/flow.py)."""
        fire_s, schedule_s = self.firing.next_fire_s(), self.schedules.next_fire_s()
        pull_s = self.horizon.next_pull_s  # an attribute: read after every change
        if pull_s is not None and (fire_s is None or pull_s < fire_s):
            fire_s = pull_s
        if self.flow.limited and (self.queues.has_waiters() or self.attempts.gated):
            open_s = self.flow.next_open_s(self.wheel.now_s, self._held_back)
            if open_s is not None:
                fire_s = open_s if fire_s is None else min(fire_s, open_s)
        if fire_s is None or schedule_s is None:
            return schedule_s if fire_s is None else fire_s
        return min(fire_s, schedule_s)

    # -- deliveries --------------------------------------------------------------

    def _held_back(self, topic: str) -> bool:
        """Whether ``topic`` has ready tasks or due deliveries behind its gate."""
        return self.queues.has_ready(topic) or topic in self.attempts.gated

    def start_deliveries(self, queue: Callable[[str, dict[str, Any], int], None]) -> None:
        """Queue due targeted tasks with the dispatcher (``delaywheel.engine.attempts``)."""
        self.attempts.start(queue)

    def delivered(
        self,
        task_id: str,
        attempt: int,
        error: str | None,
        now_s: float,
        answer: tuple[str, Any] | None = None,
    ) -> None:
        """The outcome of a delivery attempt: None for delivered, else why it
        failed; ``answer``, the receiver's (its outcome and result)."""
        packed = None
        if answer is not None:
            packed = (answer[0], validate.packed_answer(answer[1]))
        self.attempts.outcome(task_id, attempt, error, now_s, packed)

    # -- reading -----------------------------------------------------------------

    def _served(self, task_id: Any) -> str:
        """``task_id`` checked, and served here (``moved`` or ``tryagain`` if not)."""
        checked = validate.task_id(task_id)
        if not self.ownership.owns_all:  # as in _checked
            self.ownership.check(checked)
        return checked

    async def through_store(self, verb: Callable[[], T]) -> T:
        """``verb()`` (a call of a verb) for a caller that may wait: when it
        needs a store read first (``NeedsStore``, engine/horizon.py), read and
        call it again (the dashboard's way; a connection has its own)."""
        horizon = self.horizon
        try:
            for _ in range(MAX_FETCHES):
                try:
                    return verb()
                except NeedsStore as need:
                    await need.fetch()
            raise RequestError("unavailable", "the store kept changing under the request")
        finally:
            horizon.settle()

    def _lookup(self, task_id: str) -> Task | None:
        """The task of ``task_id`` in memory; ``NeedsStore`` when only the store
        may hold it (engine/horizon.py)."""
        task = self._tasks.get(task_id)
        if task is None and (self.horizon.far_total or self.horizon.unconfirmed):
            self.horizon.miss(task_id)
        return task

    def _find(self, task_id: Any) -> Task:
        served = self._served(task_id)
        task = self._tasks.get(served)  # the commonest: in memory, no ``_lookup`` call
        if task is None:
            task = self._lookup(served)
            if task is None:
                raise RequestError("not_found", f"no task with id {task_id!r}")
        return task

    def describe(self, task: Task) -> dict[str, Any]:
        return self.table.describe(task)

    # What the dashboard reads (web/views.py): no request pays for these.

    def decoded_tasks(self) -> list[Task]:
        """The tasks held decoded, in no order: a copy, which the caller may walk
        while the loop runs on. Packed tasks are left out (``engine.cold``): they
        are due after the cold window, later than any decoded delayed task."""
        return [task for task in self._tasks.by_id.values() if isinstance(task, Task)]

    def oldest_ready(self, topic: str) -> Task | None:
        """``topic``'s oldest due ready task (it stays queued)."""
        return self.queues.oldest_ready([topic])

    def dead_tasks(self, topic: str) -> list[Task]:
        """``topic``'s dead tasks, oldest first: a copy."""
        return self.queues.oldest_dead(topic, len(self._tasks))

    # -- recovery ----------------------------------------------------------------

    async def load(self, batches: AsyncIterator[list[tuple[str, bytes]]]) -> int:
        """Rebuild every task from store records; corrupt ones are logged and
        skipped. Returns how many loaded (see ``delaywheel.engine.cold``). With
        a horizon, records beyond it are moved to the far tier as they are met
        (a store written before it), then the far tier is read up to it
        (engine/far_pull.py); those pulled count as loaded."""
        horizon = self.horizon
        horizon.start(self.wheel.now_s)
        loaded = await self.table.cold.load(
            self._split(batches), horizon.far_from_s(), horizon.push
        )
        return loaded + await horizon.load_lanes(range(self.store.lanes) if horizon.on else ())

    def _split(
        self, batches: AsyncIterator[list[tuple[str, bytes]]]
    ) -> AsyncIterator[list[tuple[str, bytes]]]:
        """The store's records with the schedules' and the topics' taken out."""
        return self.topics.split(self.schedules.split(batches))

    async def load_partition(
        self, batches: AsyncIterator[list[tuple[str, bytes]]], partition: int | None = None
    ) -> int:
        """Add a partition's tasks, while serving (a takeover): as ``load``, and
        its attempts in flight at the previous owner's end are sent again. With
        ``partition`` (its lane), its far tier too, as ``load`` reads it.

        Those are the tasks the load itself made ``delivering``, noted batch by
        batch. Not every new entry of ``delivering`` once the load is over: the
        load awaits the store between batches, and meanwhile this node begins
        attempts of its other partitions (or of a task this load brought in,
        due already), which are in flight here; adopted too, each would be
        sent a second time at its deadline."""
        delivering = self.table.delivering
        adopted: list[Task] = []

        async def noting_adopted() -> AsyncIterator[list[tuple[str, bytes]]]:
            async for batch in batches:
                before = {task_id for task_id, _ in batch if task_id in delivering}
                yield batch
                # Back here when the next batch is asked for: this one is
                # loaded, and nothing else has run since (no await between).
                for task_id, _ in batch:
                    task = delivering.get(task_id)
                    if task is not None and task_id not in before:
                        adopted.append(task)

        horizon = self.horizon
        far = horizon.on and partition is not None
        if far:
            horizon.start(self.wheel.now_s)
        loaded = await self.table.cold.load(
            self._split(noting_adopted()),
            horizon.far_from_s() if far else None,
            horizon.push,
        )
        if far:
            assert partition is not None
            loaded += await horizon.load_lanes([partition])
        self.attempts.adopt(adopted, self.wheel.now_s)
        self.table.serve_waiters(self.wheel.now_s)
        return loaded

    def drop_partition(self, partition: int, *, keep_delivering: bool = False) -> list[Task]:
        """``drop_partitions`` of one partition."""
        return self.drop_partitions({partition}, keep_delivering=keep_delivering)

    def drop_partitions(
        self,
        partitions: Collection[int],
        *,
        keep_delivering: bool = False,
        among: Iterable[str] | None = None,
    ) -> list[Task]:
        """Forget the tasks of ``partitions`` (handed back or lost): no journal
        write. One pass over the task table for all of them (a pass over
        1,000,000 tasks takes about half a second). With ``keep_delivering``,
        their attempts in flight stay, to journal their outcomes (a handoff);
        they are returned. ``among``: only these ids are looked at (the ones
        kept by an earlier drop), not the whole table."""
        of = self.ownership.partition_of
        leaving = frozenset(partitions)
        if self.horizon.on:
            self.horizon.drop_lanes(leaving, lambda key: of(key) in leaving)
        self.schedules.drop(lambda key: of(key) in leaving)
        self.topics.drop(lambda key: of(key) in leaving)
        kept = self.table.drop(lambda task_id: of(task_id) in leaving, keep_delivering, among)
        self.attempts.forget(lambda task_id: of(task_id) in leaving)
        staying = {id(task) for task in kept}
        self.journal.forget(lambda task: id(task) not in staying and of(task.id) in leaving)
        # Fewer partitions here: a smaller share of each limit, at once (a larger
        # one waits for the coordinator's round after the partition is served).
        self.flow.reshare()
        return kept

    def sending(self, kept: list[Task]) -> list[Task]:
        """Those of ``kept`` (delivering) whose attempt this node is sending now
        (``Attempts.sending``)."""
        return self.attempts.sending(kept)

    async def drain(self, partitions: Collection[int] | None = None) -> None:
        """Wait until every change made so far is durable or has failed; of
        ``partitions`` only, when given (a keyspace's lane is its partition)."""
        await self.journal.drain(None if partitions is None else list(partitions))
