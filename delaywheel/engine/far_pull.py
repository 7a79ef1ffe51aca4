"""The far tier as memory tracks it, and the pull that reads it ahead.

The state ``engine/horizon.py``'s Horizon builds on: the watermark, what
each lane's far tier holds (counts by topic) and has been read up to, the
far tasks memory holds (``far_ids``), the reads in flight, and bringing far
records into memory.

The pull. Before ``now + horizon`` reaches the watermark, the engine moves
the watermark a quarter of a horizon on (first, so nothing new goes far
below it), then reads the far tier up to it, a batch at a time (a store
read per batch: the loop runs between them), and schedules what it read
as a start does, a slice of a batch per loop turn (paced while serving:
``pull``). Each lane (a partition on Redis) keeps the (due, id) it has
read up to. A task is so in the wheel a horizon or more before it is
due: a pull held up for minutes makes nothing late.

Far tasks in memory. A pulled task (or one a request brought in) stays in
the far tier of the store until its first change: ``far_ids`` maps it to
the topic it is held under there, and the journal's write of that change
names it (``Tiers.was_far``) so the store moves it out. A task written far
that cannot be forgotten at once (changed again since, or the watermark
passed it while the write took) stays in memory in ``far_ids`` too.

Counts. The far tier's tasks stay counted in the task table's counts (as
delayed), so ``stats`` and ``/metrics`` are exact; at a start the far
tier's counts are the store's own (kept by the writes), not a scan.

Start. ``load`` reads the near tier (``Store.load``); a record found there
that is due beyond the watermark (a store written by a release before the
far tier, or a longer horizon than before) is moved to the far tier in the
same pass, a batch per write: a start killed midway starts again where it
stopped. Then each lane's far tier is read up to the watermark.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from delaywheel.engine.record import from_fields, read_record
from delaywheel.engine.task import DELAYED, Task
from delaywheel.store.base import FarRecord, Store, Tiers

if TYPE_CHECKING:
    from delaywheel.engine.table import TaskTable

log = logging.getLogger("delaywheel.horizon")

# Records read from the far tier per store read (a pull, a page of list).
PULL_BATCH = 2_000
# Records of a pull's read brought into memory (decoded, scheduled) per loop
# turn: about 20 us each, so a turn of a pull takes a few ms. A whole batch
# in one turn held the loop 30-40 ms, and a stream of near tasks due
# meanwhile was late by as much (docs/performance.md, "Lateness while the
# far tier is pulled").
BRING_SLICE = 200


class FarPull:
    def __init__(self, table: TaskTable, store: Store, horizon_s: float | None) -> None:
        self.table = table
        self.store = store
        self.on = horizon_s is not None and store.tiered
        self.horizon_s = math.inf if horizon_s is None else horizon_s
        # Nothing new goes far below it; everything below it is in memory.
        self.watermark_s = math.inf
        self.lanes = store.lanes
        self.lane_of: Callable[[str], int] = store.lane_of if store.lanes > 1 else _lane_zero
        # Per lane: the (due, id) read up to (None: nothing yet); lanes served.
        self.read_to: dict[int, tuple[float, str] | None] = {}
        # Per lane: the far tier's tasks memory does not hold, by topic, and in all.
        self.far_counts: list[dict[str, int]] = [{} for _ in range(self.lanes)]
        self.lane_totals = [0] * self.lanes
        self.far_total = 0
        # In memory and in the far tier: id -> (topic held under, bring number).
        self.far_ids: dict[str, tuple[str, int]] = {}
        self.brought = 0  # bring numbers: list's far pages leave out earlier ones
        # Blind adds whose write has not returned: id -> task (engine/horizon.py).
        self.unconfirmed: dict[str, Task] = {}
        # Reads of the far tier in flight (each with the write count when it
        # started), and the ids whose far record a write changed meanwhile,
        # with that write's count: such a read may return the record as it was
        # before, so it is not brought in (a fetch is made again).
        self.writes = 0
        self.reads: dict[int, int] = {}
        self.changed: dict[str, int] = {}
        self.pulling: asyncio.Task[None] | None = None
        self.next_pull_s: float | None = None  # _next_pull

    def _far_count(self, lane: int, topic: str, n: int) -> None:
        counts = self.far_counts[lane]
        left = counts.get(topic, 0) + n
        if left:
            counts[topic] = left
        else:
            counts.pop(topic, None)
        self.lane_totals[lane] += n
        self.far_total += n

    def _forget(self, task: Task) -> None:
        """A task the far tier holds as it is: out of memory, still counted."""
        table = self.table
        if task.scheduled:
            table.wheel.remove(task)
        table.waiting.pop(task.id, None)
        table.index.remove(task)
        self.far_ids.pop(task.id, None)
        self._far_count(self.lane_of(task.id), task.topic, 1)

    def _bring(self, records: list[FarRecord], since: int) -> list[Task]:
        """Far records into memory, scheduled as a start schedules them, unless
        memory has the id, or a write changed its far record after write
        ``since`` (the read may have seen it before), or its lane is not read
        here (any more: a partition handed back meanwhile).

        The lane, not the node's ownership: a takeover reads a partition's far
        tier while loading it, before the node serves it, and a record left
        out then was never read again (read_to had passed it): a node killed
        with -9 had its far tasks due within the horizon never fired by the
        node that took its partitions over (test_horizon_process)."""
        changed = self.changed
        table = self.table
        by_id, journal = table.index.by_id, table.journal
        read_to, lane_of = self.read_to, self.lane_of
        brought: list[Task] = []
        for task_id, _, record in records:
            if (
                task_id in by_id
                or task_id in self.unconfirmed
                or changed.get(task_id, -1) > since
                or journal.touches(task_id)
                or lane_of(task_id) not in read_to
            ):
                continue
            try:
                fields = read_record(task_id, record)
            except ValueError as exc:
                log.error("skipping corrupt far record for task %r: %s", task_id, exc)
                continue
            task = from_fields(task_id, fields)
            table.index.add(task)
            table.locate(task)  # counted already, as a far task
            self.brought += 1
            self.far_ids[task_id] = (task.topic, self.brought)
            self._far_count(self.lane_of(task_id), task.topic, -1)
            brought.append(task)
        return brought

    def _read_started(self) -> int:
        token = len(self.reads)
        while token in self.reads:
            token += 1
        self.reads[token] = self.writes
        return token

    def _read_ended(self, token: int) -> None:
        del self.reads[token]
        if not self.reads:
            self.changed.clear()
        elif self.changed:
            oldest = min(self.reads.values())
            self.changed = {key: n for key, n in self.changed.items() if n > oldest}

    # -- time ----------------------------------------------------------------------

    def _next_pull(self) -> None:
        """Note when the next pull is due, ``next_pull_s`` (None: the horizon is
        off, or one runs: the ticker wakes every second meanwhile, net/ticker.py,
        and a pull is a horizon ahead of what it brings). An attribute, not a
        method: the ticker reads it after every change."""
        if not self.on or self.pulling is not None or not self.read_to:
            self.next_pull_s = None
        else:
            self.next_pull_s = self.watermark_s - self.horizon_s

    def advance(self, now_s: float) -> None:
        """Start a pull in the background when its time has come."""
        if (
            self.on
            and self.pulling is None
            and self.read_to
            and now_s + self.horizon_s >= self.watermark_s
        ):
            self.pulling = asyncio.get_running_loop().create_task(self._pull_in_background(now_s))
            self._next_pull()

    async def _pull_in_background(self, now_s: float) -> None:
        try:
            await self.pull(now_s, paced=True)
        except Exception as exc:  # the store is down: the next tick tries again
            log.warning("pulling far tasks failed: %s", exc)
        finally:
            self.pulling = None
            self._next_pull()

    async def pull(self, now_s: float, paced: bool = False) -> int:
        """Move the watermark to ``now + 1.25 horizon`` and read every lane's far
        tier up to it. Returns how many tasks came into memory. ``paced`` (a
        pull while serving): the loop is left free between slices as long as
        each took, so a pull takes at most half of it (it has a quarter of a
        horizon to finish; a start has none and is not paced)."""
        self.watermark_s = max(self.watermark_s, now_s + 1.25 * self.horizon_s)
        pulled = 0
        for lane in sorted(self.read_to):
            pulled += await self._pull_lane(lane, paced)
        return pulled

    async def _pull_lane(self, lane: int, paced: bool = False) -> int:
        pulled, pause_s = 0, 0.0
        while lane in self.read_to:
            after, to_s = self.read_to[lane], self.watermark_s
            token = self._read_started()
            try:
                records = await self.store.far_range(lane, after, to_s, PULL_BATCH)
                # A record changed meanwhile is in memory, or gone, or beyond
                # the watermark now (this module's docstring): skipped.
                # BRING_SLICE records per loop turn, the loop free between.
                for start in range(0, len(records), BRING_SLICE):
                    if start or paced:
                        await asyncio.sleep(pause_s)
                    if lane not in self.read_to:
                        return pulled  # dropped meanwhile (a partition handed over)
                    started_s = time.perf_counter()
                    chunk = records[start : start + BRING_SLICE]
                    pulled += len(self._bring(chunk, self.reads[token]))
                    if paced:
                        pause_s = time.perf_counter() - started_s
                if lane not in self.read_to:
                    break
            finally:
                self._read_ended(token)
            if records:
                last = records[-1]
                self.read_to[lane] = (last[1], last[0])
            if len(records) < PULL_BATCH:
                break
        return pulled

    # -- start, takeover, handover -------------------------------------------------

    def start(self, now_s: float) -> None:
        """Before a load: the watermark from ``now``."""
        if self.on and self.watermark_s == math.inf:
            self.watermark_s = now_s + 1.25 * self.horizon_s

    def far_from_s(self) -> float | None:
        """From when a loaded delayed record belongs to the far tier (None: off)."""
        return self.watermark_s if self.on else None

    async def push(self, records: list[tuple[str, bytes, float, str]]) -> None:
        """Move near records that belong to the far tier there (a load's)."""
        changes: dict[str, bytes | None] = {}
        tiers = Tiers()
        for task_id, record, at_s, topic in records:
            changes[task_id] = record
            tiers.far[task_id] = (at_s, topic)
        await self.store.write(changes, tiers)

    async def load_lanes(self, lanes: Collection[int]) -> int:
        """After the near tier of ``lanes`` is loaded: their far counts (the
        store's), then their far tier up to the watermark. Returns how many
        tasks that brought into memory."""
        if not self.on:
            return 0
        counts = self.table.counts
        for lane in lanes:
            found = await self.store.far_counts(lane)
            for topic, n in found.items():
                counts.add(topic, DELAYED, n)
                self._far_count(lane, topic, n)
            self.read_to[lane] = None
        pulled = 0
        for lane in lanes:
            pulled += await self._pull_lane(lane)
        self._next_pull()
        return pulled

    def drop_lanes(self, lanes: Collection[int], leaving: Callable[[str], bool]) -> None:
        """Partitions handed back: their far counts and far ids go (the store keeps them)."""
        counts = self.table.counts
        for lane in lanes:
            self.read_to.pop(lane, None)
            for topic, n in self.far_counts[lane].items():
                counts.remove_many(topic, DELAYED, n)  # a step per topic, not per task
            self.far_total -= self.lane_totals[lane]
            self.lane_totals[lane] = 0
            self.far_counts[lane] = {}
        for task_id in [task_id for task_id in self.far_ids if leaving(task_id)]:
            del self.far_ids[task_id]
        for task_id in [task_id for task_id in self.unconfirmed if leaving(task_id)]:
            del self.unconfirmed[task_id]
        self._next_pull()


def _lane_zero(task_id: str) -> int:
    return 0
