"""Delayed tasks kept packed: loaded from the store but not yet decoded.

A restart loads every record, but a task due more than a lap of the wheel
away has nothing to do until then. Decoding it into a ``Task``, indexing it
and linking it into the wheel is most of the cost of a start (of a million
delayed tasks spread over a week, 99 % are that far away), and a ``Task``
takes about twice the memory of its record. So such a task stays as its record: the task
index maps its id to the record bytes, and ``PackedTasks`` remembers which
lap it falls in. A lap before that lap begins, the engine decodes its tasks
and schedules them in the wheel, a few thousand per turn of the event loop
so that a crowded lap does not stall it; a request that names a packed task
decodes it on the spot, and ``list`` decodes a budget of them per call.

Only bookkeeping lives here; the engine does the decoding (``Engine._thaw``).
"""

from __future__ import annotations

import heapq
import math


class PackedTasks:
    """Which packed tasks fall due in which lap, and how many are still packed.

    Lap ``n`` is the time from ``n * lap_s`` to ``(n + 1) * lap_s``. A lap's
    ids are handed out for decoding once lap ``n - 1`` has begun, so each
    task is in the wheel a lap or more before it is due, and the wheel fires
    it exactly as if it had been decoded at start. An id may have been
    decoded (or deleted) since it was held: the engine skips those.
    """

    def __init__(self, lap_s: float) -> None:
        if not lap_s > 0:
            raise ValueError(f"lap_s must be > 0, got {lap_s!r}")
        self.lap_s = lap_s
        self.count = 0  # tasks still packed
        self._ids_by_lap: dict[int, list[str]] = {}
        self._laps: list[int] = []  # heap of the keys of _ids_by_lap

    def hold_from_s(self, now_s: float) -> float:
        """The due time from which a task loaded at ``now_s`` is kept packed:
        the start of the lap after next, so that its lap has not yet come."""
        return (math.floor(now_s / self.lap_s) + 2) * self.lap_s

    def hold(self, task_ids: list[str], due_s: list[float]) -> None:
        """Remember packed tasks (each due at or after ``hold_from_s``) by lap."""
        lap_s, ids_by_lap = self.lap_s, self._ids_by_lap
        for task_id, at_s in zip(task_ids, due_s, strict=True):
            lap = int(at_s // lap_s)
            ids = ids_by_lap.get(lap)
            if ids is None:
                ids = ids_by_lap[lap] = []
                heapq.heappush(self._laps, lap)
            ids.append(task_id)
        self.count += len(task_ids)

    def thawed(self) -> None:
        """One packed task was decoded."""
        self.count -= 1
        if not self.count:  # whatever ids are left were decoded on demand
            self._ids_by_lap.clear()
            self._laps.clear()

    def next_thaw_s(self) -> float | None:
        """When the next lap's tasks are due to be decoded (None: no packed task)."""
        if not self._laps:
            return None
        return (self._laps[0] - 1) * self.lap_s

    def take(self, limit: int, by_s: float | None = None) -> list[str]:
        """Ids to decode, from the earliest laps: up to ``limit``, and with
        ``by_s`` only from laps whose time to decode has come by then.

        A lap that has already begun by ``by_s`` is taken whole, past the
        limit: its tasks may be due. That happens only when the engine was
        not called for a whole lap (a stopped process, a clock jump).
        """
        found: list[str] = []
        laps, lap_s = self._laps, self.lap_s
        while laps:
            lap = laps[0]
            if by_s is None:
                take = limit - len(found)
            elif (lap - 1) * lap_s > by_s:
                break  # this lap's time to decode has not come
            elif lap * lap_s <= by_s:
                take = len(self._ids_by_lap[lap])
            else:
                take = limit - len(found)
            if take <= 0:
                break
            ids = self._ids_by_lap[lap]
            found += ids[-take:]
            del ids[-take:]
            if not ids:
                del self._ids_by_lap[heapq.heappop(laps)]
        return found
