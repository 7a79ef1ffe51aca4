"""The horizon: delayed tasks due beyond it live only in the store's far tier.

A task due in a month has nothing to do until then. With ``--horizon``
(one lap of the wheel by default), a delayed task due at or after the
*watermark* (``watermark_s``, at least ``now + horizon``) is written to the
store's far tier (store/base.py, ``Tiers``: a time index and a count per
topic, in the same write as the record) and, once that write is durable,
forgotten: the server keeps nothing of it but a count per topic.

What memory keeps of the far tier (far tasks in memory, counts), the pull
(reading it ahead of the watermark) and a start's reads are
engine/far_pull.py's; Horizon builds on FarPull's state.

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
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Iterable
from functools import partial
from typing import TYPE_CHECKING, Any

from delaywheel.engine.far_pull import PULL_BATCH, FarPull
from delaywheel.engine.record import from_fields, read_record
from delaywheel.engine.task import DELAYED, Task
from delaywheel.errors import RequestError
from delaywheel.store.base import Store, Tiers

if TYPE_CHECKING:
    from delaywheel.engine.table import TaskTable

# The shortest horizon: the two windows of packed tasks the engine decodes
# ahead (engine/cold.py) must fit below it.
MIN_HORIZON_S = 120.0
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


class Horizon(FarPull):
    def __init__(self, table: TaskTable, store: Store, horizon_s: float | None) -> None:
        super().__init__(table, store, horizon_s)
        # The group of the blind adds an add_many made (Tiers.groups), and the
        # last group's number.
        self.groups: dict[str, str] = {}
        self.group_count = 0
        # Ids a fetch found absent, for the request run again; tasks it brought.
        self.checked: set[str] = set()
        self.fetched: list[Task] = []
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
