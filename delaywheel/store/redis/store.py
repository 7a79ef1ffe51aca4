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

A write refused for a partition fails with ``FencedWrite``, which names the
fenced partitions and the ones written all the same (the flush's other
scripts ran): the journal rolls the batch back and answers ``moved``, and
``on_fenced`` (the owner's ``fenced``) tells the coordinator, which drops the fenced partitions and
reloads the written ones (its memory was rolled back over a durable write).
A batch holding a change of a partition not in ``epochs`` is refused whole,
before anything is written (see ``submit``).

On a Redis Cluster each partition's keys are in a slot of their own, so the
partitions spread over the primaries, and the writer keeps one link per
primary (fenced_cluster.py): a flush sends each primary one pipeline of
its partitions' scripts, all at once, and is done when all have answered.

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
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

from delaywheel.store.base import (
    DEFAULT_BATCH_SIZE,
    Changes,
    Done,
    Store,
    StoreConfigError,
    StoreError,
    StoreUnavailable,
    check_batch_size,
    redact_url,
)
from delaywheel.store.redis.client import Client, durability_warnings, replicas_warning
from delaywheel.store.redis.fenced import FencedWriter, FlushOutcome, PartitionWrite
from delaywheel.store.redis.fenced_cluster import ClusterFencedWriter
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
from delaywheel.store.redis.topology import Topology

DEFAULT_PREFIX = "delaywheel"
DEFAULT_CONNECT_TIMEOUT_S = 5.0
DEFAULT_TIMEOUT_S = 5.0

# How long a flush's WAIT waits for --replicas N confirmations before the
# change is answered unavailable. Replicas on a LAN confirm in milliseconds;
# a second rides out a busy replica or a short stall. The journal sends one
# flush at a time, so while replicas are missing every change waits this long.
REPLICAS_WAIT_S = 1.0

# (fenced partitions, partitions written in the same flush, the holders the
# refusals named, by partition)
OnFenced = Callable[[set[int], set[int], Holders], None]


class FencedWrite(StoreError):
    """A flush refused for some partitions: their owner moved on. Its requests
    are answered ``moved`` (``reply_code``), with the first fenced partition
    and, when the refusal named it, that partition's new owner and epoch."""

    reply_code = "moved"

    def __init__(
        self, message: str, fenced: set[int], written: set[int], holders: Holders | None = None
    ) -> None:
        super().__init__(message)
        self.fenced = fenced
        self.written = written
        first = min(fenced)
        holder = (holders or {}).get(first)
        self.reply_data: dict[str, Any] = {
            "partition": first,
            "owner": None if holder is None else holder.address,
            "epoch": None if holder is None else holder.epoch,
        }


def topology_for(url: str, **options: Any) -> Topology:
    """The topology of a store URL (``options``: Topology's): Sentinel's for
    ``redis+sentinel://``, else one Redis until ``open`` finds a Cluster."""
    if url.lower().startswith("redis+sentinel://"):
        return SentinelTopology(url, **options)
    return Topology(url, **options)


class RedisStore(Store):
    inline = False

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
        self.replicas = replicas
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
        self._writer: FencedWriter | ClusterFencedWriter | None = None
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

    def submit(self, changes: Changes, done: Done) -> None:
        error = self._not_open("write")
        writer = self._writer
        if error is not None or writer is None:
            done(error or StoreUnavailable(f"store {self.url}: write failed: not open"))
            return
        if not changes:
            done(None)
            return
        partitions, epochs, keys = self.partitions, self.epochs, self._keys
        if len(changes) == 1:  # one request's change (one call at a time): no grouping
            ((task_id, record),) = changes.items()
            self._submit_one(task_id, record, done)
            return
        writes: list[PartitionWrite] = []
        unowned: set[int] = set()
        by_partition: dict[int, dict[str, bytes | None]] = {}
        for task_id, record in changes.items():
            p = partition_of(task_id, partitions)
            part = by_partition.get(p)
            if part is None:
                part = by_partition[p] = {}
            part[task_id] = record
        for p, part in by_partition.items():
            if p in epochs:
                writes.append(PartitionWrite(p, epochs[p], *keys[p], part))
            else:
                unowned.add(p)
        if unowned:
            # Changes of partitions this node dropped (self-fenced, lost) while
            # they gathered: nothing of the batch is written. Had the owned
            # partitions' share been written, the rolled-back batch would make
            # the coordinator reload them, and an attempt journaled as
            # delivering there would wait out its deadline (the HTTP timeout)
            # before it is sent; rolled back unwritten, it fires at the next
            # tick. Their requests are answered moved and retried.
            self._refuse(unowned, set(), done)
            return
        writer.submit(writes, self._finisher(writes, done))

    def _submit_one(self, task_id: str, record: bytes | None, done: Done) -> None:
        """``submit`` of one change: no grouping, no list of writes, and on a plain
        Redis or Sentinel no outcome made when it is written (the commonest)."""
        p = partition_of(task_id, self.partitions)
        epoch = self.epochs.get(p)
        if epoch is None:
            self._refuse({p}, set(), done)
            return
        writer = self._writer
        if type(writer) is not FencedWriter:  # a Cluster's writer
            writes = [PartitionWrite(p, epoch, *self._keys[p], {task_id: record})]
            cast(ClusterFencedWriter, writer).submit(writes, self._finisher(writes, done))
            return
        epochs, keys = self.epochs, self._keys[p]

        def answered(outcome: FlushOutcome | None) -> None:
            if outcome is not None:  # not written: made only now, for the rare answers
                writes = [PartitionWrite(p, epoch, *keys, {task_id: record})]
                self._finisher(writes, done)(outcome)
            elif epochs.get(p) != epoch:
                done(self._lost_in_flight())
            else:
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

    def _finisher(self, writes: list[PartitionWrite], done: Done) -> Callable[[FlushOutcome], None]:
        """The callback of ``writes``' fenced flush: its outcome to ``done``."""
        epochs = self.epochs

        def finished(outcome: FlushOutcome) -> None:
            if outcome.error is not None:
                # Named as RedisStore names it: the watch's outage line reads the same.
                kind = (
                    type(outcome.error)
                    if isinstance(outcome.error, StoreUnavailable)
                    else StoreUnavailable
                )
                done(kind(f"store {self.url}: write failed: {outcome.error}"))
                return
            if not outcome.fenced:  # the commonest: all written
                if any(epochs.get(w.partition) != w.epoch for w in writes):
                    done(self._lost_in_flight())
                    return
                done(None)
                return
            # A partition dropped while its write was out, and acquired again
            # since (a new epoch), is not the coordinator's to drop now.
            epoch_of = {write.partition: write.epoch for write in writes}
            fenced = set(outcome.fenced)
            holders = {
                p: parse_holder(refused.lease, 0)  # its time left unknown, as a round's
                for p, refused in outcome.fenced.items()
                if refused.lease is not None
            }
            self._refuse(
                fenced,
                set(outcome.written),
                done,
                tell={p for p in fenced if self.epochs.get(p, epoch_of[p]) == epoch_of[p]},
                holders=holders,
            )

        return finished

    def _holds(self, partition: int, epoch: int) -> bool:
        return self.epochs.get(partition) == epoch

    def _refuse(
        self,
        fenced: set[int],
        written: set[int],
        done: Done,
        *,
        tell: set[int] | None = None,
        holders: Holders | None = None,
    ) -> None:
        """Fail a batch ``FencedWrite``; ``tell`` the coordinator of these (all by
        default), with the ``holders`` the store named."""
        holders = holders or {}
        if self.on_fenced is not None:
            self.on_fenced(fenced if tell is None else tell, written, holders)
        done(
            FencedWrite(
                f"store {self.url}: partition(s) {sorted(fenced)} are no longer"
                " this node's: the write was refused there",
                fenced,
                written,
                holders,
            )
        )

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
