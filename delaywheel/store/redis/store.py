"""The Redis store: partitions in Redis, each write an epoch-checked flush.

``RedisStore`` keeps the ``Store`` contract (store/base.py) on plain Redis,
Sentinel or a Redis Cluster alike: the differences are its topology's
(topology.py, sentinel.py). What it does:

- Records live in their partition's hash (``{<prefix>:pNNN}:tasks``,
  layout.py), and ``load_partition`` reads one partition (scan.py): a node
  loads the partitions it owns, when it acquires them; ``load`` reads them
  all, one after another.
- Every ``submit`` is a fenced flush (fenced.py): one epoch-checked
  script per partition it touches, pipelined, one round trip. ``epochs`` is
  the map of the partitions this node may write and the epoch it holds for
  each, its ``Owner``'s (owner.py: the coordinator on a node; the store
  itself, ``SoleOwner``, for one process alone). A change in a partition not
  in ``epochs`` is refused here, without a round trip, as the script would
  refuse it.
- Tasks due beyond --horizon are in each partition's far tier, which the
  flush writes and ``far_range``, ``far_get`` and ``far_counts`` read (far.py).

Each partition is a lane of the journal's (``lanes``, ``lane_of``,
``submit_lanes``; engine/lanes.py): the journal keeps at most one write
of a partition in flight, and this store reports each partition's outcome
on its own. A write refused for a partition fails that partition's lane
with ``FencedWrite``, naming the partition and the holder the refusal read:
the journal rolls that lane back and its requests are answered ``moved``
about their own partition, while the flush's other partitions are written
and answered as usual; ``on_fenced`` tells the coordinator, which drops the
fenced partitions. A partition not in ``epochs`` is refused the same way,
without a round trip. ``submit`` (the ``Store`` contract, for tools and
tests) is ``submit_lanes`` of a batch's partitions, answered once all are
done, ``FencedWrite`` naming every partition fenced and every one written.

On a Redis Cluster each partition's keys are in a slot of their own, so the
partitions spread over the primaries, and the writer keeps one link per
primary (fenced_cluster.py): a flush sends each primary one pipeline of
its partitions' scripts, all at once, and each primary's partitions are
reported as that primary answers: a primary that does not answer, or whose
WAIT fails, holds up or fails only its own partitions.

At ``open``: P is recorded in the meta key at first use, and a keyspace made
with another P is refused naming both values; so is the layout (``spread``).
On a Cluster, a keyspace of the release that kept every partition in one
slot is spread over the primaries first (spread.py); a keyspace
written by the single-node release (one hash ``{<prefix>}:tasks``) is
migrated (migrate.py). Both before anything is loaded. Durability and
bounded time: see the package's docstring (__init__.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from functools import partial
from typing import Any

from delaywheel.store.base import (
    DEFAULT_BATCH_SIZE,
    Changes,
    Done,
    FarRecord,
    LaneOutcomes,
    LanesDone,
    Store,
    StoreConfigError,
    StoreError,
    StoreUnavailable,
    Tiers,
    Unconfirmed,
    check_batch_size,
    redact_url,
)
from delaywheel.store.redis.client import Client, durability_warnings, replicas_warning
from delaywheel.store.redis.far import read_by_id, read_counts, read_range
from delaywheel.store.redis.fenced import (
    FlushOutcome,
    PartitionWrite,
    TooFewReplicas,
)
from delaywheel.store.redis.layout import (
    DEFAULT_PARTITIONS,
    Layout,
    PartitionsError,
    parse_holder,
    partition_of,
    record_partitions,
)
from delaywheel.store.redis.migrate import migrate
from delaywheel.store.redis.owner import Holders, Owner, SoleOwner
from delaywheel.store.redis.scan import scan_hash
from delaywheel.store.redis.sentinel import SentinelTopology
from delaywheel.store.redis.spread import Spread
from delaywheel.store.redis.topology import Topology, Writer

DEFAULT_PREFIX = "delaywheel"
DEFAULT_CONNECT_TIMEOUT_S = 5.0
DEFAULT_TIMEOUT_S = 5.0

# How long a flush's WAIT waits for --replicas N confirmations before the
# change is answered unavailable. Replicas on a LAN confirm in milliseconds;
# a second rides out a busy replica or a short stall. The journal keeps one
# write of a partition in flight, so while a primary's replicas are missing
# every change of its partitions waits this long.
REPLICAS_WAIT_S = 1.0

# (fenced partitions, the holders the refusals named, by partition)
OnFenced = Callable[[set[int], Holders], None]


class FencedWrite(StoreError):
    """A write refused for some partitions: their owner moved on. Its requests
    are answered ``moved`` (``reply_code``), with the first fenced partition
    and, when the refusal named it, that partition's new owner and epoch. A
    lane's (one partition's) names its own partition; ``submit``'s, for a
    batch over several, names the first and lists the ``written`` ones."""

    reply_code = "moved"

    def __init__(
        self, message: str, fenced: set[int], written: set[int], holders: Holders | None = None
    ) -> None:
        super().__init__(message)
        self.fenced = fenced
        self.written = written
        self.holders = holders or {}
        first = min(fenced)
        holder = self.holders.get(first)
        self.reply_data: dict[str, Any] = {
            "partition": first,
            "owner": None if holder is None else holder.address,
            "epoch": None if holder is None else holder.epoch,
        }


def _one_lane(done: Done, outcomes: LaneOutcomes) -> None:
    """One lane's outcome (``submit_lanes``') to a ``submit``-style ``done``."""
    ((_, error),) = outcomes
    done(error)


def topology_for(url: str, **options: Any) -> Topology:
    """The topology of a store URL (``options``: Topology's): Sentinel's for
    ``redis+sentinel://``, else one Redis until ``open`` finds a Cluster."""
    if url.lower().startswith("redis+sentinel://"):
        return SentinelTopology(url, **options)
    return Topology(url, **options)


class RedisStore(Store):
    inline = False
    tiered = True  # far, due and farcount per partition (layout.py, engine/horizon.py)

    def __init__(
        self,
        url: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        partitions: int = DEFAULT_PARTITIONS,
        replicas: int = 0,
        owner: Owner | None = None,
        node_name: str = "delaywheel",
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        """``owner``: who owns the partitions (owner.py); None: this store alone.
        ``node_name``: who migrates or spreads the layout, for the lock."""
        super().__init__(redact_url(url))
        try:
            self.layout = Layout(prefix, partitions)
        except PartitionsError as exc:
            raise StoreConfigError(f"store URL {self.url!r}: {exc}") from None
        self.prefix = prefix
        self.partitions = partitions
        self.lanes = partitions  # a lane per partition: each fenced, and on a Cluster placed, alone
        # The partition rule itself, not a method calling it: the journal asks
        # once per change, and a partial saves a Python call each time.
        self.lane_of = partial(partition_of, partitions=partitions)  # type: ignore[method-assign]
        self.replicas = replicas
        # Writes that WAIT found short of --replicas confirmations, and writes
        # written in full (ha/replicas.py tells "refused again" from "no writes").
        self.short_of_replicas = 0
        self.writes_confirmed = 0
        self._sole = owner is None
        self.owner: Owner = SoleOwner() if owner is None else owner
        self.epochs = self.owner.epochs  # partition -> epoch this node may write with
        self.on_fenced: OnFenced | None = self.owner.fenced
        self.topology = topology_for(
            url,
            shown=self.url,
            connect_timeout_s=connect_timeout_s,
            timeout_s=timeout_s,
            on_primary_changed=self.owner.primary_changed,
        )
        self._writer: Writer | None = None
        self.migrated = 0  # records moved from the single-node layout at open
        self.relaid: Spread | None = None  # the single-slot layout spread, at open
        self._warnings: list[str] = []
        self.node_name = node_name

    @property
    def client(self) -> Client:
        """The redis-py client (leases, membership, loading)."""
        return self.topology.client

    async def open(self) -> None:
        self._start_open()
        self.topology = topology = await self.topology.open()
        # Each partition's (epoch, tasks, lease) keys, made once: a flush names them.
        self._keys = [(names.epoch, names.tasks, names.lease) for names in self.layout]
        self._far_keys = [(names.far, names.due, names.far_counts) for names in self.layout]
        client, layout = topology.client, self.layout
        try:
            warnings = await durability_warnings(
                client, topology.secrets, **topology.route(layout.meta)
            )
            await record_partitions(client, layout)
            self.relaid = await topology.lay_out(layout, self.node_name)
            migrated = await migrate(client, layout, node=self.node_name)
            self.migrated = 0 if migrated is None else migrated.moved
            if self._sole:
                await self._take_every_partition()
            self._writer = topology.writer(
                replicas=self.replicas, wait_timeout_s=REPLICAS_WAIT_S, held=self._holds
            )
            warning = await replicas_warning(client, self.replicas, **topology.route(layout.meta))
            self._warnings = warnings if warning is None else [*warnings, warning]
        except PartitionsError as exc:
            await topology.close()
            raise StoreError(f"store {self.url}: {exc}") from None
        except Exception:
            await topology.close()
            raise
        self._state = "open"

    async def _take_every_partition(self) -> None:
        """This store alone (``SoleOwner``): every partition at the epoch Redis
        holds, 0 where none was ever held (owner.py)."""
        pipe = self.client.pipeline(transaction=False)
        for names in self.layout:
            pipe.set(names.epoch, 0, nx=True)
        for names in self.layout:
            pipe.get(names.epoch)
        replies = await pipe.execute()
        epochs = replies[self.partitions :]
        self.epochs.update((p, int(epoch)) for p, epoch in enumerate(epochs))

    def load(self, batch_size: int = DEFAULT_BATCH_SIZE) -> AsyncIterator[list[tuple[str, bytes]]]:
        """Every partition's records (for tools; a node loads what it owns)."""
        check_batch_size(batch_size)
        self._check_open("load")
        return self._load_all(batch_size)

    async def _load_all(self, batch_size: int) -> AsyncIterator[list[tuple[str, bytes]]]:
        for partition in range(self.partitions):
            async for batch in self.load_partition(partition, batch_size):
                yield batch

    def load_partition(
        self, partition: int, batch_size: int = DEFAULT_BATCH_SIZE
    ) -> AsyncIterator[list[tuple[str, bytes]]]:
        """One partition's ``(id, record)`` pairs, in batches, each id once (scan.py)."""
        check_batch_size(batch_size)
        self._check_open("load")
        key = self.layout.partition(partition).tasks
        topology = self.topology
        return scan_hash(topology.client, key, batch_size, url=self.url, secrets=topology.secrets)

    async def far_range(
        self, lane: int, after: tuple[float, str] | None, before_s: float | None, limit: int
    ) -> list[FarRecord]:
        """The partition's far tasks by due time, from ``after``'s (far.py)."""
        self._check_open("far_range")
        names = self.layout.partition(lane)
        topology = self.topology
        return await read_range(
            topology.client, names, after, before_s, limit, url=self.url, secrets=topology.secrets
        )

    async def far_get(self, task_ids: Sequence[str]) -> dict[str, tuple[float, bytes]]:
        self._check_open("far_get")
        topology = self.topology
        return await read_by_id(
            topology.client, self.layout, task_ids, url=self.url, secrets=topology.secrets
        )

    async def far_counts(self, lane: int) -> dict[str, int]:
        self._check_open("far_counts")
        names, topology = self.layout.partition(lane), self.topology
        return await read_counts(topology.client, names, url=self.url, secrets=topology.secrets)

    def lane_group(self, lane: int) -> object:
        """On a Cluster, the primary that serves the partition's slot now; else
        the one Redis (None)."""
        writer = self._writer
        return None if writer is None else writer.primary_of(self._keys[lane][1])

    def submit(self, changes: Changes, done: Done, tiers: Tiers | None = None) -> None:
        """The batch's partitions written as ``submit_lanes`` writes them,
        answered once all are: None, the first error, or ``FencedWrite`` naming
        every partition refused and every one written."""
        if not changes:
            error = self._not_open("write")
            done(error)
            return
        partitions = self.partitions
        by_partition: dict[int, dict[str, bytes | None]] = {}
        for task_id, record in changes.items():
            p = partition_of(task_id, partitions)
            part = by_partition.get(p)
            if part is None:
                part = by_partition[p] = {}
            part[task_id] = record
        lane_tiers = None if not tiers else self._split_tiers(tiers, by_partition)
        results: dict[int, StoreError | None] = {}

        def lanes_done(outcomes: LaneOutcomes) -> None:
            results.update(outcomes)
            if len(results) == len(by_partition):
                done(self._merged(results))

        self.submit_lanes(list(by_partition.items()), lanes_done, lane_tiers)

    def _split_tiers(
        self, tiers: Tiers, by_partition: dict[int, dict[str, bytes | None]]
    ) -> dict[int, Tiers]:
        """``tiers`` cut by partition; each part's conflicts are the whole's."""
        split: dict[int, Tiers] = {}
        for p, part in by_partition.items():
            mine = split[p] = Tiers()
            mine.conflicts = tiers.conflicts  # one set: the store fills the caller's
            mine.far = {key: tiers.far[key] for key in part if key in tiers.far}
            mine.was_far = {key: tiers.was_far[key] for key in part if key in tiers.was_far}
            mine.blind = {key for key in part if key in tiers.blind}
            if tiers.groups:  # a group is in one partition (engine/horizon.py)
                mine.groups = {key: tiers.groups[key] for key in mine.blind if key in tiers.groups}
        return split

    def _merged(self, results: dict[int, StoreError | None]) -> StoreError | None:
        errors = [error for error in results.values() if error is not None]
        fenced = [error for error in errors if isinstance(error, FencedWrite)]
        if not fenced:
            return errors[0] if errors else None
        refused = {p for error in fenced for p in error.fenced}
        holders = {p: h for error in fenced for p, h in error.holders.items()}
        written = {p for p, error in results.items() if error is None}
        return FencedWrite(
            f"store {self.url}: partition(s) {sorted(refused)} are no longer this node's:"
            " the write was refused there",
            refused,
            written,
            holders,
        )

    def submit_lanes(
        self,
        writes: Sequence[tuple[int, Changes]],
        done: LanesDone,
        tiers: Mapping[int, Tiers] | None = None,
    ) -> None:
        error = self._not_open("write")
        writer = self._writer
        if error is not None or writer is None:
            error = error or StoreUnavailable(f"store {self.url}: write failed: not open")
            done([(p, error) for p, _ in writes])
            return
        epochs, keys = self.epochs, self._keys
        parts: list[PartitionWrite] = []
        unowned: set[int] = set()
        for p, changes in writes:
            epoch = epochs.get(p)
            if epoch is None:
                # Dropped (self-fenced, lost) while its changes gathered: refused
                # here, as its script would refuse it; its requests are answered
                # moved and retried.
                unowned.add(p)
            elif changes:
                mine = None if tiers is None else tiers.get(p)
                if mine:
                    parts.append(
                        PartitionWrite(p, epoch, *keys[p], changes, mine, self._far_keys[p])
                    )
                else:
                    parts.append(PartitionWrite(p, epoch, *keys[p], changes))
            else:
                done([(p, None)])
        if unowned:
            self._refuse(unowned, done)
        if not parts:
            return
        writer.submit(parts, partial(self._report, done))

    def submit_lane(
        self, lane: int, changes: Changes, done: Done, tiers: Tiers | None = None
    ) -> None:
        if len(changes) != 1 or tiers:
            self.submit_lanes(
                [(lane, changes)], partial(_one_lane, done), None if not tiers else {lane: tiers}
            )
            return
        error = self._not_open("write")
        writer = self._writer
        if error is not None or writer is None:
            done(error or StoreUnavailable(f"store {self.url}: write failed: not open"))
            return
        ((task_id, record),) = changes.items()
        self._submit_one(writer, lane, task_id, record, done)

    def _submit_one(
        self, writer: Writer, p: int, task_id: str, record: bytes | None, done: Done
    ) -> None:
        """``submit_lane`` of one change (one request at a time): no list of
        writes, and on a plain Redis or Sentinel no outcome made when it is
        written (the commonest); both writers take it alike."""
        epoch = self.epochs.get(p)
        if epoch is None:
            self._refuse({p}, partial(_one_lane, done))
            return
        epochs, keys = self.epochs, self._keys[p]

        def answered(outcome: FlushOutcome | None) -> None:
            # An outcome: one server's rare answers, a Cluster writer's every one;
            # the write is made only now.
            if outcome is not None:
                writes = [PartitionWrite(p, epoch, *keys, {task_id: record})]
                self._report(partial(_one_lane, done), writes, outcome)
            elif epochs.get(p) != epoch:
                done(self._lost_in_flight())
            else:
                self.writes_confirmed += 1
                done(None)

        writer.submit_one(p, epoch, keys, task_id, record, answered)

    def _lost_in_flight(self) -> StoreError:
        # Dropped while its write was in flight (self-fenced: a frozen primary,
        # say, that answered once it woke, maybe after a failover that discards
        # what it took): nobody vouches for it.
        return StoreUnavailable(
            f"store {self.url}: write failed: a partition was lost while"
            " its write was in flight: outcome unknown"
        )

    def _report(
        self, done: LanesDone, writes: Sequence[PartitionWrite], outcome: FlushOutcome
    ) -> None:
        """``writes``' outcome (a flush's, or on a Cluster one primary's part of
        it) to ``done``, partition by partition."""
        if type(outcome.error) is TooFewReplicas:  # counted for the replica watch
            self.short_of_replicas += 1
        epochs = self.epochs
        if outcome.error is None and not outcome.fenced:  # the commonest: all written
            self.writes_confirmed += 1
            lost = self._lost_in_flight
            done(
                [
                    (w.partition, None if epochs.get(w.partition) == w.epoch else lost())
                    for w in writes
                ]
            )
            return
        error: StoreError | None = None
        if outcome.error is not None:
            # Named as RedisStore names it: the watch's outage line reads the same.
            kind = (
                type(outcome.error)
                if isinstance(outcome.error, StoreUnavailable)
                else StoreUnavailable
            )
            error = kind(f"store {self.url}: write failed: {outcome.error}")
        results: LaneOutcomes = []
        fenced: set[int] = set()
        holders: Holders = {}
        for w in writes:
            p = w.partition
            refused = outcome.fenced.get(p)
            if refused is not None:
                fenced.add(p)
                if refused.lease is not None:  # its time left unknown, as a round's
                    holders[p] = parse_holder(refused.lease, 0)
            elif error is not None:
                if isinstance(error, Unconfirmed) and p not in outcome.written:
                    # Not on the primary: only what its script wrote is kept.
                    results.append((p, StoreUnavailable(str(error))))
                else:
                    results.append((p, error))
            elif epochs.get(p) != w.epoch:
                results.append((p, self._lost_in_flight()))
            else:
                results.append((p, None))
        if fenced:
            # A partition dropped while its write was out, and acquired again
            # since (a new epoch), is not the coordinator's to drop now.
            epoch_of = {w.partition: w.epoch for w in writes}
            tell = {p for p in fenced if epochs.get(p, epoch_of[p]) == epoch_of[p]}
            results += self._refusals(fenced, holders, tell)
        done(results)

    def _holds(self, partition: int, epoch: int) -> bool:
        return self.epochs.get(partition) == epoch

    def _refuse(self, fenced: set[int], done: LanesDone) -> None:
        """Fail the lanes of ``fenced``, partitions this node no longer writes."""
        done(self._refusals(fenced, {}, fenced))

    def _refusals(self, fenced: set[int], holders: Holders, tell: set[int]) -> LaneOutcomes:
        """Each of ``fenced`` with its ``FencedWrite``; ``tell`` the coordinator
        of these, with the ``holders`` the store named."""
        if self.on_fenced is not None:
            self.on_fenced(tell, holders)
        return [
            (
                p,
                FencedWrite(
                    f"store {self.url}: partition {p} is no longer this node's:"
                    " the write was refused there",
                    {p},
                    set(),
                    holders,
                ),
            )
            for p in sorted(fenced)
        ]

    async def close(self) -> None:
        if self._state == "closed":
            return
        self._state = "closed"
        # Writes submitted before close() are finished (or fail) first.
        writer, self._writer = self._writer, None
        if writer is not None:
            with contextlib.suppress(Exception):
                await writer.drain()
            with contextlib.suppress(Exception):
                await writer.close()
        await self.topology.close()

    def warnings(self) -> list[str]:
        return list(self._warnings)
