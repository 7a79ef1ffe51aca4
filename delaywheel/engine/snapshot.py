"""The engine's figures at one moment: what ``stats`` answers and ``/metrics`` shows.

Both read one ``Snapshot`` (``Engine.snapshot()``), so they cannot disagree:
``stats`` turns it into its reply map (``stats()``, the keys docs/protocol.md
lists), the metrics collector (``delaywheel.metrics``) into metric families.
Numbers are copied; the tallies that grow with the topics or count per
bucket (``counts``, ``events``, the histograms) are the live objects, read
at once on the event loop's thread: a scrape must not copy a million topics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from delaywheel import __version__
from delaywheel.engine.index import TaskCounts
from delaywheel.engine.table import TaskTable
from delaywheel.tallies import EventCounts, Histogram
from delaywheel.wheel import WheelStats


@dataclass(frozen=True, slots=True)
class Snapshot:
    version: str
    store: str  # the store's URL, password removed
    started_s: float
    tasks: int
    counts: TaskCounts  # by state and by topic
    slots: int
    tick_s: float
    wheel: WheelStats
    packed: int  # delayed tasks held packed, counted in tasks and counts
    far: int  # delayed tasks only in the store's far tier, counted in tasks and counts
    waiting_reserves: int
    blocked_waits: int  # ``wait`` calls blocked on a task
    flushes: int
    last_flush_size: int
    max_flush_size: int
    store_up: bool
    store_errors: int
    flush_seconds: Histogram
    flush_changes: Histogram
    events: EventCounts
    deaths: int  # the engine's and the delivery attempts' together
    lateness: Histogram

    @classmethod
    def of(
        cls,
        table: TaskTable,
        *,
        store: str,
        started_s: float,
        delivery_deaths: int,
        lateness: Histogram,
    ) -> Snapshot:
        """The table's figures now, with the engine's own: the store's URL,
        when it started, deaths after a last delivery attempt, lateness."""
        journal = table.journal
        watch = journal.watch
        return cls(
            version=__version__,
            store=store,
            started_s=started_s,
            tasks=len(table.index) + table.horizon.far_total,
            counts=table.counts,
            slots=table.wheel.slots,
            tick_s=table.wheel.tick_s,
            wheel=table.wheel.stats(),
            packed=table.packed.count,
            far=table.horizon.far_total,
            waiting_reserves=table.queues.waiter_count(),
            blocked_waits=sum(len(line) for line in table.watches.values()),
            flushes=journal.flushes,
            last_flush_size=journal.last_batch_size,
            max_flush_size=journal.max_batch_size,
            store_up=not watch.lost,
            store_errors=watch.failures,
            flush_seconds=watch.durations,
            flush_changes=watch.sizes,
            events=table.events,
            deaths=table.events.deaths + delivery_deaths,
            lateness=lateness,
        )

    def stats(self, now_s: float) -> dict[str, Any]:
        """The engine's part of the ``stats`` reply (docs/protocol.md)."""
        wheel = self.wheel
        return {
            "version": self.version,
            "uptime": now_s - self.started_s,
            "tasks": self.tasks,
            "states": self.counts.by_state(),
            "topics": self.counts.by_topic(),
            "slots": self.slots,
            "tick": self.tick_s,
            "cursor": wheel.cursor_slot,
            "wheel": {
                "pending": wheel.pending,
                "in_ring": wheel.in_ring,
                "above_ring": wheel.above_ring,
                "buckets": wheel.buckets,
                "packed": self.packed,
                "far": self.far,
            },
            "waiting_reserves": self.waiting_reserves,
            "blocked_waits": self.blocked_waits,
            "store": self.store,
            "flushes": self.flushes,
            "last_flush_size": self.last_flush_size,
            "max_flush_size": self.max_flush_size,
        }
