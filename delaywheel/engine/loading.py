"""Start-up: rebuilding the engine's tasks from the store's records.

This is the path a restart takes for millions of tasks, so it works a batch
at a time: each record is read and checked; a delayed task due after the
next time window stays packed (``delaywheel.engine.packed``), and the others are
built and then placed, indexed and counted in bulk.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

from delaywheel.engine.index import TaskCounts, TaskIndex
from delaywheel.engine.packed import PackedTasks
from delaywheel.engine.record import (
    AT_FIELD,
    STATE_CODE,
    STATE_FIELD,
    TOPIC_FIELD,
    from_fields,
    read_record,
)
from delaywheel.engine.task import DELAYED, IN_WHEEL, Task
from delaywheel.wheel import TimingWheel

log = logging.getLogger("delaywheel.engine.loading")  # pinned: its name is documented

# Log loading progress this often, so a large store's start-up visibly moves.
LOAD_PROGRESS_EVERY = 500_000


async def load_tasks(
    batches: AsyncIterator[list[tuple[str, bytes]]],
    *,
    wheel: TimingWheel,
    index: TaskIndex,
    counts: TaskCounts,
    packed: PackedTasks,
    locate: Callable[[Task], bool],
) -> int:
    """Load every record of ``batches`` (``(id, record)`` lists, each id once);
    corrupt ones are logged with their id and skipped. Returns how many
    tasks were loaded. ``locate`` puts a ready or dead task in its queue."""
    loaded = 0
    next_report = LOAD_PROGRESS_EVERY
    now_s = wheel.now_s
    hold_from_s = packed.hold_from(now_s)
    delayed = STATE_CODE[DELAYED]
    read, build = read_record, from_fields
    async for batch in batches:
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
                held.append(item)
                held_at.append(fields[AT_FIELD])
                held_topics.append(fields[TOPIC_FIELD])
                continue
            task = build(task_id, fields)
            fresh.append(task)
            if task.state in IN_WHEEL:  # as the engine's _locate() would, in bulk
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
        loaded += len(fresh) + len(held)
        if loaded >= next_report:
            log.info("loaded %d tasks so far", loaded, extra={"tasks": loaded})
            next_report += LOAD_PROGRESS_EVERY
    return loaded
