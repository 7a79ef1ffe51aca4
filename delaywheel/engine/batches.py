"""The journal's batches and what a reply waits on.

A ``Batch`` is the changes of one lane gathered for one store write: the
tasks it touched (the last state of each wins), the snapshot of each taken
at its first touch (to roll back a failed write), other records
(schedules'), and the callbacks of those who wait for the write to return.
A ``Lane`` holds at most one batch being written and one gathering.

A reply waits on a ``Wait``: a batch, a ``Joint`` of several lanes'
batches (``add_many`` spans partitions), or a ``BlindWait`` (a blind add's,
which answers ``exists`` when the store refused the put). Each is read the
same way by whoever holds a reply (net/replies.py): ``finished``, then
``error``, or a callback once the write is done.

How the journal makes, writes and settles them: engine/journal.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from delaywheel.engine.task import Task
from delaywheel.store.base import StoreError, Tiers

log = logging.getLogger("delaywheel.journal")  # pinned: its name is documented

# Called with None once the batch is durable, or with the error that failed it.
Callback = Callable[[StoreError | None], None]
# The tasks of failed batches, each with its snapshot before them (newest first).
Undo = list[tuple[Task, tuple[Any, ...]]]


class ExistsInStore(StoreError):
    """A blind add's put the store refused: a task of that id was there."""

    reply_code = "exists"
    reply_data = None


class Batch:
    """One lane's changes gathered for one store write, and who waits for it."""

    __slots__ = (
        "callbacks",
        "error",
        "finished",
        "records",
        "records_undo",
        "size",
        "tasks",
        "tiered",
        "tiers",
        "undo",
    )

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
        # Set before any callback of the write that settled it runs, so that a
        # waiter woken by one batch sees every other batch that store answer
        # settled (a connection then writes their replies at once).
        self.finished = False
        self.error: StoreError | None = None
        self.tiered = False  # a change marked for the far tier, or a blind add
        self.tiers: Tiers | None = None  # made at the write's start

    def has_changes(self) -> bool:
        return bool(self.tasks) or self.records is not None

    def add_callback(self, callback: Callback) -> None:
        self.callbacks.append(callback)

    def finish(self, error: StoreError | None) -> None:
        self.finished, self.error = True, error
        for callback in self.callbacks:
            try:
                callback(error)
            except Exception:  # one broken waiter must not stop the others
                log.exception("batch callback failed")
        self.callbacks.clear()


class Joint:
    """A wait on several lanes' batches (``add_many`` over partitions): finished
    once all are, with the first error among them."""

    __slots__ = ("callbacks", "error", "finished", "left")

    def __init__(self, batches: list[Batch]) -> None:
        self.callbacks: list[Callback] = []
        self.error: StoreError | None = None
        self.finished = False
        self.left = len(batches)
        for batch in batches:
            batch.add_callback(self._one)

    def _one(self, error: StoreError | None) -> None:
        if error is not None and self.error is None:
            self.error = error
        self.left -= 1
        if self.left == 0:
            self.finished = True
            for callback in self.callbacks:
                try:
                    callback(self.error)
                except Exception:
                    log.exception("batch callback failed")
            self.callbacks.clear()

    def add_callback(self, callback: Callback) -> None:
        self.callbacks.append(callback)


class BlindWait:
    """A blind add's wait: its batch's, answering ``exists`` when the store
    refused the put (a task of that id was in the far tier). ``add_many``'s
    (``many``) names the first task refused by its index in the call."""

    __slots__ = ("batch", "many", "task_ids")

    def __init__(self, batch: Batch, task_ids: tuple[str, ...], many: bool = False) -> None:
        self.batch, self.task_ids, self.many = batch, task_ids, many

    @property
    def finished(self) -> bool:
        return self.batch.finished

    @property
    def error(self) -> StoreError | None:
        batch = self.batch
        error = batch.error
        # ``exists`` acknowledges the task: only once the write that found it
        # (and wrote its record again) is confirmed, replicas included.
        if error is None and batch.tiers is not None and batch.tiers.conflicts:
            conflicts = batch.tiers.conflicts
            for index, task_id in enumerate(self.task_ids):
                if task_id in conflicts:
                    where = f"task {index}: " if self.many else ""
                    return ExistsInStore(f"{where}a task with id {task_id!r} already exists")
        return error

    def add_callback(self, callback: Callback) -> None:
        self.batch.add_callback(lambda _error: callback(self.error))


Wait = Batch | Joint | BlindWait


class Lane:
    """One lane's batches: at most one being written, one gathering."""

    __slots__ = ("gathering", "index", "queued", "touched", "writing")

    def __init__(self, index: int) -> None:
        self.index = index
        self.gathering = Batch()
        self.writing: Batch | None = None
        self.touched: set[int] = set()  # id() of tasks snapshotted in the gathering batch
        self.queued = False  # in the journal's list of lanes to start

    def newest(self) -> Batch | None:
        """The batch a wait on this lane's changes so far needs: the newest."""
        return self.gathering if self.gathering.has_changes() else self.writing

    def is_pending(self, task: Task) -> bool:
        writing = self.writing
        return id(task) in self.touched or (
            writing is not None and writing.tasks.get(task.id) is task
        )
