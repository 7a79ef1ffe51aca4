"""The node's part in a shared keyspace: membership, leases, takeover and handoff.

Every ``period_s`` (a third of the lease, at most half a second, so that a
released partition is taken over in well under a second) the node registers
itself, in a loop of its own (``Presence``, ha/membership.py; the expiry
from Redis TIME), and the coordinator's round:

1. reads the live members and the assignment record (one script),
2. reads every partition's lease (the owner map that ``cluster`` answers
   and ``moved`` names), a pipeline per Redis primary, each given a third
   of the lease: a partition whose primary does not answer in time is
   neither claimed nor handed back this round, and its owner is the one
   known before (a dead Cluster primary holds up only its own partitions),
3. follows the record: when it is not balanced over the live members (a
   join, a leave) proposes the next one, the fewest moves from it
   (ha/assignment.py, compare-and-set: the first writer wins and the others
   follow it); with none stored, writes back the one it followed last,
4. claims the free partitions the record assigns to it (not one it still
   holds: a lease key deleted under it is dropped by the keeper first, then
   claimed anew), and those whose lease names this node but another epoch
   (this node's previous process, killed: its name is its own),
5. hands back a partition the record assigns to another live, registered node, and
6. publishes the topic settings it holds and reads those the others hold
   (ha/topics.py, per primary as the leases; a partition not read keeps
   the settings read before), which the engine applies in this node's
   share, and claims or gives back the seats of the topics whose
   concurrency is handed between the nodes (ha/seats.py).

A claim and a handback are ha/moves.py's. A handback to a joining node
runs beside the rounds (and the registration); the next owner, polling
every ``period_s``, takes the partition at once.

A stop is bounded: past ``handoff_wait_s`` plus ``STOP_BOUND_LEASES`` lease
periods it gives up with one warning line naming the step it was waiting
on, and the process exits; the leases it still holds expire and another
node takes over, as after a crash. The bound counts from the start of the
node's stop, the server's own included (its replies, its deliveries'
grace, its journal: ``stop(server)``), since each of those waits on Redis
too: counted from the handoff alone, a stop with Redis paused once waited
out the pause in the server's stop (a broker's connection attempt that
swallowed its cancel), and meanwhile its rounds took back the partitions
it had self-fenced. From the stop's start no round claims or hands back.
The rounds end on ``_stopping``, not on the cancel alone: redis-py (8.2,
on Python 3.11) swallows a cancel that lands while a command is being sent
(its ``asyncio.wait_for`` around the send returns the finished send), and a
stop that waited on the cancelled round loop then waited for ever, while
that loop went on running rounds (delaywheel/cancelling.py).

A partition lost (its lease), fenced (a flush refused) or stale after a
Sentinel failover is dropped at once, not handed back: ha/losses.py.

The coordinator sits below the engine and imports nothing of it: it asks
the engine only what ``Host`` names, and changes what requests see through
the ``Sharing`` the engine was given (``serve`` a partition gained,
``unserve`` one lost or handed back).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection
from typing import Any

from delaywheel_client.partitions import settings_key

from delaywheel.ha.assignment import moved, plan, rebalance
from delaywheel.ha.host import Host, StopsFirst
from delaywheel.ha.lease import LeaseKeeper, Leases
from delaywheel.ha.losses import Losses
from delaywheel.ha.membership import Membership, Presence, Record
from delaywheel.ha.moves import Moves, nothing_to_rearm
from delaywheel.ha.replicas import ReplicaWatch
from delaywheel.ha.rights import NodeRights
from delaywheel.ha.seats import Seats
from delaywheel.ha.sharing import Owner, Sharing
from delaywheel.ha.topics import TopicBoard
from delaywheel.store.redis import RedisStore
from delaywheel.tallies import ClusterCounts

log = logging.getLogger("delaywheel.cluster")

# Longest wait for a handed-back partition's attempts in flight to end.
HANDOFF_WAIT_S = 10.0
# A stop gives up after handoff_wait_s and this many lease periods more.
STOP_BOUND_LEASES = 3


class Coordinator:
    def __init__(
        self,
        engine: Host[Any],
        keyspace: RedisStore,
        sharing: Sharing,
        rights: NodeRights,
        *,
        handoff_wait_s: float = HANDOFF_WAIT_S,
    ) -> None:
        self.engine = engine
        self.keyspace = keyspace
        self.sharing = sharing
        # The store's owner (ha/rights.py): what it does not do at once of a
        # refusal or a failover comes here, by its news.
        self.rights = rights
        client = keyspace.client
        layout = keyspace.layout
        self.leases = Leases(client, layout, sharing.node, sharing.address)
        self.membership = Membership(client, layout, sharing.node, sharing.address)
        # The assignment record this node last read or wrote: followed, and
        # written again if Redis no longer has it (ha/membership.py).
        self.assigned: Record | None = None
        self.topics = TopicBoard(client, layout, sharing.node, sharing.address)
        self.seats = Seats(client, layout, sharing.node, sharing.address, engine, sharing.lease_s)
        self.keeper = LeaseKeeper(self.leases, sharing.lease_s, self._lost)
        self.period_s = min(sharing.lease_s / 3, 0.5)
        self.presence = Presence(self.membership, sharing.lease_s, self.period_s)
        # A read of every partition gives each primary this long (ha/lease.py's renewals too).
        self.read_timeout_s = sharing.lease_s / 3
        self._published: dict[int, dict[str, bytes]] = {}  # the topics read last, by partition
        self.counts = ClusterCounts()
        self.moves = Moves(engine, keyspace, sharing, self.keeper, self.counts, handoff_wait_s)
        # Partitions dropped at once (lost, fenced, stale), and the store's news.
        self.losses = Losses(
            engine.drop_partitions,
            keyspace,
            sharing,
            rights,
            self.keeper,
            self.leases.token,
            self.counts,
            lambda: self._stopping,
        )
        keys = [names.epoch for names in layout]  # one key of each partition: its primary
        self.replicas = ReplicaWatch(
            keyspace.replicas,
            lambda: self.keyspace.topology.replicas_connected(keys),
            self.writes_refused_for_replicas,
            lambda: self.keyspace.writes_confirmed,
        )
        self._loop_task: asyncio.Task[None] | None = None
        self._stopping = False
        self._gave_up = False  # a hand-back whose cancel was swallowed ends on it
        self._stop_step = ""  # what a stop waits on now, for its give-up line
        self._handed_at_stop = 0  # the partitions a stop hands back, for its exit line
        self._handing: set[asyncio.Task[None]] = set()  # handbacks to a joining node
        self._following: asyncio.Task[None] | None = None  # the rights' news, until stopped

    # -- life cycle ----------------------------------------------------------

    async def start(self, rearm: Callable[[], None] = nothing_to_rearm) -> None:
        """Register and take this node's first partitions (loaded before it serves);
        ``rearm`` is called after each partition's tasks come in."""
        self.moves.rearm = rearm
        loop = asyncio.get_running_loop()
        self._following = loop.create_task(self.losses.follow_the_store())
        await self.leases.load()
        await self.membership.load()
        # Renewing before the first round: that round acquires and loads every
        # partition this node takes, which can outlast 0.8 L (1,000,000 tasks
        # took 17 s on a busy machine), and an unrenewed lease self-fences.
        self.keeper.start()
        await self.presence.start()
        await self._round()
        self._loop_task = asyncio.get_running_loop().create_task(self._run())
        self.replicas.start()

    def writes_refused_for_replicas(self) -> int:
        """Writes that ``WAIT`` found short of ``--replicas`` confirmations so far."""
        return self.keyspace.short_of_replicas

    async def stop(self, server: StopsFirst | None = None) -> None:
        """Stop ``server`` first, when given, then hand every partition back (a
        graceful stop: the next owner takes over at once); give up
        ``stop_bound_s`` after the call (see the module docstring)."""
        try:
            await self._stop_within_bound(server)
        finally:  # what the store reports is followed until the partitions are gone
            following = self._following
            if following is not None:
                following.cancel()  # waits on an event alone: the cancel lands
                await asyncio.wait({following})

    async def _stop_within_bound(self, server: StopsFirst | None) -> None:
        self._stopping = True  # from now on no round claims or hands back
        started_s = time.monotonic()
        await self.replicas.close()
        bound_s = self.stop_bound_s
        until_s = started_s + bound_s
        waiting_on = None if server is None else await server.stop(until_s)
        if waiting_on is None:  # the journal is drained: the partitions can go back
            stopping = asyncio.get_running_loop().create_task(self._hand_all_back())
            # Waited on, not wait_for'ed: a cancel of the handoff could be
            # swallowed as the round loop's was.
            await asyncio.wait({stopping}, timeout=max(0.0, until_s - time.monotonic()))
            if stopping.done():
                took_s = time.monotonic() - started_s
                log.info(
                    "stopped: handed back %d partitions in %.2f s",
                    *(self._handed_at_stop, took_s),
                    extra={"partitions": self._handed_at_stop, "duration_s": round(took_s, 3)},
                )
                return
            stopping.cancel()
            waiting_on = self._stop_step or self.moves.step  # (the handback's, in it)
        self._gave_up = True
        await self.presence.stop()  # the registration lapses: the others take over
        held = sorted(self.keeper.held)
        log.warning(
            "graceful stop gave up after %g s %s: partitions %s are left to their leases,"
            " which expire within %g s",
            *(bound_s, waiting_on, held, self.sharing.lease_s),
            extra={"waiting_on": waiting_on, "partitions": held},
        )
        self.keeper.forget_all()

    @property
    def stop_bound_s(self) -> float:
        return self.moves.handoff_wait_s + STOP_BOUND_LEASES * self.sharing.lease_s

    async def _hand_all_back(self) -> None:
        self._stop_step = "waiting for the coordinator's round to end"
        for task in (self._loop_task, self.losses.rereading):
            if task is not None:
                task.cancel()  # may be swallowed: the loops end on _stopping too
                await asyncio.wait({task})
        if self._handing:  # handbacks under way end first (within handoff_wait_s)
            self._stop_step = "waiting for a handback under way"
            await asyncio.wait(set(self._handing))
        held = set(self.keeper.held)
        handoffs = self.counts.handoffs
        if held:
            self._stop_step, self.moves.step = "", "handing back the partitions"
            with contextlib.suppress(Exception):
                await self.moves.hand_back(held)
        self._handed_at_stop = self.counts.handoffs - handoffs
        if self._gave_up:
            return
        self._stop_step = "leaving the members"
        await self.presence.stop()
        with contextlib.suppress(Exception):
            await self.membership.leave()
        self._stop_step = "closing the lease keeper"
        await self.keeper.close(release=True)

    async def _run(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self.period_s)
            try:
                await self._round()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis away: the keeper's fence timers decide
                log.debug("cluster round failed: %r", exc)

    # -- one round -------------------------------------------------------------

    async def _round(self) -> None:
        sharing = self.sharing
        known = None if self.assigned is None else self.assigned.version
        look = await self.membership.look(known)
        live = look.live
        # The record stored now: the one this node has when its version is known.
        stored = None if look.version is None else (look.record or self.assigned)
        # One grouping for both of the round's reads. It only batches them
        # (redis-py routes each command by its key), so a slot map that moved
        # since costs at most a batch waiting on a primary not its own.
        groups = self._by_primary()
        holders, unknown = await self.leases.holders(groups, self.read_timeout_s)
        owners: dict[int, str | None] = {}
        for partition in range(sharing.partitions):
            if partition in unknown:  # its primary did not answer: as known before
                owners[partition] = sharing.owners[partition].node
                continue
            holder = holders.get(partition)
            owners[partition] = None if holder is None else holder.node
            sharing.owners[partition] = (
                Owner(None, None, None)
                if holder is None
                else Owner(holder.node, holder.address, holder.epoch)
            )
        if self._stopping:
            return
        # Claim only on a primary the Sentinels vouch for now: one frozen through
        # a failover answers the calls above as a primary again once it wakes
        # (when it moved, the epochs are being read again: claim next round, there).
        if not await self.moves.primary_confirmed():
            return
        assigned = await self._follow(live, stored)
        held = self.keeper.held
        todo = plan(sharing.node, live, assigned, owners, held)
        stale = {p for p, node in owners.items() if node == sharing.node and p not in held}
        for partition in sorted((todo.claim | stale) - unknown):
            if self._stopping:
                return
            if partition not in self.moves.busy:
                await self.moves.claim(partition, holders.get(partition))
        busy = self.moves.busy
        leaving = {p for p in todo.hand_back - unknown if p in held and p not in busy}
        if leaving and not self._stopping:
            # In a task of its own: the rounds go on meanwhile, registering this
            # node (a handback that waits on attempts in flight or on a failing
            # write can outlast L, and with the rounds held the node's own
            # registration lapsed: the others saw it gone, mid-handback).
            busy.update(leaving)  # the next rounds leave them alone
            handing = asyncio.get_running_loop().create_task(self.moves.hand_back(leaving))
            self._handing.add(handing)
            handing.add_done_callback(self._handed)
        try:
            await self._share_topics(groups)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # Redis away: the settings last known still apply
            log.debug("sharing the topic settings failed: %r", exc)

    async def _share_topics(self, groups: list[list[int]]) -> None:
        """Publish the topic settings held here, per partition served, and hand
        the engine those the partitions served elsewhere publish; ``groups``:
        the partitions by primary (``_by_primary``)."""
        published, unknown = await self.topics.read(groups, self.read_timeout_s)
        # A partition whose primary did not answer: the settings read before.
        published.update((p, self._published[p]) for p in unknown if p in self._published)
        self._published = published
        serving = dict(self.sharing.serving)
        held: dict[int, dict[str, bytes]] = {}
        for topic, record in self.engine.topic_records().items():
            partition = self.sharing.partition_of(settings_key(topic))
            held.setdefault(partition, {})[topic] = record
        for partition, epoch in sorted(serving.items()):
            have, want = published.get(partition, {}), held.get(partition, {})
            if have != want and not self._stopping:
                await self.topics.publish(partition, epoch, have, want)
        elsewhere = {
            topic: record
            for partition, found in published.items()
            if partition not in self.sharing.serving
            for topic, record in found.items()
        }
        self.engine.topics_shared(elsewhere)
        await self.seats.round()  # with the settings and the shares just learned

    async def _follow(self, live: Collection[str], stored: Record | None) -> dict[int, str]:
        """The assignment to follow this round: the record ``stored``, rebalanced
        over the live members and proposed when they changed (ha/membership.py)."""
        partitions = self.sharing.partitions
        members = {*live, self.sharing.node}  # this node is live, whatever Redis says
        # With no record stored (deleted, or lost by Redis): this node's last copy.
        base = stored if stored is not None else self.assigned
        previous = {} if base is None else base.owners
        wanted = rebalance(previous, members, partitions)
        if stored is not None and wanted == stored.owners:
            self.assigned = stored
            return stored.owners
        proposal = Record.new((0 if base is None else base.generation) + 1, wanted)
        read = None if stored is None else stored.version
        written, found = await self.membership.propose(read, proposal)
        if written:
            restored = stored is None and base is not None
            self._say_assignment(proposal, previous, len(members), restored=restored)
        if found is None:  # none stored still (deleted meanwhile): the next round writes it
            return wanted
        self.assigned = found
        return found.owners

    def _say_assignment(
        self, record: Record, previous: dict[int, str], nodes: int, *, restored: bool
    ) -> None:
        """One line per record this node wrote (only the writer says it)."""
        moves = moved(previous, record.owners) if previous else 0
        fields = {"generation": record.generation, "nodes": nodes, "moves": moves}
        if restored:  # someone deleted the key, or Redis lost it
            log.warning(
                "assignment record missing: written again from this node's copy,"
                " generation %d: %d node(s), %d partition(s) move",
                *fields.values(),
                extra=fields,
            )
        else:
            log.info(
                "assignment generation %d: %d node(s), %d partition(s) move",
                *fields.values(),
                extra=fields,
            )

    def _by_primary(self) -> list[list[int]]:
        """The partitions grouped by the primary serving them (their lease keys'
        slots: a partition's keys share one), by the slot map known now."""
        return self.keyspace.topology.by_primary([keys.lease for keys in self.keyspace.layout])

    def _handed(self, task: asyncio.Task[None]) -> None:
        self._handing.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.debug("handback failed: %r", exc)  # the keeper's fence timers decide

    # -- losses ----------------------------------------------------------------

    def _lost(self, partition: int, epoch: int, why: str) -> None:
        """The keeper's: the lease is gone or may be (self-fenced); see ha/losses.py."""
        self.losses.lost(partition, epoch, why)

    def stats(self) -> dict[str, Any]:
        return {
            "node": self.sharing.node,
            "partitions": self.sharing.stats(),
            "replicas": self.replicas.stats(self.writes_refused_for_replicas()),
        }

    def unowned(self) -> int:
        """Partitions with no owner in this node's last look at the leases."""
        owners = self.sharing.owners
        return sum(
            1
            for p in range(self.sharing.partitions)
            if (owner := owners.get(p)) is None or owner.node is None
        )
