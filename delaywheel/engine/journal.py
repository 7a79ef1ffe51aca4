"""Group commit: the changes of one event-loop turn go to the store in one write.

How it works
------------
The engine applies a change in memory and calls ``record(task)``. The task
joins the *gathering* batch of its *lane*; the first change of a batch
schedules a flush for the next loop turn (``call_soon``), so every request
decoded in this turn, on every connection, lands in the same write. A store
that completes at once (``Store.inline``: memory) is flushed by the
connection at the end of its work instead (``hold()``, ``release()``), so
its replies leave in the turn that made them. A flush packs each changed
task once (the last state wins) and submits the batches to the store,
which calls back when they are durable: no Task or coroutine per flush.

Lanes (``Store.lanes``): one for memory and SQLite, one per partition on a
Redis keyspace; each has at most one write in flight and gathers its next
batch meanwhile. This module is the one-lane path (a single node's, and a
lane's ready alone); several lanes' writes at once are engine/lanes.py's
``LanesJournal``. The batches and what a reply waits on: engine/batches.py.

Once a batch is durable the ``durable`` hook sees what it held before the
replies go out (the task table packs its far-future tasks then, from the
records just written: ``delaywheel.engine.cold``).

Replies wait on batches: whoever needs "durable" asks ``pending()`` for
what the changes recorded since its last call wait on (the batch of their
lane, or a ``Joint`` of several lanes' batches: ``add_many`` spans
partitions; nothing recorded: the newest batch of every lane) and
registers a callback on it, called once that write has returned, or failed.

A batch keeps, for each task it touched, a snapshot taken at the first touch.
If a write fails, the ``rolled_back`` hook restores the snapshots of the
failed batch and of the batch gathered after it in the same lane (newest
first, since the later one built on it), and all of their waiters get the
error: nothing unacknowledged stays applied. Other lanes are untouched.

A write the store took but could not confirm durable (``Unconfirmed``: on
the Redis primary, too few replicas confirmed it) is not undone: the store
holds it, so the task table keeps it too (the ``durable`` hook sees it, as
a durable batch), and only its waiters get the error (``unavailable``: the
durability is unknown, not the change). The batch gathered behind it goes
on as usual. Rolling it back would leave a task the store holds and the
node forgets: never served, never fired, until its partition is loaded
again. Whoever must know the change is durable before acting on it (a
delivery attempt: engine/attempts.py) sees the error on its callback and
journals the change again until a write of it is confirmed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from delaywheel.engine.batches import Batch, BlindWait, Joint, Lane, Undo, Wait
from delaywheel.engine.cold import Written
from delaywheel.engine.record import to_record
from delaywheel.engine.task import GONE, NEW, Task
from delaywheel.store.base import Store, StoreError, Tiers, Unconfirmed
from delaywheel.store.watch import DEFAULT_SLOW_FLUSH_S, StoreWatch

log = logging.getLogger("delaywheel.journal")  # pinned: its name is documented


@dataclass(frozen=True)
class Hooks:
    """What the journal tells its owner (the task table), as ``ScheduleTable``'s hooks.

    ``durable(written)``: batches are in the store, each as (its tasks by id,
    the records written, whether a task has a change still not durable); the
    lanes one store answer settled come in one call. Batches the store took
    without confirming them (``Unconfirmed``) come here too: their changes
    stay, only their waiters get the error. ``rolled_back(undo)``: put back
    the tasks of failed batches (the write did not reach the store, or its
    outcome is unknown)."""

    durable: Callable[[Written], None]
    rolled_back: Callable[[Undo], None]


class Tiering(Protocol):
    """What the journal asks the horizon (engine/horizon.py)."""

    far_ids: dict[str, tuple[str, int]]

    def tiers_for(
        self, tasks: dict[str, Task], marked: bool, records: Collection[str] = ()
    ) -> Tiers | None: ...

    def written(
        self, tasks: dict[str, Task], tiers: Tiers, pending: Callable[[Task], bool]
    ) -> None: ...

    def failed(self, tiers: Tiers | None) -> None: ...


class Journal:
    """Group commit on a store of one lane (memory, SQLite), and what every
    store's journal shares; a store of lanes has engine/lanes.py's
    ``LanesJournal`` (``journal_for`` picks)."""

    several_lanes = False  # LanesJournal's: only it starts several lanes' writes at once

    def __init__(
        self,
        store: Store,
        hooks: Hooks,
        *,
        slow_flush_s: float = DEFAULT_SLOW_FLUSH_S,
        tiering: Tiering | None = None,
    ) -> None:
        self._store = store
        self._hooks = hooks
        self.tiering = tiering  # the horizon's, on a store with a far tier
        # The next pending()'s blind add (or add_many): its batch, ids, and many.
        self._blind: tuple[Batch, tuple[str, ...], bool] | None = None
        self.inline = store.inline
        self.lanes = lanes = store.lanes
        if lanes > 1 and not self.several_lanes:
            raise TypeError("a store of lanes is journaled by LanesJournal (engine/lanes.py)")
        # None: one lane (memory, SQLite), whose path is the single-node one.
        self._lane_of: Callable[[str], int] | None = None if lanes == 1 else store.lane_of
        self._lanes = [Lane(index) for index in range(lanes)]
        self._one = self._lanes[0]  # the lane of a store of one
        self._ready: list[Lane] = []  # lanes with changes and no write in flight
        self._flush_scheduled = False
        # Held by a connection while it handles a turn's requests on an inline
        # store: it flushes at the end of the turn itself (``release``), so a
        # change need not schedule a flush of its own (a loop callback per request).
        self._held = False
        # What the changes recorded since the last ``pending()`` wait on.
        self._wait: Batch | None = None
        self._more: list[Batch] | None = None  # more lanes than one (rare)
        # Called once after the next store answer has settled its writes: on a
        # store of lanes a connection waits for that, not on each lane's batch
        # (a pipeline's replies touch every lane in turn).
        self._listeners: list[Callable[[bool], None]] = []
        self.flushes = 0
        self.last_batch_size = 0
        self.max_batch_size = 0
        # Logs outages and slow writes (its slow_s is the server's --slow-flush).
        # An inline store's write is a dict update, done before submit returns:
        # it is not timed (two clock reads per add, on the memory store's path).
        self.watch = StoreWatch(store.url, slow_s=slow_flush_s, histograms=not store.inline)

    def _lane(self, key: str) -> Lane:
        lane_of = self._lane_of
        return self._one if lane_of is None else self._lanes[lane_of(key)]

    def record(self, task: Task, before: tuple[Any, ...] | None) -> None:
        """Journal ``task``'s new state. ``before`` is its snapshot before this change
        (None for a task that did not exist)."""
        lane_of = self._lane_of
        lane = self._one if lane_of is None else self._lanes[lane_of(task.id)]
        batch = lane.gathering
        key = id(task)
        if key not in lane.touched:
            lane.touched.add(key)
            batch.undo.append((task, before if before is not None else _NEW_SNAPSHOT))
        batch.tasks[task.id] = task
        wait = self._wait
        if wait is not batch:
            if wait is None:  # a request's first change: the commonest
                self._wait = batch
            else:
                self._waits_on(batch)
        if not lane.queued and lane.writing is None:  # _queue(lane), inline: once a change
            lane.queued = True
            self._ready.append(lane)
            if not self._flush_scheduled and not self._held:
                self._flush_scheduled = True
                asyncio.get_running_loop().call_soon(self._start)

    def record_other(self, key: str, record: bytes | None, undo: Callable[[], None]) -> None:
        """Journal a record that is not a task's change (a schedule's, or a task's
        record written again for ``exists``) in the batch of its key's lane, so
        it is one store write with the tasks changed beside it; a change of a
        task in the batch wins over a record of its id. ``undo`` puts the
        in-memory state back if that write fails."""
        lane = self._lane(key)
        batch = lane.gathering
        if batch.records is None or batch.records_undo is None:
            batch.records, batch.records_undo = {}, []
        batch.records[key] = record
        batch.records_undo.append(undo)
        if self._wait is not batch:
            self._waits_on(batch)
        if not lane.queued and lane.writing is None:
            self._queue(lane)

    def mark_far(self, task: Task) -> None:
        """``task``'s change (recorded next) may go to the far tier."""
        self._lane(task.id).gathering.tiered = True

    def blind(self, task: Task) -> None:
        """Journal a blind add (engine/horizon.py): the next ``pending()`` is its
        ``BlindWait``."""
        self.record(task, None)
        batch = self._lane(task.id).gathering
        batch.tiered = True
        self._blind = (batch, (task.id,), False)

    def blind_many(self, tasks: list[Task]) -> None:
        """Journal an ``add_many``'s blind adds, all in one lane (engine/horizon.py):
        the next ``pending()`` is their ``BlindWait``."""
        for task in tasks:
            self.record(task, None)
        batch = self._lane(tasks[0].id).gathering
        batch.tiered = True
        self._blind = (batch, tuple(task.id for task in tasks), True)

    def touches(self, key: str) -> bool:
        """Whether a batch not yet durable holds a change of ``key``."""
        lane = self._lane(key)
        writing = lane.writing
        return key in lane.gathering.tasks or (writing is not None and key in writing.tasks)

    def wait_for(self, key: str) -> None:
        """Make the next ``pending()`` wait for what is not yet durable in
        ``key``'s lane (an answer that reads a change of it, ``exists``)."""
        batch = self._lane(key).newest()
        if batch is not None and self._wait is not batch:
            self._waits_on(batch)

    def _waits_on(self, batch: Batch) -> None:
        if self._wait is None or self._wait.finished:
            self._wait = batch
        elif self._more is None:
            self._more = [batch]
        elif batch not in self._more:
            self._more.append(batch)

    def on_settled(self, callback: Callable[[bool], None]) -> None:
        """Call ``callback(failed)`` once, after the next store answer has settled
        the writes it carried (``failed``: one of them failed and was rolled
        back), every waiter on those writes already told."""
        self._listeners.append(callback)

    def _tell_settled(self, failed: bool) -> None:
        listeners = self._listeners
        self._listeners = []
        for callback in listeners:
            try:
                callback(failed)
            except Exception:  # one broken waiter must not stop the others
                log.exception("settled callback failed")

    def _queue(self, lane: Lane) -> None:
        lane.queued = True
        self._ready.append(lane)
        if not self._flush_scheduled and not self._held:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._start)

    def forget(self, leaving: Callable[[Task], bool]) -> None:
        """Undo nothing of the ``leaving`` tasks: the table has let them go (their
        partition was dropped). A write of theirs still in flight may fail after
        the partition was taken again and reloaded, with new Task objects: the
        old ones must not be put back then. The store has their truth."""
        for lane in self._lanes:
            for batch in (lane.writing, lane.gathering):
                if batch is None or not batch.undo:
                    continue
                kept: Undo = []
                for task, snap in batch.undo:
                    if not leaving(task):
                        kept.append((task, snap))
                    elif batch is lane.gathering:
                        lane.touched.discard(id(task))
                batch.undo = kept

    def pending(self) -> Wait | None:
        """What a reply must wait for: the batches holding the changes recorded
        since the last call (their lanes' newest), or, when none was, the newest
        batch of every lane (an answer that read the state may have read any)."""
        wait = self._wait
        if wait is None:
            return self.newest()
        self._wait = None
        if self._blind is not None:
            batch, task_ids, many = self._blind
            self._blind = None
            if self._more is None and wait is batch:
                return BlindWait(batch, task_ids, many)
            more, self._more = self._more or [], None
            found: list[Any] = [
                BlindWait(batch, task_ids, many) if each is batch else each
                for each in (wait, *more)
            ]
            return Joint(found) if len(found) > 1 else found[0]
        if self._more is not None:
            more, self._more = self._more, None
            found = [batch for batch in (wait, *more) if not batch.finished]
            if len(found) > 1:
                return Joint(found)
            return found[0] if found else None
        if wait.finished:  # recorded outside a request, durable since
            return self.newest()
        return wait

    def newest(self, lanes: Collection[int] | None = None) -> Wait | None:
        """The newest batch of every lane (of ``lanes``) not yet durable (None: all are)."""
        return self._one.newest()

    def is_pending(self, task: Task) -> bool:
        """Whether a batch not yet durable holds a change of ``task``."""
        return self._lane(task.id).is_pending(task)

    def hold(self) -> None:
        """A connection handles a turn's requests on an inline store and flushes
        them itself at the end (``release``), so no change schedules a flush."""
        self._held = self.inline

    def release(self) -> None:
        """The end of a connection's turn on an inline store: flush it now, so
        that the turn's replies leave in one write."""
        self._held = False
        if self._ready:
            self._start()

    def flush(self) -> None:
        """Start writing what has gathered now in the lanes with no write in flight."""
        if self._ready:
            self._start()

    def _start(self) -> None:
        self._flush_scheduled = False
        ready = self._ready
        if len(ready) == 1:  # one lane ready (one store's, or one request at a time)
            lane = ready.pop()
            lane.queued = False
            batch, changes = self._begin(lane)
            started_s = 0.0 if self.inline else self.watch.started()
            done = partial(self._written, lane, batch, changes, started_s)
            try:
                tiers = batch.tiers
                if tiers is not None:
                    self._store.submit_lane(lane.index, changes, done, tiers)
                elif self._lane_of is None:
                    self._store.submit(changes, done)
                else:
                    self._store.submit_lane(lane.index, changes, done)
            except Exception as exc:  # a store bug: fail the batch rather than hang its waiters
                log.exception("store submit raised")
                done(StoreError(f"store write failed: {exc!r}"))
            return
        if ready:  # several lanes: only a store of lanes has them
            self._start_together(ready)

    def _start_together(self, ready: list[Lane]) -> None:
        """Start several lanes' writes at once: ``LanesJournal``'s (never on one lane)."""
        raise NotImplementedError

    def _begin(self, lane: Lane) -> tuple[Batch, dict[str, bytes | None]]:
        """The lane's gathering batch becomes its write; its changes, packed."""
        batch = lane.gathering
        lane.gathering = Batch()
        lane.touched = set()
        lane.writing = batch
        changes = {
            task_id: (None if task.state in (GONE, NEW) else to_record(task))
            for task_id, task in batch.tasks.items()
        }
        if batch.records is not None:  # other records (rare beside tasks): schedules',
            # and an exists' rewrite of a task, which a change of that task
            # recorded after it in this batch must win over
            changes = {**batch.records, **changes}
        batch.size = len(changes)
        tiering = self.tiering
        if tiering is not None and (batch.tiered or tiering.far_ids):
            batch.tiers = tiering.tiers_for(batch.tasks, batch.tiered, batch.records or ())
        return batch, changes

    def _written(
        self,
        lane: Lane,
        batch: Batch,
        changes: dict[str, bytes | None],
        started_s: float,
        error: StoreError | None,
    ) -> None:
        """A write of one lane, started alone, is done (memory's and SQLite's
        every write; a keyspace's one request at a time)."""
        if batch is not lane.writing:  # called twice by a broken store
            log.error("store completed a write twice")
            return
        lane.writing = None
        if error is not None and not isinstance(error, Unconfirmed):
            self._fail(lane, batch, error, started_s)
        else:
            if error is None:
                self.flushes += 1
                self.last_batch_size = batch.size
                self.max_batch_size = max(self.max_batch_size, batch.size)
                if not self.inline:
                    self.watch.written(batch.size, started_s)
                    if self.watch.lost:
                        self.watch.recovered(lane.index, self._store.lane_group(lane.index))
            else:  # in the store, not confirmed: kept, its waiters told (module docstring)
                self._unconfirmed(lane, batch, error, started_s)
            if batch.tiers is not None:
                self._tiers_written(batch, lane)
            try:  # _durable, written out: this is each request's path on memory://
                self._hooks.durable([(batch.tasks, changes, lane.is_pending)])
            except Exception:  # the write is in the store: its replies must still go
                log.exception("durable hook failed")
            batch.finish(error)
        if self._listeners:
            self._tell_settled(error is not None and not isinstance(error, Unconfirmed))
        gathering = lane.gathering
        if (gathering.tasks or gathering.records is not None) and not lane.queued:
            lane.queued = True  # (has_changes, inline: once a write)
            self._ready.append(lane)
            if not self._flush_scheduled:
                self._start()

    def _tiers_written(self, batch: Batch, lane: Lane) -> None:
        assert self.tiering is not None and batch.tiers is not None
        try:
            self.tiering.written(batch.tasks, batch.tiers, lane.is_pending)
        except Exception:  # the write is durable: its replies must still go
            log.exception("far tier hook failed")

    def _durable(self, written: Written) -> None:
        try:
            self._hooks.durable(written)
        except Exception:  # the write is durable: its replies must still go
            log.exception("durable hook failed")

    def _unconfirmed(self, lane: Lane, batch: Batch, error: StoreError, started_s: float) -> None:
        """A write the store took without confirming it: counted as a failed write
        (its requests are answered ``unavailable``), nothing undone."""
        self.watch.failed(
            batch.size, error, started_s, lane.index, self._store.lane_group(lane.index)
        )

    def _fail(self, lane: Lane, batch: Batch, error: StoreError, started_s: float) -> None:
        later = lane.gathering
        lane.gathering = Batch()
        lane.touched = set()
        if self.tiering is not None:
            self.tiering.failed(batch.tiers)
            if later.tiered:
                self.tiering.failed(self.tiering.tiers_for(later.tasks, True))
        # Newest first: the gathering batch built on the failed one.
        self._hooks.rolled_back(list(reversed(later.undo)) + list(reversed(batch.undo)))
        for undo in [*reversed(later.records_undo or ()), *reversed(batch.records_undo or ())]:
            undo()
        self.watch.failed(
            batch.size, error, started_s, lane.index, self._store.lane_group(lane.index)
        )
        batch.finish(error)
        later.finish(error)

    async def drain(self, lanes: Collection[int] | None = None) -> None:
        """Wait until everything recorded so far is durable (or has failed).

        With ``lanes``, only what those lanes hold now, waited for once (a
        handoff's: the outcomes of its attempts in flight): not the other
        lanes, whose writes go on under load, nor a change recorded after the
        call, such as a retry the failure of the awaited write made. Waiting
        for every lane until none had a change waited, under load, for as
        long as the load lasted when writes kept failing (a ``WAIT`` without
        its replicas). And not at all while the writes of the server that
        holds them fail (the watch has a lane of theirs lost): they would fail
        too, and a failing ``WAIT`` holds the journal's connection a second
        per write, so the wait was a queue of them (3.9 s for a handback
        after a failover, the partitions served by no one meanwhile)."""
        if lanes is not None:
            if self._lane_of is None:  # one lane: every key's
                lanes = [0]
            holding = [index for index in lanes if self._lanes[index].newest() is not None]
            group_of, failing = self._store.lane_group, self.watch.is_failing
            if holding and not all(failing(index, group_of(index)) for index in holding):
                batch = self.newest(holding)
                assert batch is not None
                await self._settled(batch)
            return
        while (batch := self.newest()) is not None:
            await self._settled(batch)

    async def _settled(self, batch: Wait) -> None:
        """Until ``batch``'s write has returned, or failed (its flush started now)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake(_error: StoreError | None) -> None:
            if not done.done():
                done.set_result(None)

        batch.add_callback(wake)
        self.flush()
        await done


_NEW_SNAPSHOT: tuple[Any, ...] = (NEW,)
