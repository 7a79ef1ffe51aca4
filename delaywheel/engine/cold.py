"""Cold tasks: delayed tasks kept packed (their store records, not yet
decoded), and loading them all from the store at start-up.

A task due an hour or a week from now has nothing to do until then. A
``Task`` takes two to three times the memory of its record, and at a restart
decoding a task, indexing it and linking it into the wheel is most of the
cost of loading it. So a delayed task due after the next time window (a
minute with the default wheel) stays as its record: the task index maps its
id to the record bytes, and ``PackedTasks`` remembers which window it falls
in. Tasks are packed when loaded at start-up, and when added or changed at
run time once their record is in the store (``ColdTasks.pack``, from the
record the journal just wrote). A window before a window begins, the engine
decodes its tasks and schedules them in the wheel, a few thousand per turn
of the event loop so that a crowded window does not stall it; a request that
names a packed task decodes it on the spot, and ``list`` decodes a budget of
them per call.

``PackedTasks`` is the bookkeeping of which windows hold which ids (the
task table owns one, with the other containers); ``ColdTasks`` packs and
decodes tasks in the task table (``delaywheel.engine.table``).

Start-up (``ColdTasks.load``) is the path a restart takes for millions of tasks,
so it works a batch at a time: each record is read and checked; a delayed
task due after the next time window stays packed, and the others are built
and then placed, indexed and counted in bulk.
"""

from __future__ import annotations

import heapq
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING

from delaywheel.engine.record import (
    AT_FIELD,
    STATE_CODE,
    STATE_FIELD,
    TOPIC_FIELD,
    from_fields,
    from_record,
    read_record,
)
from delaywheel.engine.task import DELAYED, IN_WHEEL, Task

# Batches written (the journal's ``durable`` hook): each one's tasks by id, the
# records written, and whether a task has a change still not durable.
Written = list[tuple[dict[str, Task], Mapping[str, bytes | None], Callable[[Task], bool]]]

if TYPE_CHECKING:
    from delaywheel.engine.table import TaskTable

log = logging.getLogger("delaywheel.loading")  # pinned: docs/operations.md names it

# The window for the default wheel (3600 slots of 1 s). A shorter one packs
# more at start and decodes less at a time later; a lap of a small test wheel
# may be shorter still, and the window is never longer than the lap.
WINDOW_S = 60.0
# Tasks more than an hour or two away (with the default window) are kept by
# the hour, COARSE windows to a list: a week's tasks then sit in 168 lists
# rather than 10,080, which loads faster (docs/performance.md). Such
# an hour is decoded a window before it begins, as one window would be.
COARSE = 60
# Log loading progress this often, so a large store's start-up visibly moves.
LOAD_PROGRESS_EVERY = 500_000


