"""The horizon: delayed tasks due beyond it live only in the store's far tier.

A task due in a month has nothing to do until then. With ``--horizon``
(one lap of the wheel by default), a delayed task due at or after the
*watermark* (``watermark_s``, at least ``now + horizon``) is written to the
store's far tier (store/base.py, ``Tiers``: a time index and a count per
topic, in the same write as the record) and, once that write is durable,
forgotten: the server keeps nothing of it but a count per topic.

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

Requests. A request that names an id memory does not hold, in a lane whose
far tier holds tasks, raises ``NeedsStore``: its caller (net/connection.py,
net/calls.py) runs ``fetch`` (which brings those records into memory, or
notes the ids absent) and runs the request again; a read that changed
nothing lets them go again (``settle``). ``add`` of such an id needs no
read: its put is *blind* (``Tiers.blind``), made only if the store holds
no task of that id, and the task joins memory once the write says it did;
its reply waits on a ``BlindWait``, which answers ``exists`` for a put the
store refused. ``add_many`` naming such ids puts all its tasks blind, as one
group (``Tiers.groups``) that the store puts whole or not at all (``together``
says when: one lane, no change of those ids pending), so it needs no read
either; else it reads first (``misses``). ``list`` pages over memory first, then over the far tier
(a cursor ``f...``: see ``list_page``).

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
from collections.abc import Awaitable, Callable, Collection, Iterable
from functools import partial
from typing import TYPE_CHECKING, Any

from delaywheel.engine.record import from_fields, read_record
from delaywheel.engine.task import DELAYED, Task
from delaywheel.errors import RequestError
from delaywheel.store.base import FarRecord, Store, Tiers

if TYPE_CHECKING:
    from delaywheel.engine.table import TaskTable

log = logging.getLogger("delaywheel.horizon")

# The shortest horizon: the two windows of packed tasks the engine decodes
# ahead (engine/cold.py) must fit below it.
MIN_HORIZON_S = 120.0
# Records read from the far tier per store read (a pull, a page of list).
PULL_BATCH = 2_000
# Records of a pull's read brought into memory (decoded, scheduled) per loop
# turn: about 20 us each, so a turn of a pull takes a few ms. A whole batch
# in one turn held the loop 30-40 ms, and a stream of near tasks due
# meanwhile was late by as much (docs/performance.md, "Lateness while the
# far tier is pulled").
BRING_SLICE = 200
# Records one page of list looks at in the far tier, as over memory
# (engine.py's LIST_SCAN_BUDGET): a filter that matches little stays bounded.
LIST_SCAN_BUDGET = 20_000
# A request run again after its fetch more often than this is answered
# ``unavailable``: the store keeps changing under it.
MAX_FETCHES = 4


class NeedsStore(Exception):
    """A request names what only the store holds: await ``fetch()``, then run
    the request again (the engine then finds what it needs in memory)."""

    def __init__(self, fetch: Callable[[], Awaitable[None]]) -> None:
        super().__init__("the request needs a store read first")
        self.fetch = fetch


class Horizon:
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
        # Blind adds whose write has not returned: id -> task; the group of
        # those an add_many made (Tiers.groups), and the last group's number.
        self.unconfirmed: dict[str, Task] = {}
        self.groups: dict[str, str] = {}
        self.group_count = 0
        # Ids a fetch found absent, for the request run again; tasks it brought.
        self.checked: set[str] = set()
        self.fetched: list[Task] = []
        # Reads of the far tier in flight (each with the write count when it
        # started), and the ids whose far record a write changed meanwhile,
        # with that write's count: such a read may return the record as it was
        # before, so it is not brought in (a fetch is made again).
        self.writes = 0
        self.reads: dict[int, int] = {}
        self.changed: dict[str, int] = {}
        self.pulling: asyncio.Task[None] | None = None
        self.next_pull_s: float | None = None  # _next_pull
        self.pages: dict[tuple[Any, ...], dict[str, Any]] = {}  # list's far pages, read

    # -- the far decision (the task table's, the journal's) -----------------------

    def far_enough(self, task: Task) -> bool:
        """Whether ``task`` (delayed, at or beyond the watermark) goes to the far tier."""
        return task.at_s >= self.watermark_s and not task.id.startswith("s:")

    def tiers_for(
        self, tasks: dict[str, Task], marked: bool, records: Collection[str] = ()
    ) -> Tiers | None:
        """What a batch of ``tasks`` (and of other ``records``: an ``exists``'
        rewrite of a task, which goes to the near tier) does to the far tier
        (the journal asks at its write's start when a change was marked far or
        blind, or far_ids is not empty); None: nothing."""
        tiers = Tiers()
        far_ids = self.far_ids
        if far_ids:
            for task_id in far_ids.keys() & tasks.keys():
                tiers.was_far[task_id] = far_ids[task_id][0]
            for task_id in far_ids.keys() & set(records):
                tiers.was_far[task_id] = far_ids[task_id][0]
        if marked:
            watermark_s, unconfirmed, groups = self.watermark_s, self.unconfirmed, self.groups
            for task_id, task in tasks.items():
                far = task.state == DELAYED and task.at_s >= watermark_s
                if far and not task_id.startswith("s:"):
                    tiers.far[task_id] = (task.at_s, task.topic)
                if unconfirmed.get(task_id) is task:
                    tiers.blind.add(task_id)
                    if groups and task_id in groups:
                        tiers.groups[task_id] = groups[task_id]
        return tiers if tiers else None

    def written(
        self, tasks: dict[str, Task], tiers: Tiers, pending: Callable[[Task], bool]
    ) -> None:
        """A batch with far-tier changes is in the store (before the table packs
        what it wrote): far_ids follows the store; blind adds join memory or
        are dropped; tasks written far are forgotten when nothing changed them
        since and the watermark is still below them."""
        table = self.table
        by_id = table.index.by_id
        far_ids = self.far_ids
        self.writes += 1
        if self.reads:
            for task_id in (*tiers.was_far, *tiers.far):
                self.changed[task_id] = self.writes
        for task_id in tiers.was_far:
            far_ids.pop(task_id, None)
        conflicts = tiers.refused(tiers.conflicts)  # an add_many's refused whole
        for task_id in tiers.blind:
            task = tasks[task_id]
            if self.unconfirmed.get(task_id) is task:
                del self.unconfirmed[task_id]
                self.groups.pop(task_id, None)
            if task_id in conflicts:
                table.events.added -= 1
                continue
            if not table.ownership.owns_all and not table.ownership.owns(task_id):
                continue
            table.adopt(task)
        for task_id, (_, topic) in tiers.far.items():
            if task_id in conflicts:
                continue
            task = tasks[task_id]
            if by_id.get(task_id) is not task or pending(task):
                if by_id.get(task_id) is task:
                    far_ids[task_id] = (topic, 0)
                continue
            if task.state == DELAYED and task.at_s >= self.watermark_s and task.topic == topic:
                self._forget(task)
            else:
                far_ids[task_id] = (topic, 0)
        if tiers.blind and table.queues.has_waiters():
            table.serve_waiters(table.wheel.now_s)

    def failed(self, tiers: Tiers | None) -> None:
        """A batch's write failed: its blind adds are no one's."""
        if tiers is not None:
            for task_id in tiers.blind:
                self.unconfirmed.pop(task_id, None)
                self.groups.pop(task_id, None)

    def _forget(self, task: Task) -> None:
        """A task the far tier holds as it is: out of memory, still counted."""
        table = self.table
        if task.scheduled:
            table.wheel.remove(task)
        table.waiting.pop(task.id, None)
        table.index.remove(task)
        self.far_ids.pop(task.id, None)
        self._far_count(self.lane_of(task.id), task.topic, 1)

    def _far_count(self, lane: int, topic: str, n: int) -> None:
        counts = self.far_counts[lane]
        left = counts.get(topic, 0) + n
        if left:
            counts[topic] = left
        else:
            counts.pop(topic, None)
        self.lane_totals[lane] += n
        self.far_total += n

    # -- requests ------------------------------------------------------------------

    def miss(self, task_id: str) -> None:
        """A request names ``task_id``, which memory does not hold: raise
        ``NeedsStore`` when the store may hold it far, or its blind add is in
        flight; return when it is not there."""
        if task_id in self.checked:
            return
        if task_id in self.unconfirmed:
            raise NeedsStore(partial(self._settled, task_id))
        if self.lane_totals[self.lane_of(task_id)]:
            raise NeedsStore(partial(self.fetch, [task_id]))

    def may_hold(self, task_id: str) -> bool:
        """Whether the far tier may hold ``task_id`` (a new add's put is then blind)."""
        return (
            bool(self.lane_totals[self.lane_of(task_id)])
            and task_id not in self.checked
            and not task_id.startswith("s:")
        )

    def together(self, task_ids: list[str], server_made: bool) -> bool | None:
        """How ``add_many`` adds tasks with ``task_ids`` given (and others whose
        ids the server makes, if ``server_made``): None, as ever (the far tier
        holds none of them); True, blind and together, one group the store
        puts whole or not at all (no read); False: the store is read first
        (``misses``), when one of the ids has a blind add in flight (its
        answer comes first) or a change pending (memory knew it: the batch
        may hold its removal), or the tasks may span lanes (a group is one
        partition's write)."""
        if not any(map(self.may_hold, task_ids)):
            return None
        touches = self.table.journal.touches
        if any(task_id in self.unconfirmed or touches(task_id) for task_id in task_ids):
            return False
        if self.lanes > 1:
            lane_of = self.lane_of
            if server_made or len({lane_of(task_id) for task_id in task_ids}) > 1:
                return False
        return True

    def new_group(self, tasks: list[Task]) -> None:
        """``tasks`` (an add_many's, not yet journaled) are blind adds of one group."""
        self.group_count += 1
        group = str(self.group_count)
        unconfirmed, groups = self.unconfirmed, self.groups
        for task in tasks:
            unconfirmed[task.id] = task
            groups[task.id] = group

    def misses(self, task_ids: Iterable[str]) -> None:
        """``miss`` for several ids at once (``add_many``): one fetch for all."""
        unknown = [
            task_id
            for task_id in task_ids
            if task_id not in self.checked
            and (task_id in self.unconfirmed or self.lane_totals[self.lane_of(task_id)])
        ]
        if unknown:
            raise NeedsStore(partial(self._fetch_all, unknown))

    async def _fetch_all(self, task_ids: list[str]) -> None:
        for task_id in task_ids:
            if task_id in self.unconfirmed:
                await self._settled(task_id)
        await self.fetch([task_id for task_id in task_ids if task_id not in self.unconfirmed])

    async def _settled(self, task_id: str) -> None:
        """Until the blind add of ``task_id`` in flight has its answer."""
        while task_id in self.unconfirmed:
            await self.table.journal.drain()

    async def fetch(self, task_ids: list[str]) -> None:
        """Bring the far records of ``task_ids`` into memory; note the rest absent
        (not one a write changed while it was read: the request asks again)."""
        token = self._read_started()
        try:
            found = await self.store.far_get(task_ids)
            records = [(task_id, due, record) for task_id, (due, record) in found.items()]
            self.fetched += self._bring(records, self.reads[token])
            since = self.reads[token]
            changed = self.changed
            self.checked.update(
                task_id for task_id in task_ids if changed.get(task_id, -1) <= since
            )
        finally:
            self._read_ended(token)

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

    def settle(self) -> None:
        """The request run again is done: what its fetch brought and it did not
        change goes back to being the far tier's alone."""
        self.checked.clear()
        self.pages.clear()
        fetched, self.fetched = self.fetched, []
        by_id, pending = self.table.index.by_id, self.table.journal.is_pending
        for task in fetched:
            if (
                by_id.get(task.id) is task
                and task.id in self.far_ids
                and task.state == DELAYED
                and task.at_s >= self.watermark_s
                and not pending(task)
            ):
                self._forget(task)

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
                # the watermark now (engine/horizon.py's docstring): skipped.
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

    # -- list ----------------------------------------------------------------------

    def list_page(
        self, cursor: str, topic: str | None, state: str | None, limit: int
    ) -> dict[str, Any]:
        """A page of ``list`` over the far tier. The cursor is ``f{B}`` then
        ``f{B}:{lane}:{due}:{id}``: ``B`` the bring number when the pages over
        memory ended (tasks brought in later are listed here, from the far
        tier, and not the ones memory listed), then where the page ended."""
        key = (cursor, topic, state, limit)
        page = self.pages.pop(key, None)
        if page is not None:
            return page
        if state not in (None, DELAYED) or not self.read_to:
            return {"tasks": [], "next": None}
        brought, lane, after = parse_cursor(cursor)
        raise NeedsStore(partial(self._read_page, key, brought, lane, after, topic, limit))

    async def _read_page(
        self,
        key: tuple[Any, ...],
        brought: int,
        lane: int,
        after: tuple[float, str] | None,
        topic: str | None,
        limit: int,
    ) -> None:
        """Read a far page: lane by lane, up to ``limit`` tasks that match, looking
        at no more than LIST_SCAN_BUDGET records (as a page over memory)."""
        table = self.table
        tasks: list[dict[str, Any]] = []
        scanned = 0
        lanes = [each for each in sorted(self.read_to) if each >= lane]
        for position, each in enumerate(lanes):
            if each != lane:
                after = None
            while True:
                chunk = min(PULL_BATCH, LIST_SCAN_BUDGET - scanned)
                records = await self.store.far_range(each, after, None, chunk)
                looked = 0
                for task_id, due, record in records:
                    looked += 1
                    after = (due, task_id)
                    task = self._listed(task_id, record, brought)
                    if task is not None and (topic is None or task.topic == topic):
                        tasks.append(table.describe(task))
                        if len(tasks) == limit:
                            break
                scanned += looked
                if len(tasks) == limit or scanned >= LIST_SCAN_BUDGET:
                    assert after is not None
                    more = looked < len(records) or len(records) == chunk
                    more = more or position + 1 < len(lanes)
                    cursor = f"f{brought}:{each}:{after[0]!r}:{after[1]}" if more else None
                    self.pages[key] = {"tasks": tasks, "next": cursor}
                    return
                if len(records) < chunk:
                    break  # this lane is done
        self.pages[key] = {"tasks": tasks, "next": None}

    def _listed(self, task_id: str, record: bytes, brought: int) -> Task | None:
        """A far record as a far page shows it: memory's task when it came in
        after the pages over memory ended (None when those listed it)."""
        held = self.far_ids.get(task_id)
        if task_id in self.table.index.by_id and (held is None or held[1] <= brought):
            return None
        task = self.table.index.get(task_id)
        if task is None:
            try:
                task = from_fields(task_id, read_record(task_id, record))
            except ValueError:
                return None
        return task


def parse_cursor(cursor: str) -> tuple[int, int, tuple[float, str] | None]:
    """A far cursor's (bring number, lane, (due, id) read up to)."""
    try:
        brought, _, rest = cursor[1:].partition(":")
        if not rest:
            return int(brought), 0, None
        lane, _, rest = rest.partition(":")
        if not rest:
            return int(brought), int(lane), None
        due, _, task_id = rest.partition(":")
        return int(brought), int(lane), (float(due), task_id)
    except ValueError:
        raise RequestError(
            "bad_request", f"cursor must be a value returned as next by list, got {cursor!r}"
        ) from None


def far_cursor(brought: int) -> str:
    return f"f{brought}"


def _lane_zero(task_id: str) -> int:
    return 0
