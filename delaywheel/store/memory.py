"""memory:// -- a dict in the server's process. Nothing is persisted.

For tests and throwaway runs. "Durable" here means only that the change is in
the dict: every record is gone when the store object is. A write cannot fail
half way, so it is all or nothing, and it completes before ``submit()``
returns: a reply waiting on it can leave in the same loop turn.
``warnings()`` says so, once, at start-up.

It keeps a far tier as the other stores do (``Tiers``, base.py), in dicts:
the far records, their due times and the count per topic; reads of it sort
what it holds (it is for tests, not for millions of tasks).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import ClassVar

from delaywheel.store.base import (
    DEFAULT_BATCH_SIZE,
    Changes,
    Done,
    FarRecord,
    Store,
    Tiers,
    check_batch_size,
)


class MemoryStore(Store):
    persistent: ClassVar[bool] = False
    inline: ClassVar[bool] = True
    tiered: ClassVar[bool] = True

    def __init__(self, url: str = "memory://") -> None:
        super().__init__(url)
        self._records: dict[str, bytes] = {}
        self._far: dict[str, tuple[float, bytes]] = {}  # id -> (due, record)
        self._far_counts: dict[str, int] = {}  # topic -> far records

    async def open(self) -> None:
        self._start_open()
        self._state = "open"

    async def load(
        self, batch_size: int = DEFAULT_BATCH_SIZE
    ) -> AsyncIterator[list[tuple[str, bytes]]]:
        check_batch_size(batch_size)
        self._check_open("load")
        items = list(self._records.items())  # a snapshot, as the other stores give
        for start in range(0, len(items), batch_size):
            yield items[start : start + batch_size]

    def submit(self, changes: Changes, done: Done, tiers: Tiers | None = None) -> None:
        error = self._not_open("write")
        if error is not None:
            done(error)
            return
        records = self._records
        if tiers:
            self._tiered(changes, tiers)
        else:
            for task_id, record in changes.items():
                if record is None:
                    records.pop(task_id, None)
                else:
                    records[task_id] = record
        done(None)

    def _tiered(self, changes: Changes, tiers: Tiers) -> None:
        records, far, counts = self._records, self._far, self._far_counts
        conflicts = tiers.conflicts
        for task_id in tiers.blind:
            if task_id in records or task_id in far:
                conflicts.add(task_id)
        refused = tiers.refused(conflicts)
        for task_id, topic in tiers.was_far.items():
            if task_id not in refused and far.pop(task_id, None) is not None:
                counts[topic] -= 1
        for task_id, record in changes.items():
            if task_id in refused:
                continue
            if record is None:
                records.pop(task_id, None)
                continue
            to_far = tiers.far.get(task_id)
            if to_far is None:
                records[task_id] = record
                continue
            records.pop(task_id, None)
            far[task_id] = (to_far[0], record)
            counts[to_far[1]] = counts.get(to_far[1], 0) + 1

    async def far_range(
        self, lane: int, after: tuple[float, str] | None, before_s: float | None, limit: int
    ) -> list[FarRecord]:
        self._check_open("far_range")
        found = sorted(
            (due, task_id)
            for task_id, (due, _) in self._far.items()
            if (after is None or (due, task_id) > after) and (before_s is None or due < before_s)
        )
        return [(task_id, due, self._far[task_id][1]) for due, task_id in found[:limit]]

    async def far_get(self, task_ids: Sequence[str]) -> dict[str, tuple[float, bytes]]:
        self._check_open("far_get")
        return {task_id: self._far[task_id] for task_id in task_ids if task_id in self._far}

    async def far_counts(self, lane: int) -> dict[str, int]:
        self._check_open("far_counts")
        return {topic: n for topic, n in self._far_counts.items() if n > 0}

    async def close(self) -> None:
        self._state = "closed"
        self._records, self._far, self._far_counts = {}, {}, {}

    def warnings(self) -> list[str]:
        return ["memory:// persists nothing: every task is lost when the server stops"]