class PackedTasks:
    """Which packed tasks fall due in which window, and how many are still packed.

    Window ``n`` is the time from ``n * window_s`` to ``(n + 1) * window_s``.
    Its ids are handed out for decoding once window ``n - 1`` has begun, so
    each task is in the wheel a window or more before it is due, and the wheel
    fires it exactly as if it had been decoded at start. An id may have been
    decoded (or deleted) since it was held: the engine skips those.
    """

    def __init__(self, window_s: float) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be > 0, got {window_s!r}")
        self.window_s = window_s
        self.count = 0  # tasks still packed
        self._ids_by_window: dict[int, list[str]] = {}
        self._windows: list[int] = []  # heap of the keys of _ids_by_window

    def hold_from(self, now_s: float) -> float:
        """From when a task may be packed at ``now_s``: the start of the window
        after next, so that its time to decode is still to come."""
        return (math.floor(now_s / self.window_s) + 2) * self.window_s

    def hold(self, task_ids: list[str], due_s: list[float], now_s: float) -> None:
        """Remember packed tasks (each due at or after ``hold_from(now_s)``) by window.

        A task is kept by the hour only from the hour after next on (counted
        from ``now_s``), so an hour's time to decode is still to come too.
        """
        window_s, ids_by_window = self.window_s, self._ids_by_window
        coarse_from = (math.floor(now_s / window_s) // COARSE + 2) * COARSE  # a window index
        for task_id, at_s in zip(task_ids, due_s, strict=True):
            window = int(at_s // window_s)
            if window >= coarse_from:
                window -= window % COARSE  # by the hour: the hour's first window
            ids = ids_by_window.get(window)
            if ids is None:
                ids = ids_by_window[window] = []
                heapq.heappush(self._windows, window)
            ids.append(task_id)
        self.count += len(task_ids)

    def thawed(self) -> None:
        """One packed task was decoded."""
        self.count -= 1
        if not self.count:  # whatever ids are left were decoded on demand
            self._ids_by_window.clear()
            self._windows.clear()

    def next_thaw_s(self) -> float | None:
        """When the next window's tasks are due to be decoded (None: none packed)."""
        if not self._windows:
            return None
        return (self._windows[0] - 1) * self.window_s

    def take(self, limit: int, by_s: float | None = None) -> list[str]:
        """Ids to decode, from the earliest windows: up to ``limit``, and with
        ``by_s`` only from windows whose time to decode has come by then.

        A window that has already begun by ``by_s`` is taken whole, past the
        limit: its tasks may be due. That happens only when the engine was
        not called for a whole window (a stopped process, a clock jump).
        """
        found: list[str] = []
        windows, window_s = self._windows, self.window_s
        while windows:
            window = windows[0]
            if by_s is None:
                take = limit - len(found)
            elif (window - 1) * window_s > by_s:
                break  # this window's time to decode has not come
            elif window * window_s <= by_s:
                take = len(self._ids_by_window[window])
            else:
                take = limit - len(found)
            if take <= 0:
                break
            ids = self._ids_by_window[window]
            found += ids[-take:]
            del ids[-take:]
            if not ids:
                del self._ids_by_window[heapq.heappop(windows)]
        return found


class ColdTasks:
    """Packs the task table's far delayed tasks once durable, and decodes them
    when their window comes or a request names them."""

    def __init__(self, table: TaskTable) -> None:
        self._table = table

    def pack(self, written: Written) -> None:
        """Batches are in the store: pack their far delayed tasks (the journal's
        ``durable`` hook: each batch's tasks by id, the records written, and
        whether a task has a change not yet durable; the batches of several
        lanes written together come in one call, packed in one go).

        Packed, a task is the record just written, which is the task as it is
        now only if nothing has changed it since: it must be the indexed task
        of its id, still delayed, and in no batch still gathering or being
        written (that batch comes here in turn). Its counts stay as they are.
        ``TaskTable.move`` left such a task out of the wheel; one that can no
        longer be packed (its window came closer while the write took) is
        scheduled now.
        """
        table = self._table
        wheel, packed = table.wheel, table.packed
        now_s = wheel.now_s
        hold_from_s = packed.hold_from(now_s)
        by_id = table.index.by_id
        held: list[str] = []
        held_at: list[float] = []
        records: list[bytes | None] = []
        for tasks, changes, pending in written:
            for task_id, task in tasks.items():
                if task.state != DELAYED or by_id.get(task_id) is not task or pending(task):
                    continue
                at_s = task.at_s
                if at_s < hold_from_s:
                    # Left out of the wheel by move(), to be packed: too close now.
                    # (One the wheel fired into its lane is unscheduled too: not that.)
                    if not task.scheduled and task_id not in table.waiting:
                        wheel.insert(task, at_s)
                    continue
                if task._home is not None:  # task.scheduled, without a call per task
                    wheel.remove(task)
                held.append(task_id)
                held_at.append(at_s)
                records.append(changes[task_id])
        if held:
            assert None not in records  # a delayed task's change is a put
            table.index.freeze(held, records)  # type: ignore[arg-type]
            packed.hold(held, held_at, now_s)

    def decode(self, task_id: str, record: bytes) -> Task:
        """Decode a packed task and schedule it (``TaskIndex.get`` calls this)."""
        # Read and checked again (it passed at load, so this cannot fail): the
        # checks are a fraction of the unpacking, which has to happen anyway.
        task = from_record(task_id, record)
        table = self._table
        table.index.add(task)
        table.locate(task)  # already counted, at load
        table.packed.thawed()
        return task

    def thaw(self, limit: int, by_s: float | None = None) -> None:
        """Decode packed tasks from the earliest windows (``PackedTasks.take``)."""
        get = self._table.index.get
        for task_id in self._table.packed.take(limit, by_s):
            get(task_id)  # decodes the task if it is still packed

    async def load(
        self,
        batches: AsyncIterator[list[tuple[str, bytes]]],
        far_from_s: float | None = None,
        push: Callable[[list[tuple[str, bytes, float, str]]], Awaitable[None]] | None = None,
    ) -> int:
        """Load every record of ``batches`` (``(id, record)`` lists, each id once)
        into the table; corrupt ones are logged with their id and skipped.
        Returns how many tasks were loaded. With ``far_from_s``, a delayed
        task due from then on is not loaded but handed to ``push``, a batch
        at a time, to be moved to the far tier (engine/far_pull.py, ``push``)."""
        loaded = 0
        next_report = LOAD_PROGRESS_EVERY
        now_s = self._table.wheel.now_s
        async for batch in batches:
            far: list[tuple[str, bytes, float, str]] = []
            loaded += self._load_batch(batch, now_s, far_from_s, far)
            if far and push is not None:
                await push(far)
            if loaded >= next_report:
                log.info("loaded %d tasks so far", loaded, extra={"tasks": loaded})
                next_report += LOAD_PROGRESS_EVERY
        return loaded

    def _load_batch(
        self,
        batch: list[tuple[str, bytes]],
        now_s: float,
        far_from_s: float | None = None,
        far: list[tuple[str, bytes, float, str]] | None = None,
    ) -> int:
        """One batch of ``load``: read, then placed, indexed and counted in bulk;
        the far tier's (due from ``far_from_s`` on) into ``far``, not loaded."""
        table = self._table
        wheel, index, counts, packed = table.wheel, table.index, table.counts, table.packed
        hold_from_s = packed.hold_from(now_s)
        delayed = STATE_CODE[DELAYED]
        read, build, locate = read_record, from_fields, table.locate
        fresh: list[Task] = []
        timers: list[tuple[Task, float]] = []
        held: list[tuple[str, bytes]] = []  # the batch's own (id, record) pairs
        held_at: list[float] = []
        held_topics: list[str] = []
        for item in batch:
            task_id = item[0]
            try:
                fields = read(task_id, item[1])
            except ValueError as exc:
                log.error("skipping corrupt record for task %r: %s", task_id, exc)
                continue
            if fields[STATE_FIELD] == delayed and fields[AT_FIELD] >= hold_from_s:
                if (
                    far is not None
                    and far_from_s is not None
                    and fields[AT_FIELD] >= far_from_s
                    and not task_id.startswith("s:")
                ):
                    far.append((task_id, item[1], fields[AT_FIELD], fields[TOPIC_FIELD]))
                    continue
                held.append(item)
                held_at.append(fields[AT_FIELD])
                held_topics.append(fields[TOPIC_FIELD])
                continue
            task = build(task_id, fields)
            fresh.append(task)
            if task.state in IN_WHEEL:  # as the table's locate() would, in bulk
                timers.append((task, task.timer_s))
            else:
                locate(task)
        wheel.insert_many(timers)
        index.add_loaded(fresh)
        index.hold(held)
        packed.hold([task_id for task_id, _ in held], held_at, now_s)
        # Counted a batch at a time: a third of the cost of counting task by task.
        counts.add_all(fresh)
        counts.add_topics(held_topics, DELAYED)
        return len(fresh) + len(held)
