"""Partitions this node stops serving at once, not by a handoff: lost, fenced, stale.

A partition lost (the keeper's renewal was refused, or 0.8 L passed without
one: self-fenced) or fenced (a flush was refused) is dropped at once: no
request, tick or delivery of this node touches it after that, and the
store refuses any flush of it still in flight.

After a Sentinel failover (the store names a new primary) every owned
partition's epoch and lease are read again on the new primary, and those
that are not this node's as it holds them are dropped, to be acquired anew
by the next round (ha/failover.py). One log line per failover.

The losses of one moment are said together, one warning line per kind, and
their tasks leave the engine's table in one pass. The coordinator
(ha/coordinator.py) owns a ``Losses``, hands it the keeper's news and runs
its ``follow_the_store`` (the refusals and failovers the rights report).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection
from typing import Any

from delaywheel.ha.failover import stale_partitions
from delaywheel.ha.lease import LeaseKeeper
from delaywheel.ha.rights import NodeRights
from delaywheel.ha.sharing import Sharing
from delaywheel.store.redis import RedisStore
from delaywheel.tallies import ClusterCounts

log = logging.getLogger("delaywheel.cluster")

# Partitions lost or fenced within this of each other are one event, one log
# line: a node woken from a pause self-fences every partition in one loop turn
# and has its flushes in flight refused just after (one line each was 14 lines).
GATHER_LINES_S = 0.1
# How each kind of loss is said: (what, why).
_LOSSES = {
    "fenced": ("fenced partitions %s, epochs %s", "no lease renewal for 0.8 L"),
    "lost": ("lost partitions %s, epochs %s", "a lease renewal was refused"),
    "refused": (
        "partitions %s fenced",
        "a write was refused (another node owns them now)",
    ),
}


class Losses:
    def __init__(
        self,
        drop_partitions: Callable[[Collection[int]], Any],
        keyspace: RedisStore,
        sharing: Sharing,
        rights: NodeRights,
        keeper: LeaseKeeper,
        token: Callable[[int], str],
        counts: ClusterCounts,
        stopping: Callable[[], bool],
    ) -> None:
        # The engine's (Host.drop_partitions): the tasks of partitions lost leave its table.
        self.drop_partitions = drop_partitions
        self.keyspace = keyspace
        self.sharing = sharing
        self.rights = rights
        self.keeper = keeper
        self.token = token  # this node's lease value for an epoch (Leases.token)
        self.counts = counts
        self.stopping = stopping  # the coordinator's stop has begun: no re-read starts
        self._dropping: set[int] = set()  # lost, their tasks to be dropped next turn
        # Losses not logged yet, by kind: (partition, epoch), said together (_say_losses).
        self._losses: dict[str, list[tuple[int, int | None]]] = {}
        self._failed_over_to: tuple[str, int] | None = None  # a primary not yet re-read
        self.rereading: asyncio.Task[None] | None = None

    def lost(self, partition: int, epoch: int, why: str) -> None:
        """The keeper's: the lease is gone or may be (self-fenced)."""
        self.counts.lost += 1
        self._note_loss(why, partition, epoch)
        self._forget(partition)

    def _note_loss(self, kind: str, partition: int, epoch: int | None) -> None:
        if not self._losses:
            asyncio.get_running_loop().call_later(GATHER_LINES_S, self._say_losses)
        self._losses.setdefault(kind, []).append((partition, epoch))

    def _say_losses(self) -> None:
        """One warning per kind for the losses gathered (``GATHER_LINES_S``)."""
        losses, self._losses = self._losses, {}
        for kind, found in sorted(losses.items()):
            what, why = _LOSSES.get(kind, (f"{kind} partitions %s, epochs %s", kind))
            found.sort()
            partitions = [p for p, _ in found]
            epochs = [e for _, e in found]
            shown = (partitions, epochs) if what.count("%s") == 2 else (partitions,)
            log.warning(
                f"{what}: %s", *shown, why,
                extra={"partitions": partitions, "epochs": epochs, "reason": kind},
            )  # fmt: skip

    async def follow_the_store(self) -> None:
        """The rest of what the store reported to the rights (ha/rights.py),
        which no longer write nor serve a refused partition."""
        while True:
            refused, primary = await self.rights.news()
            try:
                self._answer(refused, primary)
            except Exception:  # logged, and the next news is followed all the same
                log.exception("following the store's refusals and failovers failed")

    def _answer(self, refused: list[set[int]], primary: tuple[str, int] | None) -> None:
        dropping: set[int] = set()
        for fenced in refused:
            self.counts.fenced_flushes += 1
            for partition in fenced:
                self._note_loss("refused", partition, None)
                self.keeper.forget(partition)
            dropping |= fenced
        if dropping:  # a loop turn after the journal rolled their lanes back
            self.drop_partitions(dropping)
        if primary is not None:
            self._primary_changed(*primary)

    def _primary_changed(self, host: str, port: int) -> None:
        """The store's news: Sentinel names a new primary. Its epochs are read in a task
        (one at a time; a failover during the read is read again after it)."""
        self._failed_over_to = (host, port)
        if not self.stopping() and (self.rereading is None or self.rereading.done()):
            self.rereading = asyncio.get_running_loop().create_task(self._reread_epochs())

    async def _reread_epochs(self) -> None:
        topology = self.keyspace.topology
        while (address := self._failed_over_to) is not None:
            self._failed_over_to = None
            held = self.keeper.held
            why = ""
            try:
                stale = await stale_partitions(
                    topology, address, self.keyspace.layout, held, self.token
                )
            except Exception as exc:  # unread is untrusted: drop them all
                stale, why = set(held), f" (the read failed: {exc!r})"
            for partition in sorted(stale):
                if self.keeper.held.get(partition) == held[partition]:  # not re-acquired meanwhile
                    self.keeper.forget(partition)
                    self.counts.lost += 1
                    self._forget(partition)
            log.warning(
                "store failed over to %s:%d: epochs re-read, %d partitions kept, %d dropped%s",
                *(*address, len(held) - len(stale), len(stale), why),
                extra={
                    "primary": f"{address[0]}:{address[1]}",
                    "kept": len(held) - len(stale),
                    "dropped": sorted(stale),
                },
            )

    def _forget(self, partition: int) -> None:
        """Stop serving and writing ``partition`` now; its tasks leave the table
        at the next loop turn, with every other partition lost in this one, in
        one pass (16 fence timers firing together once cost 16 passes, ten
        seconds over 1,000,000 tasks, during which no renewal was sent)."""
        self.sharing.unserve(partition)
        self.keyspace.epochs.pop(partition, None)
        if not self._dropping:
            asyncio.get_running_loop().call_soon(self._drop_forgotten)
        self._dropping.add(partition)

    def _drop_forgotten(self) -> None:
        dropping, self._dropping = self._dropping, set()
        self.drop_partitions(dropping)
