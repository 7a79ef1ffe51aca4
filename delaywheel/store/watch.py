"""The store's health as the log tells it: outages and slow writes, one line each.

The journal reports every write here (``started``, then ``written`` or
``failed``). It is the one place that sees every write of every store, so
the lines mean the same for Redis, SQLite and memory. An outage runs from
the first write that fails to the moment every lane that failed has written
again, or another lane of its group has (``recovered``; a lane is a
partition on a Redis keyspace, its group the server that holds it: one
Redis, or a Cluster primary, so that one primary's failure is one outage,
not a lost/back pair each time another primary's write lands): a warning
when it begins, an info line with its length and what failed during it
when it ends. In between, under hundreds of writes a second, each failed write is a
debug line only (the clients got ``unavailable`` and the reason already).
A write that succeeds but took ``slow_s`` or more is a warning with its size
and time: the store is struggling before it fails.

Cost: one clock read when a write starts and one when it ends, per flush,
whatever the number of changes it carries.

For metrics it also keeps, read only when scraped: the writes that failed
since the start, and with ``histograms`` (the journal's choice: not for a
store whose writes finish inside the call, memory://, where a time would
say nothing and the two observations would cost 4 % of an add) the time and
the size of each write that succeeded (``delaywheel.tallies``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from delaywheel.tallies import FLUSH_BOUNDS_S, FLUSH_SIZE_BOUNDS, Histogram

log = logging.getLogger("delaywheel.store")

# A store write that takes this long or more is logged (--slow-flush).
DEFAULT_SLOW_FLUSH_S = 1.0


class StoreWatch:
    def __init__(
        self,
        url: str,
        *,
        slow_s: float = DEFAULT_SLOW_FLUSH_S,
        clock: Callable[[], float] = time.monotonic,
        histograms: bool = True,
    ) -> None:
        self.url = url  # the display URL: no password
        self.slow_s = slow_s
        self._clock = clock
        self._lost_since_s: float | None = None
        self._lost_lanes: dict[int, object] = {}  # lane -> its group, while lost
        self._failed_writes = 0
        self._failed_changes = 0
        self.failures = 0  # writes that failed, since the start
        self.histograms = histograms
        self.durations = Histogram(FLUSH_BOUNDS_S)
        self.sizes = Histogram(FLUSH_SIZE_BOUNDS)

    @property
    def lost(self) -> bool:
        return self._lost_since_s is not None

    def is_failing(self, lane: int, group: object = None) -> bool:
        """Whether the last write of ``lane``, or of another lane of its group
        (the same server), failed with none of the group's written since."""
        lost = self._lost_lanes
        return lane in lost or group in lost.values()

    def started(self) -> float:
        """A write is submitted: when (for ``written`` and ``failed``)."""
        return self._clock()

    def written(self, size: int, started_s: float) -> None:
        """That write of ``size`` changes, started at ``started_s``, is durable."""
        now_s = self._clock()
        took_s = now_s - started_s
        if self.histograms:
            self.durations.observe(took_s)
            self.sizes.observe(size)
        if took_s >= self.slow_s:
            log.warning(
                "slow store write: %d changes took %.2f s (threshold %g s)",
                *(size, took_s, self.slow_s),
                extra={"changes": size, "duration_s": round(took_s, 3)},
            )

    def recovered(self, lane: int, group: object = None) -> None:
        """A write of ``lane`` (of ``group``) is durable during an outage: it ends
        once every lane that failed has written again, or a lane of its group."""
        lost = self._lost_lanes
        lost.pop(lane, None)
        for other in [other for other, of in lost.items() if of == group]:
            del lost[other]
        if self._lost_since_s is not None and not lost:
            outage_s = self._clock() - self._lost_since_s
            log.info(
                "store %s back after %.1f s; %d writes (%d changes) failed meanwhile",
                *(self.url, outage_s, self._failed_writes, self._failed_changes),
                extra={
                    "store": self.url,
                    "outage_s": round(outage_s, 3),
                    "failed_writes": self._failed_writes,
                    "failed_changes": self._failed_changes,
                },
            )
            self._lost_since_s = None
            self._failed_writes = self._failed_changes = 0

    def failed(
        self, size: int, error: Exception, started_s: float, lane: int = 0, group: object = None
    ) -> None:
        """That write of ``size`` changes of ``lane`` (of ``group``), started at
        ``started_s``, failed with ``error`` (whose text names the store's
        display URL, never its password). A write refused because another node
        owns its partition now (answered ``moved``: ``FencedWrite``) is no
        outage: the store took the refusal, and the coordinator says it
        (docs/ha.md); as one, it made a lost/back pair of lines each time."""
        if getattr(error, "reply_code", None) == "moved":
            log.debug("store write of %d changes refused: %s", size, error)
            return
        self.failures += 1
        self._failed_writes += 1
        self._failed_changes += size
        self._lost_lanes[lane] = group
        if self._lost_since_s is None:
            self._lost_since_s = started_s
            # The error names the store first; the line does already.
            detail = str(error).removeprefix(f"store {self.url}: ")
            log.warning(
                "store %s lost: %s; writes answer unavailable until it is back",
                *(self.url, detail),
                extra={"store": self.url, "error": detail},
            )
        else:
            log.debug("store write of %d changes failed: %s", size, error)
