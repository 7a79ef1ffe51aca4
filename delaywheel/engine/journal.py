"""Group commit: the changes of one event-loop turn go to the store in one write.

How it works
------------
The engine applies a change in memory and calls ``record(task)``. The task
joins the *gathering* batch; the first change of a batch schedules a flush for
the next loop turn (``call_soon``), so every request decoded in this turn, on
every connection, lands in the same batch. A store that completes at once
(``Store.inline``: memory) is flushed by the connection at the end of its
work instead (``flush()``), so its replies leave in the turn that made them.
A flush packs each changed task once (the last state wins) and submits the
batch to the store, which calls back when it is durable: no Task or
coroutine per flush. While that write is in flight the next batch gathers;
it is started from the write's callback. Under load one store round trip
therefore carries everything that arrived during the previous one.

Once a batch is durable, the task table's cold tasks see what it held
before the replies go out (``ColdTasks.pack``): far-future tasks are packed
then, from the records just written (``delaywheel.engine.cold``).

Replies wait on batches: whoever needs "durable" registers a callback on the
batch it depends on (``pending()``), and the callback runs once the write
that holds it has returned, or failed.

A batch keeps, for each task it touched, a snapshot taken at the first touch.
If a write fails, the task table restores (``rollback``) the snapshots of the
failed batch and of every batch gathered after it (newest first, since later batches built on it),
and all of their waiters get the error: nothing unacknowledged stays applied.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from delaywheel.engine.record import to_record
from delaywheel.engine.task import GONE, NEW, Task
from delaywheel.store.base import Store, StoreError
from delaywheel.store.watch import DEFAULT_SLOW_FLUSH_S, StoreWatch

if TYPE_CHECKING:
    from delaywheel.engine.table import TaskTable

log = logging.getLogger("delaywheel.journal")  # pinned: its name is documented

# Called with None once the batch is durable, or with the error that failed it.
Callback = Callable[[StoreError | None], None]
# The tasks of failed batches, each with its snapshot before them (newest first).
Undo = list[tuple[Task, tuple[Any, ...]]]


class Batch:
    __slots__ = ("callbacks", "records", "records_undo", "size", "tasks", "undo")

    def __init__(self) -> None:
        self.tasks: dict[str, Task] = {}  # id -> task; the last change of an id wins
        self.undo: Undo = []  # first snapshot of each task
        # Other records than tasks (schedules, engine/schedules.py): key ->
        # record or None, and how to undo each change, oldest first. Made by
        # the first such change: most batches have none.
        self.records: dict[str, bytes | None] | None = None
        self.records_undo: list[Callable[[], None]] | None = None
        self.callbacks: list[Callback] = []
        self.size = 0

    def has_changes(self) -> bool:
        return bool(self.tasks) or self.records is not None

    def add_callback(self, callback: Callback) -> None:
        self.callbacks.append(callback)

    def finish(self, error: StoreError | None) -> None:
        for callback in self.callbacks:
            try:
                callback(error)
            except Exception:  # one broken waiter must not stop the others
                log.exception("batch callback failed")
        self.callbacks.clear()


class Journal:
    def __init__(
        self, store: Store, table: TaskTable, *, slow_flush_s: float = DEFAULT_SLOW_FLUSH_S
    ) -> None:
        self._store = store
        # The table calls record(); the journal calls its rollback(), and its
        # cold tasks' pack() once a batch is durable.
        self._table = table
        self.inline = store.inline
        self._gathering = Batch()
        self._writing: Batch | None = None
        self._touched: set[int] = set()  # id() of tasks snapshotted in the gathering batch
        self._flush_scheduled = False
        # Set by a connection while it handles a turn's requests on an inline
        # store: it flushes at the end of the turn itself, so a change need
        # not schedule a flush of its own (a loop callback per request).
        self.flushed_by_caller = False
        self.flushes = 0
        self.last_batch_size = 0
        self.max_batch_size = 0
        # Logs outages and slow writes (its slow_s is the server's --slow-flush).
        # An inline store's write is a dict update, done before submit returns:
        # it is not timed (two clock reads per add, on the memory store's path).
        self.watch = StoreWatch(store.url, slow_s=slow_flush_s, histograms=not store.inline)

    def record(self, task: Task, before: tuple[Any, ...] | None) -> None:
        """Journal ``task``'s new state. ``before`` is its snapshot before this change
        (None for a task that did not exist)."""
        batch = self._gathering
        key = id(task)
        if key not in self._touched:
            self._touched.add(key)
            batch.undo.append((task, before if before is not None else _NEW_SNAPSHOT))
        batch.tasks[task.id] = task
        if not self._flush_scheduled and self._writing is None and not self.flushed_by_caller:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._start)

    def record_other(self, key: str, record: bytes | None, undo: Callable[[], None]) -> None:
        """Journal a record that is not a task's change (a schedule's, or a task's
        record written again for ``exists``) in the same batch, so it is one
        store write with the tasks changed beside it; a change of a task in the
        batch wins over a record of its id. ``undo`` puts the in-memory state
        back if that write fails."""
        batch = self._gathering
        if batch.records is None or batch.records_undo is None:
            batch.records, batch.records_undo = {}, []
        batch.records[key] = record
        batch.records_undo.append(undo)
        if not self._flush_scheduled and self._writing is None and not self.flushed_by_caller:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._start)

    def forget(self, leaving: Callable[[Task], bool]) -> None:
        """Undo nothing of the ``leaving`` tasks: the table has let them go (their
        partition was dropped). A write of theirs still in flight may fail after
        the partition was taken again and reloaded, with new Task objects: the
        old ones must not be put back then. The store has their truth."""
        for batch in (self._writing, self._gathering):
            if batch is None or not batch.undo:
                continue
            kept: Undo = []
            for task, snap in batch.undo:
                if not leaving(task):
                    kept.append((task, snap))
                elif batch is self._gathering:
                    self._touched.discard(id(task))
            batch.undo = kept

    def pending(self) -> Batch | None:
        """The batch a reply must wait for: the newest one not yet durable."""
        if self._gathering.has_changes():
            return self._gathering
        return self._writing

    def is_pending(self, task: Task) -> bool:
        """Whether a batch not yet durable holds a change of ``task``."""
        writing = self._writing
        return id(task) in self._touched or (
            writing is not None and writing.tasks.get(task.id) is task
        )

    def flush(self) -> None:
        """Start writing what has gathered now, if no write is in flight."""
        if self._writing is None and self._gathering.has_changes():
            self._start()

    def _start(self) -> None:
        self._flush_scheduled = False
        batch = self._gathering
        if self._writing is not None or not batch.has_changes():
            return
        self._gathering = Batch()
        self._touched = set()
        self._writing = batch
        changes = {
            task_id: (None if task.state in (GONE, NEW) else to_record(task))
            for task_id, task in batch.tasks.items()
        }
        if batch.records is not None:  # other records (rare beside tasks): schedules',
            # and an exists' rewrite of a task, which a change of that task
            # recorded after it in this batch must win over
            changes = {**batch.records, **changes}
        batch.size = len(changes)
        if not self.inline:
            self.watch.started()
        try:
            self._store.submit(changes, partial(self._written, batch, changes))
        except Exception as exc:  # a store bug: fail the batch rather than hang its waiters
            log.exception("store submit raised")
            self._written(batch, changes, StoreError(f"store write failed: {exc!r}"))

    def _written(
        self, batch: Batch, changes: dict[str, bytes | None], error: StoreError | None
    ) -> None:
        if batch is not self._writing:  # called twice by a broken store
            log.error("store completed a write twice")
            return
        if error is not None:
            self._fail(batch, error)
        else:
            self.flushes += 1
            self.last_batch_size = batch.size
            self.max_batch_size = max(self.max_batch_size, batch.size)
            self._writing = None
            if not self.inline:
                self.watch.written(batch.size)
            try:
                self._table.cold.pack(batch.tasks, changes)
            except Exception:  # the write is durable: its replies must still go
                log.exception("durable hook failed")
            batch.finish(None)
        if self._gathering.has_changes() and not self._flush_scheduled:
            self._start()

    def _fail(self, batch: Batch, error: StoreError) -> None:
        later = self._gathering
        self._gathering = Batch()
        self._touched = set()
        self._writing = None
        # Newest first: the gathering batch built on the failed one.
        self._table.rollback(list(reversed(later.undo)) + list(reversed(batch.undo)))
        for undo in [*reversed(later.records_undo or ()), *reversed(batch.records_undo or ())]:
            undo()
        self.watch.failed(batch.size, error)
        batch.finish(error)
        later.finish(error)

    async def drain(self) -> None:
        """Wait until everything recorded so far is durable (or has failed)."""
        while (batch := self.pending()) is not None:
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

            def wake(_error: StoreError | None, done: asyncio.Future[None] = done) -> None:
                if not done.done():
                    done.set_result(None)

            batch.add_callback(wake)
            self.flush()
            await done


_NEW_SNAPSHOT: tuple[Any, ...] = (NEW,)
