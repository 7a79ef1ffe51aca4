"""Counts kept where an event already happens, read only when metrics are scraped.

The server's metrics (``delaywheel.metrics``, docs/metrics.md) are read at
scrape time from what the engine, the journal, the dispatcher and the
connections keep. Where nothing counted an event yet, it is counted here, in
the branch that already handles it: a plain int attribute (``EventCounts``),
or, for a distribution (lateness at fire time, store flush latency and size,
delivery latency), a ``Histogram``: a count per bucket and a sum, which is
all a Prometheus histogram holds. No lock, no clock read of its own, and
nothing here imports prometheus-client, so a server without
``--metrics-port`` pays only these additions.

What they cost was counted with callgrind (docs/metrics.md, "Cost"): an
attribute increment is about 350 machine instructions, a dict increment
twice that (an add is about 100,000), so the hot paths count by attribute.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

# Seconds a task fired after its due time. The wheel never fires early and
# fires on the first tick at or after the due time, so with the default 1 s
# tick most lateness is the rounding up to the tick, 0 to 1 s.
LATENESS_BOUNDS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
# Seconds a schedule's occurrence was put after its firing time (nominal plus
# jitter): a tick's wait when the server was up; up to a catch-up window
# (24 h by default) for one fired after downtime.
SCHEDULE_LATENESS_BOUNDS_S = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0, 600.0, 3600.0, 86400.0,
)  # fmt: skip
# Seconds from a store write's submit to its completion.
FLUSH_BOUNDS_S = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
)  # fmt: skip
# Changes per store write (group commit): 1 for a lone request, hundreds under load.
FLUSH_SIZE_BOUNDS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
# Seconds a delivery attempt took, from its sender's start to its outcome.
DELIVERY_BOUNDS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip


class EventCounts:
    """How many times each task event happened since the start (the engine's).

    Counted as the engine applies a change, so a change later undone by a
    failed store write (answered ``unavailable``) stays counted.
    """

    __slots__ = (
        "acked",
        "added",
        "deaths",
        "deleted",
        "expired",
        "fired",
        "kicked",
        "lapsed",
        "released",
        "reserved",
        "touched",
        "updated",
    )

    def __init__(self) -> None:
        self.added = 0
        self.updated = 0
        self.deleted = 0
        self.reserved = 0
        self.acked = 0
        self.released = 0
        self.touched = 0
        self.kicked = 0
        self.fired = 0  # timers the wheel fired: tasks falling due, and expired reservations
        self.expired = 0  # reservations whose TTR ran out
        self.deaths = 0  # tasks made dead by the engine (the attempts count their own)
        self.lapsed = 0  # done (and dead, --dead-retention) tasks dropped once kept long enough


class Histogram:
    """Counts of observed values per bucket, and their sum.

    ``counts[i]`` counts values in ``(bounds[i-1], bounds[i]]`` (Prometheus'
    ``le``: at most the bound); the last count is the values above every
    bound.
    """

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        if list(self.bounds) != sorted(set(self.bounds)):
            raise ValueError(f"bounds must increase, got {bounds}")
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, values at most it)`` per bucket, the last bound ``inf``."""
        running = 0
        buckets: list[tuple[float, int]] = []
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            buckets.append((bound, running))
        return buckets


class ClusterCounts:
    """A node's events in a shared keyspace (ha/coordinator.py), for metrics."""

    __slots__ = ("fenced_flushes", "handoffs", "lost", "takeover_seconds", "takeovers")

    def __init__(self) -> None:
        self.takeovers = 0  # partitions acquired and loaded
        self.takeover_seconds = 0.0  # their acquire-to-serving time, summed
        self.handoffs = 0  # partitions handed back
        self.lost = 0  # leases lost or self-fenced
        self.fenced_flushes = 0  # flushes refused for a partition
