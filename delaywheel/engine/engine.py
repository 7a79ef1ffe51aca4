"""The engine: applies requests to the wheel, the ready queues and the store.

It is the only writer of task state. Every change a request makes goes
through ``_move()``, which checks the transition table, takes the task out
of the place its old state kept it in (wheel, ready queue, dead list), puts
it where the new state keeps it, and journals it. Because a task's place
follows from its state, undoing a change after a failed store write is just
``_move()`` back to a snapshot.

The changes time makes, ``due`` (delayed to ready) and ``expire`` (a
reservation's TTR ran out: ready, or dead on the last attempt), go through
``_fire()``: the same table and bookkeeping, but no journal. They follow
from the stored record and the clock alone: a restart loads the record
into the wheel at the same time, which fires at once and makes the same
move, so writing them would cost a store write per fired task for nothing.

A task with an HTTP or broker target is not made ready when due: ``_fire``
hands it to ``Attempts`` (``delaywheel.engine.attempts``), which journals the
attempt, sends it once durable and journals its outcome, all through ``_move``.

Methods take ``now_s`` instead of reading a clock. Mutating methods return at
once; the server holds their replies until ``journal.pending()`` is durable.
A blocked ``reserve`` is a ``Waiter`` that gets its task when one becomes
ready; handing it over is itself a journaled change.
"""

from __future__ import annotations

import base64
import os
from bisect import bisect_left
from collections.abc import AsyncIterator, Callable, Mapping
from itertools import count
from operator import attrgetter
from typing import Any

from delaywheel import __version__, checks
from delaywheel.checks import bad
from delaywheel.delivery.targets import TargetRules
from delaywheel.engine import validate
from delaywheel.engine.attempts import Attempts, RetryPolicy
from delaywheel.engine.cold import WINDOW_S, PackedTasks, load_tasks
from delaywheel.engine.index import TaskCounts, TaskIndex
from delaywheel.engine.journal import Journal
from delaywheel.engine.queues import Queues, Waiter
from delaywheel.engine.record import from_record
from delaywheel.engine.task import (
    DEAD,
    DELAYED,
    DELIVERING,
    GONE,
    IN_WHEEL,
    NEW,
    READY,
    RESERVED,
    Task,
    check_transition,
    describe,
    place_of,
)
from delaywheel.engine.validate import Limits
from delaywheel.errors import RequestError
from delaywheel.store.base import Store
from delaywheel.tallies import LATENESS_BOUNDS_S, EventCounts, Histogram
from delaywheel.wheel import TimingWheel

# How many tasks one list call may look at before it returns a short page: a
# filter that matches little must not stall the loop scanning millions.
LIST_SCAN_BUDGET = 20_000
# How many packed tasks one advance decodes (a few ms of work): a window
# holding half a million is decoded over many turns of the loop, not in one stall.
THAW_BATCH = 2_000
# How many due tasks one advance makes ready: 5-8 ms of work on our 2-core
# machines (3-5 us a task), so 200,000 due in the same second are made ready
# over 200 turns of the loop, with requests served between them, at about the
# same rate as in one stall of a second. Larger batches gain nothing.
FIRE_BATCH = 1_000

