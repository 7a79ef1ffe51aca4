"""Firing: what the passing of time does to tasks.

The tick driver (``delaywheel.net.ticker``) sleeps until ``next_fire_s()``
and then calls ``advance(now_s)``. An advance decodes the packed tasks whose
window is about to begin (``delaywheel.engine.cold``), takes what the wheel
says is due, and fires each task through the task table (``fire``: due
tasks made ready, expired reservations ready again or dead), or, for a
targeted task, hands it to its delivery attempts (``Attempts.due``). Both
are bounded per call, so a burst of due tasks is worked through over many
turns of the event loop, with requests served between them.

It also keeps the lateness tallies: how late each timer fired.
"""

from __future__ import annotations

from bisect import bisect_left
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from delaywheel.engine.task import DELAYED, Task
from delaywheel.tallies import LATENESS_BOUNDS_S, Histogram

if TYPE_CHECKING:
    from delaywheel.engine.attempts import Attempts
    from delaywheel.engine.table import TaskTable

# How many packed tasks one advance decodes (a few ms of work): a window
# holding half a million is decoded over many turns of the loop, not in one stall.
THAW_BATCH = 2_000
# How many due tasks one advance makes ready: a few milliseconds of work, so
# 200,000 due in the same second are made ready over 200 turns of the loop,
# with requests served between them, at about the rate of one long stall.
# Larger batches gain nothing (docs/performance.md, "Measurements behind the code").
FIRE_BATCH = 1_000

_due_of = attrgetter("due_s")  # a timer's due time in the wheel


class Firing:
    def __init__(self, table: TaskTable, attempts: Attempts) -> None:
        self._table = table
        self._attempts = attempts
        # For metrics (delaywheel.tallies): how late the wheel's timers fired.
        self.lateness = Histogram(LATENESS_BOUNDS_S)

    def advance(self, now_s: float) -> int:
        """Fire what the wheel says is due, at most ``FIRE_BATCH`` tasks; returns
        how many it moved. With more due, ``next_fire_s()`` is at or before
        ``now_s``, so the driver calls again on the next turn of the loop."""
        table = self._table
        thaw_s = table.packed.next_thaw_s()
        if thaw_s is not None and thaw_s <= now_s:
            table.cold.thaw(THAW_BATCH, by_s=now_s)
        held_s = self._attempts.held_until_s()
        if held_s is not None and held_s <= now_s:
            self._attempts.release_held(now_s)
        fired = table.wheel.advance(now_s, FIRE_BATCH)
        if fired:
            self._count_fired(fired, now_s)
        for task in fired:
            assert isinstance(task, Task)
            if task.target is not None and task.state == DELAYED:
                self._attempts.due(task)  # it stays delayed until its lane has room
            else:
                table.fire(task)
        if fired:
            table.serve_waiters(now_s)
        return len(fired)

    def _count_fired(self, fired: list[Any], now_s: float) -> None:
        """Count a batch of fired timers and how late each fired (after its due
        time, or a reservation's deadline), a few bisects per batch rather than
        one per timer: ``fired`` is in due order, so those at most a bound late
        are a run at its end."""
        n = len(fired)
        self._table.events.fired += n
        lateness = self.lateness
        bounds, counts = lateness.bounds, lateness.counts
        lateness.total += n * now_s - sum([timer.due_s for timer in fired])
        first = bisect_left(bounds, now_s - fired[-1].due_s)  # the least late one's bucket
        last = bisect_left(bounds, now_s - fired[0].due_s)
        at_most = 0  # how many are at most the previous bound late
        for i in range(first, last):
            below = n - bisect_left(fired, now_s - bounds[i], key=_due_of)
            counts[i] += below - at_most
            at_most = below
        counts[last] += n - at_most

    def next_fire_s(self) -> float | None:
        """When ``advance`` next has work: a tick with timers, packed tasks to
        decode, or a taken-over attempt to send again (``Attempts.adopt``)."""
        table = self._table
        fire_s, thaw_s = table.wheel.next_fire_s(), table.packed.next_thaw_s()
        if fire_s is None or thaw_s is None:
            fire_s = thaw_s if fire_s is None else fire_s
        elif thaw_s < fire_s:
            fire_s = thaw_s
        # Held attempts exist only after a takeover: the rearm on every request
        # (net/ticker.py) pays one attribute read for them, not a list.
        if self._attempts.held:
            held_s = self._attempts.held[0][0]
            if fire_s is None or held_s < fire_s:
                return held_s
        return fire_s
