"""The journal of a store of lanes: several lanes' writes in flight at once.

The store says how keys map to lanes (``Store.lanes``, ``Store.lane_of``):
one lane for memory and SQLite, whose journal is engine/journal.py's
``Journal`` alone, and one per partition on a Redis keyspace, whose
partitions may live on different Cluster primaries. Each lane has at most
one write in flight and gathers its next batch meanwhile; that batch starts
from the write's callback. The lanes ready in one turn go to the store
together (``Store.submit_lanes``: still one round trip per primary), and the
store reports each lane's outcome on its own, so a write whose primary does
not answer holds up only its own lane's requests. One write in flight per
lane keeps each partition's writes in order. Under load one round trip
carries everything that arrived during the previous one.

A lane ready alone (one request at a time) takes the one-lane path,
``Journal._start``'s and ``_written``'s; this module holds what only
several lanes at once need: starting them together (``_start_together``)
and settling each store answer's lanes (``_lanes_written``), with the
figures counting the whole turn as one flush.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from functools import partial

from delaywheel.engine.batches import Batch, Joint, Lane, Wait
from delaywheel.engine.cold import Written
from delaywheel.engine.journal import Hooks, Journal, Tiering
from delaywheel.store.base import LaneOutcomes, Store, StoreError, Tiers, Unconfirmed
from delaywheel.store.watch import DEFAULT_SLOW_FLUSH_S

log = logging.getLogger("delaywheel.journal")  # pinned: its name is documented

# The batches a turn started, by lane, each with its changes as packed.
Started = dict[int, tuple[Batch, dict[str, bytes | None]]]
# The lanes one store answer settled: each with its batch, changes and outcome.
Settled = list[tuple[Lane, Batch, dict[str, bytes | None], StoreError | None]]


def journal_for(
    store: Store,
    hooks: Hooks,
    *,
    slow_flush_s: float = DEFAULT_SLOW_FLUSH_S,
    tiering: Tiering | None = None,
) -> Journal:
    """The journal of ``store``: of lanes when it has several."""
    kind = LanesJournal if store.lanes > 1 else Journal
    return kind(store, hooks, slow_flush_s=slow_flush_s, tiering=tiering)


class Turn:
    """The writes submitted together (one store round trip per primary), for the
    figures: counted as one flush once every lane has reported, written."""

    __slots__ = ("failed", "left", "size", "started_s")

    def __init__(self, left: int, size: int, started_s: float) -> None:
        self.left, self.size, self.started_s = left, size, started_s
        self.failed = False  # a lane of it failed: its time is not a write's


class LanesJournal(Journal):
    """A ``Journal`` whose store has several lanes (a Redis keyspace's partitions)."""

    several_lanes = True

    def newest(self, lanes: Collection[int] | None = None) -> Wait | None:
        """The newest batch of every lane (of ``lanes``) not yet durable (None: all are)."""
        among = self._lanes if lanes is None else [self._lanes[index] for index in lanes]
        found = [batch for lane in among if (batch := lane.newest()) is not None]
        if len(found) > 1:
            return Joint(found)
        return found[0] if found else None

    def _start_together(self, ready: list[Lane]) -> None:
        self._ready = []
        writes: list[tuple[int, Mapping[str, bytes | None]]] = []
        started: Started = {}
        lane_tiers: dict[int, Tiers] | None = None
        size = 0
        for lane in ready:
            lane.queued = False
            batch, changes = self._begin(lane)
            writes.append((lane.index, changes))
            started[lane.index] = (batch, changes)
            size += batch.size
            if batch.tiers is not None:
                lane_tiers = lane_tiers or {}
                lane_tiers[lane.index] = batch.tiers
        turn = Turn(len(writes), size, self.watch.started())
        done = partial(self._lanes_written, turn, started)
        try:
            if lane_tiers is None:
                self._store.submit_lanes(writes, done)
            else:
                self._store.submit_lanes(writes, done, lane_tiers)
        except Exception as exc:  # a store bug: fail the batches rather than hang their waiters
            log.exception("store submit raised")
            error = StoreError(f"store write failed: {exc!r}")
            done([(index, error) for index in list(started)])

    def _lanes_written(self, turn: Turn, started: Started, outcomes: LaneOutcomes) -> None:
        """Some lanes of a turn are done (a store answer: a primary's, say)."""
        settled = self._settle(started, outcomes)
        written = self._kept(turn, settled)
        if written:  # once for the lanes of this answer, before any of their replies
            self._durable(written)
        rolled_back = False
        for _, batch, _, error in settled:
            if error is None or isinstance(error, Unconfirmed):
                batch.finish(error)
            else:
                rolled_back = True
        if self._listeners:
            self._tell_settled(rolled_back)
        turn.left -= len(settled)
        if turn.left == 0 and not turn.failed:
            self.flushes += 1
            self.last_batch_size = turn.size
            self.max_batch_size = max(self.max_batch_size, turn.size)
            self.watch.written(turn.size, turn.started_s)
        for lane, *_ in settled:
            if lane.gathering.has_changes() and not lane.queued:
                lane.queued = True
                self._ready.append(lane)
        if self._ready and not self._flush_scheduled:
            self._start()  # together: the lanes this answer freed, and any waiting

    def _settle(self, started: Started, outcomes: LaneOutcomes) -> Settled:
        """Each reported lane's batch marked finished (with its error) before
        any waiter runs, so that a waiter sees every lane this answer settled."""
        settled: Settled = []
        for index, error in outcomes:
            got = started.pop(index, None)
            lane = self._lanes[index]
            if got is None or got[0] is not lane.writing:  # a broken store
                log.error("store completed a write of lane %d twice", index)
                continue
            batch, changes = got
            batch.finished, batch.error = True, error  # before any waiter runs
            if error is not None and not isinstance(error, Unconfirmed):
                lane.gathering.finished, lane.gathering.error = True, error
            settled.append((lane, batch, changes, error))
        return settled

    def _kept(self, turn: Turn, settled: Settled) -> Written:
        """The settled lanes' writes the store holds (durable, or taken without
        confirming them); a failed one rolled back."""
        watch = self.watch
        written: Written = []
        for lane, batch, changes, error in settled:
            lane.writing = None
            if error is not None:
                turn.failed = True
                if not isinstance(error, Unconfirmed):
                    self._fail(lane, batch, error, turn.started_s)
                    continue
                # In the store, not confirmed: kept, its waiters told (engine/journal.py).
                self._unconfirmed(lane, batch, error, turn.started_s)
            elif watch.lost:
                watch.recovered(lane.index, self._store.lane_group(lane.index))
            if batch.tiers is not None:
                self._tiers_written(batch, lane)
            written.append((batch.tasks, changes, lane.is_pending))
        return written