_due_of = attrgetter("due_s")  # a timer's due time in the wheel


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
    ) -> None:
        self.store = store
        self.limits = limits or Limits()
        self.targets = targets or TargetRules()
        self.wheel = TimingWheel(slots=slots, tick_s=tick_s, now_s=now_s)
        self.queues = Queues()
        self.journal = Journal(store, self._rollback, durable=self._durable)
        self.attempts = Attempts(
            self._move, self._defer, self.journal, self.wheel, retry or RetryPolicy()
        )
        self.started_s = now_s
        self._tasks = TaskIndex(self._thaw)
        self._counts = TaskCounts()
        self._packed = PackedTasks(min(WINDOW_S, slots * tick_s))
        # Server-made ids: a random per-process prefix and a counter (unique
        # across restarts without a round trip, and cheap to make). 40 bits in
        # base32 are 8 characters, so ids stay within 15 up to 0xfffffff tasks:
        # a str object of 64 bytes, not the 80 that a 17-character id takes.
        self._id_prefix = base64.b32encode(os.urandom(5)).decode().lower()
        self._id_counter = count(1)
        # For metrics, read only when scraped (delaywheel.tallies): events
        # counted where each is handled, and how late the wheel's timers fired.
        self.events = EventCounts()
        self.lateness = Histogram(LATENESS_BOUNDS_S)

    # -- where a task lives --------------------------------------------------

    def _place(self, task: Task) -> None:
        if self._locate(task):
            self._counts.add(task.topic, task.state)

    def _locate(self, task: Task) -> bool:
        """Put a task where its state keeps it; False for states kept nowhere."""
        state = task.state
        if state in IN_WHEEL:
            self.wheel.insert(task, task.timer_s)
        elif state == READY:
            self.queues.push_ready(task)
        elif state == DEAD:
            self.queues.push_dead(task)
        elif state == DELIVERING:
            self.attempts.delivering[task.id] = task
        else:
            return False
        return True

    def _unplace(self, task: Task) -> None:
        state = task.state
        if state in IN_WHEEL:
            if task.scheduled:  # not when the wheel has just fired it
                self.wheel.remove(task)
            elif state == DELAYED:  # fired, waiting for its destination's turn (or not yet placed)
                self.attempts.waiting.pop(task.id, None)
        elif state == READY:
            self.queues.drop_ready(task)
        elif state == DEAD:
            self.queues.drop_dead(task)
        elif state == DELIVERING:
            del self.attempts.delivering[task.id]
        else:
            return
        self._counts.remove(task.topic, state)

    def _move(self, task: Task, event: str, to: str, **fields: Any) -> None:
        """The one way task state changes: check, unplace, change, place, journal."""
        check_transition(task.id, task.state, event, to)
        before = task.snapshot() if task.state != NEW else None
        self._unplace(task)
        for name, value in fields.items():
            setattr(task, name, value)
        task.state = to
        if to == GONE:
            self._tasks.remove(task)
        elif to == DELAYED and task.at_s >= self._packed.hold_from(self.wheel.now_s):
            # Due after the next window: it will be packed once durable
            # (_durable), so it skips the wheel, whose insert and removal
            # would be a fifth of an add. Nothing fires it before then anyway.
            self._counts.add(task.topic, DELAYED)
        else:
            self._place(task)
        self.journal.record(task, before)

    def _fire(self, task: Task) -> None:
        """A task whose timer the wheel fired: ``_move`` without the journal
        (see the module docstring). The wheel has unscheduled it already."""
        if task.state == DELAYED:
            if task.target is not None:
                self.attempts.due(task)  # it stays delayed until its lane has room
                return
            event, to = "due", READY
        else:  # a reservation's TTR ran out
            event, to = "expire", READY
            self.events.expired += 1
            if task.attempts >= task.max_attempts:
                to = DEAD
                self.events.deaths += 1
        check_transition(task.id, task.state, event, to)
        self._unplace(task)
        task.state = to
        self._place(task)

    def _defer(self, task: Task, at_s: float) -> None:
        """A delivering task back to delayed without a journal write: for an
        outcome the store failed to take (``Attempts._outcome_written``)."""
        check_transition(task.id, task.state, "fail", DELAYED)
        self._unplace(task)
        task.state = DELAYED
        task.at_s = at_s
        self._place(task)

    def _rollback(self, undo: list[tuple[Task, tuple[Any, ...]]]) -> None:
        for task, snap in undo:
            self._unplace(task)
            if snap[0] == NEW:
                task.state = GONE
                self._tasks.remove(task)
                continue
            if task.state == GONE:
                self._tasks.restore(task)
            task.restore_fields(snap)
            self._place(task)
        self._serve_waiters(self.wheel.now_s)

    # -- requests ------------------------------------------------------------

    def add(self, fields: Any, now_s: float) -> dict[str, Any]:
        task = self._create(self._checked(fields, now_s), now_s)
        self._serve_waiters(now_s)
        return self._added(task)

    def add_many(self, tasks: Any, now_s: float) -> list[dict[str, Any]]:
        if type(tasks) is not list:
            raise bad(f"add_many takes a list of tasks, got {checks.show(tasks)}")
        checked = []
        seen: set[str] = set()
        for index, fields in enumerate(tasks):
            try:
                new = self._checked(fields, now_s)
                if new.id is not None:
                    if new.id in self._tasks or new.id in seen:
                        raise RequestError("exists", f"a task with id {new.id!r} already exists")
                    seen.add(new.id)
            except RequestError as exc:
                raise RequestError(exc.code, f"task {index}: {exc.message}") from None
            checked.append(new)
        created = [self._create(new, now_s) for new in checked]
        self._serve_waiters(now_s)
        return [self._added(task) for task in created]

    def _checked(self, fields: Any, now_s: float) -> validate.NewTask:
        """A new task's fields, checked, its target too (``add_many`` checks
        every task before it creates any: all or nothing)."""
        new = validate.new_task(fields, now_s, self.limits)
        if new.target is not None:
            new.target = self.targets.check(
                new.target, new.body_packed, task_id=new.id, topic=new.topic
            )
        return new

    def _create(self, new: validate.NewTask, now_s: float) -> Task:
        """Create a task from ``_checked`` fields (``target`` None: the ready queue)."""
        task_id = new.id
        if task_id is None:
            task_id = f"{self._id_prefix}{next(self._id_counter):x}"
        elif task_id in self._tasks:
            raise RequestError("exists", f"a task with id {task_id!r} already exists")
        target = new.target
        task = Task(
            task_id,
            new.topic,
            new.at_s,
            body_packed=new.body_packed,
            ttr_s=new.ttr_s,
            max_attempts=new.max_attempts,
            created_s=now_s,
            target=target,
        )
        self._tasks.add(task)
        # A targeted task due now is delayed all the same: the next tick sends it.
        due_later = new.at_s > now_s or target is not None
        self._move(task, "add", DELAYED if due_later else READY)
        self.events.added += 1
        return task

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
        self._move(task, "update", to, **new)
        self.events.updated += 1
        self._serve_waiters(now_s)
        return self.describe(task)

    def delete(self, task_id: Any, now_s: float) -> bool:
        task = self._tasks.get(validate.task_id(task_id))
        if task is None:
            return False
        self._move(task, "delete", GONE)
        self.events.deleted += 1
        return True

    def get(self, task_id: Any, now_s: float) -> dict[str, Any] | None:
        task = self._tasks.get(validate.task_id(task_id))
        return None if task is None else self.describe(task)

    def list_tasks(self, query: Any, now_s: float) -> dict[str, Any]:
        q = validate.list_query(query)

        def wanted(task: Task) -> bool:
            return (q.topic is None or task.topic == q.topic) and (
                q.state is None or task.state == q.state
            )

        # Packed tasks join the creation order as they are decoded, after
        # every task there: a client paging to the end meets each once.
        self._thaw_ids(self._packed.take(LIST_SCAN_BUDGET))
        tasks, cursor = self._tasks.page(q.cursor, wanted, q.limit, LIST_SCAN_BUDGET)
        if cursor is None and self._packed.count:  # more to decode: come back
            cursor = max(q.cursor, self._tasks.last_seq())
        return {"tasks": [self.describe(task) for task in tasks], "next": cursor}

    def try_reserve(self, topics: Any, now_s: float) -> dict[str, Any] | None:
        """Reserve the oldest ready task of ``topics`` now, or return None."""
        task = self.queues.oldest_ready(validate.topics(topics))
        return None if task is None else self._reserve(task, now_s)

    def wait_reserve(self, waiter: Waiter) -> None:
        self.queues.add_waiter(waiter)

    def cancel_wait(self, waiter: Waiter) -> None:
        self.queues.cancel_waiter(waiter)

    def _reserve(self, task: Task, now_s: float) -> dict[str, Any]:
        attempts = task.attempts + 1
        if task.ttr_s == 0:  # at-most-once: gone, durably, before it is handed out
            self._move(task, "reserve", GONE, attempts=attempts)
        else:
            self._move(task, "reserve", RESERVED, attempts=attempts, deadline_s=now_s + task.ttr_s)
        self.events.reserved += 1
        return self.describe(task)

    def ack(self, task_id: Any, now_s: float) -> bool:
        task = self._find(task_id)
        self._move(task, "ack", GONE)
        self.events.acked += 1
        return True

    def release(self, task_id: Any, delay_s: Any, now_s: float) -> bool:
        task = self._find(task_id)
        delay = checks.number(
            "delay", 0 if delay_s is None else delay_s, high=self.limits.max_delay_s
        )
        if task.state == RESERVED and task.attempts >= task.max_attempts:
            self._move(task, "release", DEAD)
            self.events.deaths += 1
        else:
            at_s = now_s + delay
            self._move(task, "release", DELAYED if delay > 0 else READY, at_s=at_s)
        self.events.released += 1
        self._serve_waiters(now_s)
        return True

    def touch(self, task_id: Any, now_s: float) -> float:
        task = self._find(task_id)
        if task.state == RESERVED and now_s > task.deadline_s:
            raise RequestError(
                "conflict",
                f"cannot touch task {task.id!r}: its deadline passed at {task.deadline_s}",
            )
        self._move(task, "touch", RESERVED, deadline_s=now_s + task.ttr_s)
        self.events.touched += 1
        return task.deadline_s

    def kick(self, topic: Any, count_: Any, now_s: float) -> int:
        name = validate.topic(topic)
        if type(count_) is not int or count_ < 1:
            raise bad(f"count must be an int >= 1, got {checks.show(count_)}")
        kicked = self.queues.oldest_dead(name, count_)
        for task in kicked:
            if task.target is None:
                self._move(task, "kick", READY, attempts=0)
            else:  # due now: the next tick sends it
                self._move(task, "kick", DELAYED, attempts=0, at_s=now_s)
        self.events.kicked += len(kicked)
        self._serve_waiters(now_s)
        return len(kicked)

    @property
    def task_counts(self) -> TaskCounts:
        """Tasks by state and by topic, as ``stats`` reports them."""
        return self._counts

    @property
    def packed_count(self) -> int:
        """Delayed tasks held packed (``delaywheel.engine.cold``): ``stats``' ``wheel.packed``."""
        return self._packed.count

    def stats(self, now_s: float) -> dict[str, Any]:
        wheel = self.wheel.stats()
        return {
            "version": __version__,
            "uptime": now_s - self.started_s,
            "tasks": len(self._tasks),
            "states": self._counts.by_state(),
            "topics": self._counts.by_topic(),
            "slots": self.wheel.slots,
            "tick": self.wheel.tick_s,
            "cursor": wheel.cursor_slot,
            "wheel": {
                "pending": wheel.pending,
                "in_ring": wheel.in_ring,
                "above_ring": wheel.above_ring,
                "buckets": wheel.buckets,
                "packed": self._packed.count,
            },
            "waiting_reserves": self.queues.waiter_count(),
            "store": self.store.url,
            "flushes": self.journal.flushes,
            "last_flush_size": self.journal.last_batch_size,
            "max_flush_size": self.journal.max_batch_size,
        }

    # -- time ------------------------------------------------------------------

    def advance(self, now_s: float) -> int:
        """Fire what the wheel says is due, at most ``FIRE_BATCH`` tasks; returns
        how many it moved. With more due, ``next_fire_s()`` is at or before
        ``now_s``, so the driver calls again on the next turn of the loop."""
        thaw_s = self._packed.next_thaw_s()
        if thaw_s is not None and thaw_s <= now_s:
            self._thaw_ids(self._packed.take(THAW_BATCH, by_s=now_s))
        fired = self.wheel.advance(now_s, FIRE_BATCH)
        if fired:
            self._count_fired(fired, now_s)
        for task in fired:
            assert isinstance(task, Task)
            self._fire(task)
        if fired:
            self._serve_waiters(now_s)
        return len(fired)

    def _count_fired(self, fired: list[Any], now_s: float) -> None:
        """Count a batch of fired timers and how late each fired (after its due
        time, or a reservation's deadline), a few bisects per batch rather than
        one per timer: ``fired`` is in due order, so those at most a bound late
        are a run at its end."""
        n = len(fired)
        self.events.fired += n
        lateness = self.lateness
        bounds, counts = lateness.bounds, lateness.counts
        lateness.total += n * now_s - sum([timer.due_s for timer in fired])
        first = bisect_left(bounds, now_s - fired[-1].due_s)  # the least late one's bucket
        last = bisect_left(bounds, now_s - fired[0].due_s)
        at_most = 0  # how many are at most the previous bound late
        for i in range(first, last):
            below = n - bisect_left(fired, now_s - bounds[i], key=_due_of)
            counts[i] += below - at_most
            at_most = below
        counts[last] += n - at_most

    def next_fire_s(self) -> float | None:
        """When ``advance`` next has work: a tick with timers, or packed tasks to decode."""
        fire_s, thaw_s = self.wheel.next_fire_s(), self._packed.next_thaw_s()
        if fire_s is None or thaw_s is None:
            return thaw_s if fire_s is None else fire_s
        return min(fire_s, thaw_s)

    # -- deliveries --------------------------------------------------------------

    def start_deliveries(self, queue: Callable[[str, dict[str, Any]], None]) -> None:
        """Queue due targeted tasks with the dispatcher (``delaywheel.engine.attempts``)."""
        self.attempts.start(queue)

    def delivered(self, task_id: str, attempt: int, error: str | None, now_s: float) -> None:
        """The outcome of a delivery attempt: None for delivered, else why it failed."""
        self.attempts.outcome(task_id, attempt, error, now_s)

    # -- waiters -----------------------------------------------------------------

    def _serve_waiters(self, now_s: float) -> None:
        """Hand ready tasks to blocked reserves, first come first served."""
        queues = self.queues
        if not queues.has_waiters():
            return
        for topic in queues.waiting_topics():
            while (waiter := queues.next_waiter(topic)) is not None:
                task = queues.oldest_ready(waiter.topics)
                if task is None:
                    break
                queues.cancel_waiter(waiter)
                waiter.deliver(self._reserve(task, now_s))

    # -- reading -----------------------------------------------------------------

    def _find(self, task_id: Any) -> Task:
        task = self._tasks.get(validate.task_id(task_id))
        if task is None:
            raise RequestError("not_found", f"no task with id {task_id!r}")
        return task

    def describe(self, task: Task) -> dict[str, Any]:
        return describe(task, self.wheel)

    # -- recovery ----------------------------------------------------------------

    async def load(self, batches: AsyncIterator[list[tuple[str, bytes]]]) -> int:
        """Rebuild every task from store records; corrupt ones are logged and
        skipped. Returns how many loaded (see ``delaywheel.engine.cold``)."""
        return await load_tasks(
            batches,
            wheel=self.wheel,
            index=self._tasks,
            counts=self._counts,
            packed=self._packed,
            locate=self._locate,
        )

    def _durable(self, tasks: dict[str, Task], changes: Mapping[str, bytes | None]) -> None:
        """A batch is in the store: pack its far delayed tasks (``delaywheel.engine.cold``).

        Packed, a task is the record just written, which is the task as it is
        now only if nothing has changed it since: it must be the indexed task
        of its id, still delayed, and in no batch still gathering or being
        written (that batch comes here in turn). Its counts stay as they are.
        ``_move`` left such a task out of the wheel; one that can no longer be
        packed (its window came closer while the write took) is scheduled now.
        """
        now_s = self.wheel.now_s
        hold_from_s = self._packed.hold_from(now_s)
        by_id, pending = self._tasks.by_id, self.journal.is_pending
        held: list[str] = []
        held_at: list[float] = []
        for task_id, task in tasks.items():
            if task.state != DELAYED or by_id.get(task_id) is not task or pending(task):
                continue
            if task.at_s < hold_from_s:
                # Left out of the wheel by _move, to be packed: too close now.
                # (One the wheel fired into its lane is unscheduled too: not that.)
                if not task.scheduled and task_id not in self.attempts.waiting:
                    self.wheel.insert(task, task.at_s)
                continue
            record = changes[task_id]
            assert record is not None  # a delayed task's change is a put
            if task.scheduled:
                self.wheel.remove(task)
            self._tasks.freeze(task, record)
            held.append(task_id)
            held_at.append(task.at_s)
        if held:
            self._packed.hold(held, held_at, now_s)

    def _thaw(self, task_id: str, record: bytes) -> Task:
        """Decode a packed task and schedule it (``TaskIndex.get`` calls this)."""
        # Read and checked again (it passed at load, so this cannot fail): the
        # checks are a fraction of the unpacking, which has to happen anyway.
        task = from_record(task_id, record)
        self._tasks.add(task)
        self._locate(task)  # already counted, at load
        self._packed.thawed()
        return task

    def _thaw_ids(self, task_ids: list[str]) -> None:
        get = self._tasks.get
        for task_id in task_ids:
            get(task_id)  # decodes the task if it is still packed
