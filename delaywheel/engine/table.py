"""The task table: every task, the containers that hold them, and every state change.

A task lives in exactly one place, and which one follows from its state
(``task.py``): ``delayed`` and ``reserved`` tasks in the wheel (at their due
time and their TTR deadline), ``ready`` ones in their topic's ready queue,
``dead`` ones in their topic's dead list, ``delivering`` ones (an HTTP or
broker target's attempt in flight) in ``delivering``. A ``delayed`` task is
out of the wheel in two cases: the wheel fired it and it waits for its
destination's lane (``waiting``; ``delaywheel.engine.attempts``), or it is
due after the next window and kept packed (``packed``, ``index`` holding its
record; ``delaywheel.engine.cold``), or due beyond the horizon and kept
only in the store's far tier (``delaywheel.engine.horizon``). Every live
task in memory is in ``index``, and every task, the far tier's too, is
counted by state and topic in ``counts``.

This class is the only writer of those containers. A new task comes in
through ``create`` (which makes its id when the client gave none); a
request's change goes through ``move``, which checks the transition table, takes the task out of
the place its old state kept it in, changes it, puts it where the new state
keeps it, and journals it. Because a task's place follows from its state,
undoing a change after a failed store write (``rollback``) is just putting
the task back as its snapshot was.

The changes time makes, ``due`` (delayed to ready) and ``expire`` (a
reservation's TTR ran out: ready, or dead on the last attempt), go through
``fire``: the same table and bookkeeping, but no journal. They follow from
the stored record and the clock alone: a restart loads the record into the
wheel at the same time, which fires at once and makes the same move, so
writing them would cost a store write per fired task for nothing. ``defer``
is the other change left out of the journal: a delivery whose outcome the
store did not take, tried again later.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable, Iterable
from itertools import count
from typing import Any

from delaywheel.engine.batches import Undo
from delaywheel.engine.cold import WINDOW_S, ColdTasks, PackedTasks
from delaywheel.engine.flow import Flow
from delaywheel.engine.horizon import Horizon
from delaywheel.engine.index import TaskCounts, TaskIndex
from delaywheel.engine.journal import Hooks
from delaywheel.engine.lanes import journal_for
from delaywheel.engine.queues import Queues, Watch
from delaywheel.engine.record import TOPIC_FIELD, read_record, to_record
from delaywheel.engine.shares import Basis
from delaywheel.engine.task import (
    DEAD,
    DELAYED,
    DELIVERING,
    DONE,
    FINAL,
    GONE,
    IN_WHEEL,
    NEW,
    READY,
    RESERVED,
    Completion,
    Task,
    check_transition,
    describe,
)
from delaywheel.engine.topics import TopicSettings, TopicTable
from delaywheel.errors import RequestError
from delaywheel.ha.ownership import Ownership, WholeKeyspace
from delaywheel.schedules.occurrence import Occurrence, occurrence
from delaywheel.store.base import Store
from delaywheel.store.watch import DEFAULT_SLOW_FLUSH_S
from delaywheel.tallies import EventCounts
from delaywheel.wheel import TimingWheel


def _occurrence_in_utc(task_id: str) -> Occurrence | None:
    return occurrence(task_id, None)


def _dead_kept_for_ever(topic: str) -> float | None:
    return None


class TaskTable:
    def __init__(
        self,
        store: Store,
        *,
        slots: int,
        tick_s: float,
        now_s: float,
        ownership: Ownership | None = None,
        occurrence_of: Callable[[str], Occurrence | None] = _occurrence_in_utc,
        slow_flush_s: float = DEFAULT_SLOW_FLUSH_S,
        topic_dead_retain_s: Callable[[str], float | None] = _dead_kept_for_ever,
        horizon_s: float | None = None,
    ) -> None:
        self._make_containers(slots, tick_s, now_s)
        self._make_store_side(store, slow_flush_s, horizon_s)
        self._make_id_source()
        self._keep_what_the_engine_gives(ownership, occurrence_of, topic_dead_retain_s)
        # Blocked ``wait`` calls by task id, answered when the task reaches
        # a state in FINAL (``_answer_watches``).
        self.watches: dict[str, list[Watch]] = {}
        self._make_topic_settings()

    def _make_containers(self, slots: int, tick_s: float, now_s: float) -> None:
        """The places a task lives in memory, and its counts."""
        self.wheel = TimingWheel(slots=slots, tick_s=tick_s, now_s=now_s)
        self.queues = Queues()
        # Due targeted tasks waiting for their destination's turn: delayed,
        # out of the wheel (``delaywheel.engine.attempts``).
        self.waiting: dict[str, Task] = {}
        self.delivering: dict[str, Task] = {}  # by id
        self.counts = TaskCounts()
        # A lap of a small wheel may be shorter than the window: never longer.
        self.packed = PackedTasks(min(WINDOW_S, slots * tick_s))
        self.cold = ColdTasks(self)
        self.index = TaskIndex(self.cold.decode)
        # For metrics, read only when scraped (delaywheel.tallies): events
        # counted where each is handled.
        self.events = EventCounts()

    def _make_store_side(self, store: Store, slow_flush_s: float, horizon_s: float | None) -> None:
        """The store's side: the far tier beyond the horizon, the journal that writes."""
        # Delayed tasks beyond --horizon: only in the store (engine/horizon.py).
        self.horizon = Horizon(self, store, horizon_s)
        self.journal = journal_for(
            store,
            Hooks(durable=self.cold.pack, rolled_back=self.rollback),
            slow_flush_s=slow_flush_s,
            tiering=self.horizon if self.horizon.on else None,
        )

    def _make_id_source(self) -> None:
        """Where the ids the server makes (``create``) come from."""
        # Server-made ids: a random per-process prefix and a counter (unique
        # across restarts without a round trip, and cheap to make). 40 bits in
        # base32 are 8 characters, so ids stay within 15 up to 0xfffffff tasks:
        # a str object of 64 bytes, not the 80 that a 17-character id takes.
        self._id_prefix = base64.b32encode(os.urandom(5)).decode().lower()
        self._id_counter = count(1)

    def _keep_what_the_engine_gives(
        self,
        ownership: Ownership | None,
        occurrence_of: Callable[[str], Occurrence | None],
        topic_dead_retain_s: Callable[[str], float | None],
    ) -> None:
        """The engine's rules: which ids are served here, occurrences, retention."""
        # Which ids this node serves (ha/ownership.py), so that server-made ids
        # fall in a partition it serves.
        self.ownership = WholeKeyspace() if ownership is None else ownership
        # A schedule's occurrence as its deliveries and task maps show it; the
        # engine gives its schedules' look-up, which knows each one's zone.
        self.occurrence_of = occurrence_of
        # How long a dead task of a topic is kept after it died (its
        # ``deadline_s``, 0: not known), in the wheel at the time it goes;
        # None: for ever (the engine's ``topic_dead_retain_s``).
        self.topic_dead_retain_s = topic_dead_retain_s

    def _make_topic_settings(self) -> None:
        # Topic settings and what they hold back (engine/topics.py, engine/flow.py).
        self.flow = Flow(self.counts, self._basis)
        self.topics = TopicTable(self.journal, self._check_served, self._topic_changed)

    def _check_served(self, key: str) -> None:
        if not self.ownership.owns_all:  # no call on one node
            self.ownership.check(key)

    def _basis(self) -> Basis:
        """Who serves how many partitions, for the topics' shares (engine/shares.py)."""
        own = self.ownership
        counts = tuple(sorted(own.partition_counts().items()))
        return Basis(own.node or "", own.partitions, counts)

    def _topic_changed(self, topic: str, before: TopicSettings, after: TopicSettings) -> None:
        """What this node applies to ``topic`` changed (engine/topics.py)."""
        self.flow.changed(topic, after)
        if after.dead_retain != before.dead_retain:
            self.retime_dead(topic)

    def retime_dead(self, topic: str) -> None:
        """``topic``'s dead tasks, each to go when its topic's dead retention
        now says (a change of the topic's ``dead_retain``)."""
        for task in self.queues.oldest_dead(topic, self.counts.of_topic(topic).get(DEAD, 0)):
            if task.scheduled:
                self.wheel.remove(task)
            self._time_dead(task)

    def _time_dead(self, task: Task) -> None:
        """A dead task into the wheel at the time it goes (its death, its
        ``deadline_s``, plus its topic's dead retention), unless kept for ever
        or its death is not known (0)."""
        if task.deadline_s:
            kept_s = self.topic_dead_retain_s(task.topic)
            if kept_s is not None:
                self.wheel.insert(task, task.deadline_s + kept_s)

    # -- where a task lives --------------------------------------------------

    def place(self, task: Task) -> None:
        if self.locate(task):
            self.counts.add(task.topic, task.state)

    def locate(self, task: Task) -> bool:
        """Put a task where its state keeps it; False for states kept nowhere."""
        state = task.state
        if state in IN_WHEEL:
            self.wheel.insert(task, task.timer_s)
        elif state == READY:
            self.queues.push_ready(task)
        elif state == DEAD:
            self.queues.push_dead(task)
            self._time_dead(task)
        elif state == DELIVERING:
            self.delivering[task.id] = task
        else:
            return False
        return True

    def unplace(self, task: Task) -> None:
        state = task.state
        if state in IN_WHEEL:
            if task.scheduled:  # not when the wheel has just fired it
                self.wheel.remove(task)
            elif state == DELAYED:  # fired, waiting for its destination's turn (or not yet placed)
                self.waiting.pop(task.id, None)
        elif state == READY:
            self.queues.drop_ready(task)
        elif state == DEAD:
            self.queues.drop_dead(task)
            if task.scheduled:  # kept for --dead-retention
                self.wheel.remove(task)
        elif state == DELIVERING:
            del self.delivering[task.id]
        else:
            return
        self.counts.remove(task.topic, state)

    # -- changes -------------------------------------------------------------

    def exists(self, task_id: str) -> RequestError:
        """The ``exists`` answer to an add of ``task_id``, which the index holds.

        That answer acknowledges the task, so it goes out only once the store
        has confirmed it: the task's record is journaled again, unchanged, and
        the reply waits for that write (a mutating request's reply waits for
        the pending batch), failing with it. Without this, a node that loaded
        the task from a Redis primary about to be demoted (a write never
        confirmed by ``--replicas``, a client's resend across a Sentinel
        failover) answered ``exists`` for a task the demotion then dropped. A
        task with a change not yet durable needs no rewrite: that change's
        batch is the pending one: the reply waits for it (``wait_for``)."""
        self.confirm(task_id)
        return RequestError("exists", f"a task with id {task_id!r} already exists")

    def confirm(self, task_id: str) -> None:
        """Journal ``task_id``'s state again, unchanged: its record, or its
        absence when no task has the id. The next ``pending()`` waits for that
        write, or for the pending change of the task that makes it needless:
        for what acknowledges a change an earlier write may hold without its
        replicas' confirmation (``exists``, a delivery attempt's outcome)."""
        found = self.index.by_id.get(task_id)
        if isinstance(found, bytes):  # packed: its record as written
            self.journal.record_other(task_id, found, _nothing)
        elif found is None:
            self.journal.record_other(task_id, None, _nothing)
        elif not self.journal.is_pending(found):
            self.journal.record_other(task_id, to_record(found), _nothing)
        else:
            self.journal.wait_for(task_id)

    def create(self, task: Task, now_s: float) -> Task:
        """Add a new task (``validate.new_task``, its target checked by
        ``Engine._checked``; None: the ready queue): given an id if the server
        is to make it (``validate.SERVER_MADE_ID``), indexed and placed:
        delayed, or ready when due now."""
        # A targeted task due now is delayed all the same: the next tick sends it.
        due_later = task.at_s > now_s or task.target is not None
        task_id = task.id
        if not task_id:  # SERVER_MADE_ID
            task_id = f"{self._id_prefix}{next(self._id_counter):x}"  # as _new_id, inline
            if not self.ownership.owns_all:  # no call on one node
                task_id = self.ownership.new_id(task_id, self._new_id)
            task.id = task_id
        elif task_id in self.index:
            raise self.exists(task_id)
        elif self.horizon.unconfirmed and task_id in self.horizon.unconfirmed:
            self.journal.wait_for(task_id)  # the blind add in flight answers for both
            raise RequestError("exists", f"a task with id {task_id!r} already exists")
        elif (
            self.horizon.far_total
            and self.horizon.may_hold(task_id)
            and not self.journal.touches(task_id)  # a change of it pending: memory knew it
        ):
            # The far tier may hold the id: the put is made only if it does not,
            # and the task joins memory once the store says so (engine/horizon.py).
            task.state = DELAYED if due_later else READY
            self.horizon.unconfirmed[task_id] = task
            self.journal.blind(task)
            self.events.added += 1
            return task
        self.index.add(task)
        # move(task, "add", ...) without its check and unplace: a new task may
        # always be added, and is in no place yet (5 % of the engine's add,
        # docs/performance.md "Measurements behind the code").
        task.state = DELAYED if due_later else READY
        self._keep(task)
        self.journal.record(task, None)
        self.events.added += 1
        return task

    def create_together(self, tasks: list[Task], now_s: float) -> list[Task]:
        """``add_many``'s tasks as blind adds of one group (engine/horizon.py,
        ``Horizon.together``): each put only if the store holds none of their
        ids, and in memory once the write says so."""
        for task in tasks:
            if not task.id:  # SERVER_MADE_ID
                task_id = self._new_id()
                if not self.ownership.owns_all:
                    task_id = self.ownership.new_id(task_id, self._new_id)
                task.id = task_id
            task.state = DELAYED if task.at_s > now_s or task.target is not None else READY
        self.horizon.new_group(tasks)
        self.journal.blind_many(tasks)
        self.events.added += len(tasks)
        return tasks

    def _new_id(self) -> str:
        """A server-made id: the per-process prefix and the next count."""
        return f"{self._id_prefix}{next(self._id_counter):x}"

    def move(self, task: Task, event: str, to: str, **fields: Any) -> None:
        """The one way a request changes a task: check, unplace, change, place, journal."""
        check_transition(task.id, task.state, event, to)
        before = task.snapshot() if task.state != NEW else None
        if self.flow.limited:  # the move may free one of the topic's slots
            self.flow.freed(task.topic)
        self.unplace(task)
        for name, value in fields.items():
            setattr(task, name, value)
        task.state = to
        self._keep(task)
        self.journal.record(task, before)
        if self.watches and to in FINAL:  # one dict's truth on most moves
            self._answer_watches(task)

    def complete(
        self, task: Task, event: str, outcome: str, result_packed: bytes | None, now_s: float
    ) -> None:
        """An ack or a delivery: ``done`` and kept for the task's ``retain``
        seconds (its own, else its topic's), else ``gone``. A gone task keeps
        its completion in memory for the ``wait`` calls it answers."""
        # Most tasks: no retain of their own (no completion), none of their
        # topic's (no settings applied), no wait on any task: gone at once,
        # for two look-ups that miss.
        if task.completion is None and not self.watches and task.topic not in self.topics.applied:
            self.move(task, event, GONE)
            return
        retain_s = self.retain_of(task)
        if retain_s <= 0 and not (self.watches and task.id in self.watches):
            self.move(task, event, GONE)  # nothing more to keep
            return
        own_s = None if task.completion is None else task.completion.retain_s
        completion = Completion(own_s, now_s, outcome, result_packed)
        if retain_s > 0:
            self.move(task, event, DONE, completion=completion, deadline_s=now_s + retain_s)
        else:
            self.move(task, event, GONE, completion=completion)

    def retain_of(self, task: Task) -> float:
        """How long ``task`` is kept once done: its own ``retain``, else its topic's."""
        done = task.completion
        own_s = None if done is None else done.retain_s
        return self.topics.of(task.topic).retain if own_s is None else own_s

    # -- blocked waits -------------------------------------------------------

    def watch(self, watch: Watch) -> None:
        self.watches.setdefault(watch.task_id, []).append(watch)

    def cancel_watch(self, watch: Watch) -> None:
        """A timed-out or disconnected ``wait``: out of its task's line."""
        line = self.watches.get(watch.task_id)
        if line is not None and watch in line:
            line.remove(watch)
            if not line:
                del self.watches[watch.task_id]

    def _answer_watches(self, task: Task) -> None:
        """The task is done, dead or gone: every ``wait`` on it gets its map."""
        line = self.watches.pop(task.id, None)
        if line is not None:
            final = self.describe(task)
            for watch in line:
                watch.deliver(final)

    def _keep(self, task: Task) -> None:
        """Keep a task just changed (``move``, ``create``) where its new state says."""
        state = task.state
        if state == GONE:
            self.index.remove(task)
        elif state == DELAYED and task.at_s >= self.packed.hold_from(self.wheel.now_s):
            # Due after the next window: it will be packed once durable
            # (``ColdTasks.pack``), so it skips the wheel, whose insert and removal
            # would be a fifth of an add. Nothing fires it before then anyway.
            self.counts.add(task.topic, DELAYED)
            if task.at_s >= self.horizon.watermark_s:  # beyond the horizon: the far tier's
                self.journal.mark_far(task)
        else:
            self.place(task)

    def adopt(self, task: Task) -> None:
        """A blind add the store took (engine/horizon.py): into memory as
        ``create`` puts a task, now that it is durable."""
        self.index.add(task)
        if task.state == DELAYED and task.at_s >= self.packed.hold_from(self.wheel.now_s):
            self.counts.add(task.topic, DELAYED)  # the durable hook packs or schedules it
        else:
            self.place(task)

    def fire(self, task: Task) -> None:
        """A task whose timer the wheel fired (it has unscheduled it already),
        but a targeted delayed one (``Attempts.due``): ``move`` without the
        journal (see the module docstring)."""
        if task.state == DONE or task.state == DEAD:  # kept long enough: journaled
            self.move(task, "lapse", GONE)
            self.events.lapsed += 1
            return
        if task.state == DELAYED:
            event, to = "due", READY
        else:  # a reservation's TTR ran out
            event, to = "expire", READY
            self.events.expired += 1
            if task.attempts >= task.max_attempts:
                to = DEAD
                self.events.deaths += 1
        check_transition(task.id, task.state, event, to)
        if self.flow.limited:  # an expired reservation frees one of the topic's slots
            self.flow.freed(task.topic)
        self.unplace(task)
        task.state = to
        self.place(task)
        if to == DEAD and self.watches:
            self._answer_watches(task)

    def wait_for_lane(self, task: Task) -> None:
        """A targeted task the wheel fired: it stays delayed, out of the wheel,
        until its destination's lane has room."""
        self.waiting[task.id] = task

    def retime(self, task: Task, timer_s: float) -> None:
        """Move a scheduled task's timer (not its due time)."""
        self.wheel.remove(task)
        self.wheel.insert(task, timer_s)

    def defer(self, task: Task, at_s: float) -> None:
        """A delivering task back to delayed without a journal write: for an
        outcome the store failed to take (``Attempts._outcome_written``)."""
        check_transition(task.id, task.state, "fail", DELAYED)
        self.unplace(task)
        task.state = DELAYED
        task.at_s = at_s
        self.place(task)

    def rollback(self, undo: Undo) -> None:
        """Put back the tasks of batches the store failed to write (the journal's)."""
        ownership = self.ownership
        owns_all = ownership.owns_all
        by_id = self.index.by_id
        for task, snap in undo:
            if not owns_all and not ownership.owns(task.id):
                continue  # its partition was dropped: the store has its truth
            current = by_id.get(task.id)
            if current is not task and not (current is None and task.state == GONE):
                # Dropped since (a self-fence), and maybe loaded again (a new
                # object): the store's truth replaced it, as above.
                continue
            self.unplace(task)
            if snap[0] == NEW:
                task.state = GONE
                self.index.remove(task)
                continue
            if task.state == GONE:
                self.index.restore(task)
            task.restore_fields(snap)
            self.place(task)
        self.serve_waiters(self.wheel.now_s)

    def drop(
        self,
        leaving: Callable[[str], bool],
        keep_delivering: bool = False,
        among: Iterable[str] | None = None,
    ) -> list[Task]:
        """Take every task whose id is ``leaving`` out of the table, without a
        journal write (its partition is another node's now; the store keeps
        it). With ``keep_delivering`` the delivering ones stay (their
        attempts are in flight) and are returned. ``among``: only these ids
        are looked at, not every id in the table."""
        by_id = self.index.by_id
        delivering = []
        ids = by_id if among is None else [task_id for task_id in among if task_id in by_id]
        for task_id in [task_id for task_id in ids if leaving(task_id)]:
            found = by_id[task_id]
            if isinstance(found, bytes):  # packed: counted as delayed, in no container
                del by_id[task_id]
                self.counts.remove(read_record(task_id, found)[TOPIC_FIELD], DELAYED)
                self.packed.thawed()
                continue
            if found.state == DELIVERING and keep_delivering:
                delivering.append(found)
                continue
            self.unplace(found)
            self.index.remove(found)
        if self.watches:  # their tasks are another node's now: told to ask it
            for task_id in [task_id for task_id in self.watches if leaving(task_id)]:
                for watch in self.watches.pop(task_id):
                    watch.deliver(None)
        return delivering

    # -- handing tasks out -----------------------------------------------------

    def reserve(self, task: Task, now_s: float) -> dict[str, Any]:
        """Hand a ready task out: reserved until its TTR runs out, or gone."""
        attempts = task.attempts + 1
        if task.ttr_s == 0:  # at-most-once: gone, durably, before it is handed out
            self.move(task, "reserve", GONE, attempts=attempts)
        else:
            self.move(task, "reserve", RESERVED, attempts=attempts, deadline_s=now_s + task.ttr_s)
        if self.flow.limited:
            self.flow.took(task.topic, now_s)
        self.events.reserved += 1
        return self.describe(task, now_s)

    def describe(self, task: Task, reserved_s: float | None = None) -> dict[str, Any]:
        """The task map (task.describe); an occurrence's has ``schedule``,
        ``nominal`` and ``nominal_local`` too, and, handed out by a reserve at
        ``reserved_s``, ``late_by`` (docs/protocol.md)."""
        info = describe(task, self.wheel)
        if task.id.startswith("s:"):  # the only cost to any other task
            found = self.occurrence_of(task.id)
            if found is not None:
                info["schedule"] = found.schedule_id
                info["nominal"] = found.nominal_s
                info["nominal_local"] = found.nominal_local
                if reserved_s is not None:
                    info["late_by"] = found.late_by_s(reserved_s)
        return info

    def serve_waiters(self, now_s: float) -> None:
        """Hand ready tasks to blocked reserves, first come first served, from
        the topics whose gate is open (engine/flow.py)."""
        queues = self.queues
        if not queues.has_waiters():
            return
        flow = self.flow
        if flow.limited or flow.woken:
            for topic in flow.opened(now_s, queues.has_ready):
                queues.wake(topic)
        for topic in queues.waiting_topics():
            while (waiter := queues.next_waiter(topic)) is not None:
                topics = (
                    waiter.topics if not flow.limited else flow.open_topics(waiter.topics, now_s)
                )
                task = queues.oldest_ready(topics)
                if task is None:
                    break
                queues.cancel_waiter(waiter)
                waiter.deliver(self.reserve(task, now_s))


def _nothing() -> None:
    """A confirming rewrite changes nothing in memory: nothing to undo."""
