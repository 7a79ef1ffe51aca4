"""Partitions coming to this node and going from it: a claim and a handback.

A claim acquires the lease (which bumps the epoch), adds the partition to
the keyspace's ``epochs`` (its flushes may write now), loads its tasks, and
only then serves it: what was overdue fires at the next tick, reserved
tasks keep their TTR deadlines, attempts in flight at the old owner's end
are sent again (at-least-once, as after a restart).

A handback first stops serving the partitions (their requests are answered
``moved``) and takes their tasks out of the wheel and the queues, so
nothing more fires; then it waits until the attempts it is sending have
ended and the write of what those partitions' journal lanes hold has
returned (not while that server's writes fail); then it releases the
leases. The partitions handed back together (all of them at a stop) are
taken out in one pass over the task table, not one pass each.

The coordinator (ha/coordinator.py) decides what moves; ``busy`` is the
partitions being claimed or handed back, which its rounds leave alone, and
``step`` what a handback waits on now, for a stop's give-up line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from delaywheel.ha.host import Host
from delaywheel.ha.lease import LeaseKeeper
from delaywheel.ha.sharing import Owner, Sharing
from delaywheel.store.redis import Holder, RedisStore
from delaywheel.tallies import ClusterCounts

log = logging.getLogger("delaywheel.cluster")


def nothing_to_rearm() -> None:
    pass


class Moves:
    """Claims and handbacks of one node's partitions."""

    def __init__(
        self,
        engine: Host[Any],
        keyspace: RedisStore,
        sharing: Sharing,
        keeper: LeaseKeeper,
        counts: ClusterCounts,
        handoff_wait_s: float,
    ) -> None:
        self.engine = engine
        self.keyspace = keyspace
        self.sharing = sharing
        self.keeper = keeper
        self.counts = counts
        self.handoff_wait_s = handoff_wait_s
        # The tick driver's look at the next timer, after a partition's tasks
        # came in (given at the coordinator's start: the server is built later).
        self.rearm: Callable[[], None] = nothing_to_rearm
        self.busy: set[int] = set()  # partitions being loaded or handed back
        self.step = ""  # what a handback waits on now

    def _primary_moves(self) -> int:
        return self.keyspace.topology.primary_moves

    async def primary_confirmed(self) -> bool:
        """Whether the server written to is still the primary (only Sentinel can say no)."""
        return await self.keyspace.topology.confirm_primary()

    async def claim(self, partition: int, holder: Holder | None) -> None:
        """Acquire (or adopt, ``holder`` being this node's previous process),
        load, then serve ``partition``; nothing when another node was quicker."""
        self.busy.add(partition)
        started_s = time.monotonic()
        moves = self._primary_moves()
        try:
            if holder is not None:  # ours, from this node's previous process
                got: int | Holder = await self.keeper.adopt(partition, holder.epoch)
            else:
                got = await self.keeper.acquire(partition)
            if not isinstance(got, int):
                return  # another node was quicker: the lease decides
            self.keyspace.epochs[partition] = got
            # Before the load: a task of it may fire, or an attempt of it be
            # sent again, before the partition is served (its epoch is in
            # every delivery, docs/ha.md).
            self.sharing.load(partition, got)
            loaded = await self.engine.load_partition(
                self.keyspace.load_partition(partition), partition
            )
            # Asked again after the acquire: one sent to a primary that froze
            # is answered when it wakes, maybe after a failover replaced it.
            confirmed = await self.primary_confirmed()
            if partition not in self.keeper.held or self._primary_moves() != moves or not confirmed:
                # Lost while loading, or acquired on a primary that is one no more.
                self.sharing.unserve(partition)
                self.keeper.forget(partition)
                self.keyspace.epochs.pop(partition, None)
                self.engine.drop_partitions({partition})
                return
            self.sharing.serve(partition, got)
            took_s = time.monotonic() - started_s
            self.counts.takeovers += 1
            self.counts.takeover_seconds += took_s
            log.info(
                "serving partition %d, epoch %d: %d tasks loaded in %.2f s",
                *(partition, got, loaded, took_s),
                extra={"partition": partition, "epoch": got, "tasks": loaded},
            )
            self.rearm()
        except Exception:
            self.keyspace.epochs.pop(partition, None)
            self.sharing.unserve(partition)
            self.engine.drop_partitions({partition})
            with contextlib.suppress(Exception):
                await self.keeper.release(partition)
            raise
        finally:
            self.busy.discard(partition)

    async def hand_back(self, partitions: set[int]) -> None:
        """Stop serving, let what is in flight be journaled, then release."""
        self.busy.update(partitions)
        try:
            for partition in partitions:
                self.sharing.hand_back(partition)
            # Nothing fires from here on; attempts in flight stay in the table,
            # so that their outcomes are journaled as they come.
            kept = self.engine.drop_partitions(partitions, keep_delivering=True)
            deadline_s = time.monotonic() + self.handoff_wait_s
            await self._sent_and_written(kept, partitions, deadline_s)
            # An attempt begun just before the drop, its own write in flight
            # then, is sent when that write comes back, during the drain: in
            # flight now, and its outcome is this node's to write. Let go
            # before that and the store keeps it delivering, and the next
            # owner sends it again at its deadline: a duplicate, in 2 of 87
            # runs of scenarios 7 and 8 (tests/test_attempts_in_flight.py).
            while self.engine.sending(kept) and time.monotonic() < deadline_s:
                # Those whose attempt ended leave first, before a failed one's
                # retry could fire here.
                ids = [task.id for task in kept]
                kept = self.engine.drop_partitions(partitions, keep_delivering=True, among=ids)
                await self._sent_and_written(kept, partitions, deadline_s)
            # Only the tasks kept are left of these partitions (requests for them
            # are answered moved): no second pass over the whole table.
            self.engine.drop_partitions(partitions, among=[task.id for task in kept])
            self.step = "releasing the leases"
            for partition in sorted(partitions):
                self.keyspace.epochs.pop(partition, None)
                if partition not in self.keeper.held:  # lost meanwhile: not ours to release
                    continue
                await self.keeper.release(partition)
                self.sharing.owners[partition] = Owner(None, None, None)
                self.counts.handoffs += 1
                log.info("handed back partition %d", partition, extra={"partition": partition})
        finally:
            self.busy.difference_update(partitions)
            for partition in partitions:
                self.sharing.handed_back(partition)

    async def _sent_and_written(
        self, kept: list[Any], partitions: set[int], deadline_s: float
    ) -> None:
        """Wait until the attempts of ``kept`` sent from here have ended (until
        ``deadline_s``), then for the write of what ``partitions``' lanes hold."""
        # Only the sends in flight here, until each has ended: not the
        # attempts taken over and held to their deadline (waiting for those
        # held a handoff after a takeover up to handoff_wait_s, 6.3 s in
        # scenario 4), nor an outcome whose write failed (delivering again
        # with nothing in flight).
        sending = self.engine.sending(kept)
        while sending and time.monotonic() < deadline_s:
            self.step = f"waiting for {len(sending)} attempts in flight"
            await asyncio.sleep(0.02)
            sending = self.engine.sending(sending)
        # Their outcomes' writes, in these partitions' lanes alone and once
        # (engine/journal.py, drain): a handback after a Sentinel failover,
        # writes refused for lack of replicas, waited 13.7 s for every lane
        # to be idle, a queue of failing WAITs, the partitions served by no
        # one meanwhile (tests/test_ha_sentinel_one_replica.py).
        self.step = "waiting for the journal to drain"
        await self.engine.drain(partitions)
