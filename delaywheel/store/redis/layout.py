"""Partitions of a keyspace and where their keys live in Redis.

A keyspace has P partitions, fixed when it is first used. A task's partition
is ``zlib.crc32(task_id.encode("utf-8")) % P`` (``partition_of``, the
contract: clients in any language route by the same CRC-32, the one zlib,
PNG and Ethernet use, unsigned), except that an occurrence of a schedule,
``s:{X}:{digits}``, hashes ``X`` (delaywheel_client/partitions.py, shared
with the clients).

The key layout extends the single-node release's store, whose one hash is
``{<prefix>}:tasks`` (read now only by migrate.py) (``--redis-prefix``, default
``delaywheel``). The braces are a Redis Cluster hash tag: a key's slot is
computed from the tag alone. Each partition gets a tag of its own, so all of
a partition's keys sit in one slot and every script over them is legal on
Redis Cluster, while the partitions spread over the cluster's primaries::

    {<prefix>}:meta            hash: "partitions" -> P, "layout" -> "spread" (at first use)
    {<prefix>}:members         zset: node -> expiry, ms on Redis's clock (membership.py)
    {<prefix>}:nodes           hash: node -> "host:port" it serves on
    {<prefix>}:assignment      hash: version, nodes, owners: which node owns each partition
    {<prefix>}:seats:<topic>   hash: node -> "<held> <wanted> <waiting since, ms>", the
                               seats of a concurrency handed between the nodes (ha/seats.py)
    {<prefix>}:tasks           the single-node release's hash (migrated from)
    {<prefix>:p007}:tasks      hash: task id -> record, the tasks of partition 7
    {<prefix>:p007}:epoch      integer: bumped by every acquire (the fencing token)
    {<prefix>:p007}:lease      "<epoch> <node> <address>", with PX: the owner
    {<prefix>:p007}:topics     hash: topic -> settings record, the copy its owner
                               publishes of the topic settings it holds (ha/topics.py)
    {<prefix>:p007}:far        hash: task id -> record, the partition's far tier
    {<prefix>:p007}:due        zset: task id -> due time, the far tier's time index
    {<prefix>:p007}:farcount   hash: topic -> far tasks (engine/horizon.py)

The partition number is written with at least three digits (``p007``,
``p1000``) so the keys sort in a listing. The lease's value is also the
owner map (the ``cluster`` method will read every lease key): there is no
separate owners hash to go stale, and a partition whose lease expired shows
no owner; ``parse_holder`` reads it (for the coordinator's rounds, the
store's ``moved`` answers, the layout's moves), the lease scripts
(ha/lease.py) write it. The keyspace's own keys stay under
``{<prefix>}``, beside the old hash, so a migration can check the meta key
and the old hash in one script. Scripts name every key through KEYS, never
build one from ARGV.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from delaywheel_client.partitions import partition_of

from delaywheel.store.redis.client import Client

DEFAULT_PARTITIONS = 16
# More partitions than Redis Cluster has slots would gain nothing, and each
# one costs its owner a lease renewal every L/3.
MAX_PARTITIONS = 16384


__all__ = ["partition_of"]  # re-exported: the rule's home is the client's module


class PartitionsError(ValueError):
    """A partition count or number out of range, or a prefix that breaks the tags."""


def check_partitions(partitions: int) -> int:
    if (
        isinstance(partitions, bool)
        or not isinstance(partitions, int)
        or not 1 <= partitions <= MAX_PARTITIONS
    ):
        raise PartitionsError(f"partitions {partitions!r}: must be an integer 1..{MAX_PARTITIONS}")
    return partitions


@dataclass(frozen=True)
class PartitionKeys:
    """The keys of one partition, all under one hash tag (one Cluster slot)."""

    partition: int
    tag: str

    @property
    def tasks(self) -> str:
        return f"{self.tag}:tasks"

    @property
    def epoch(self) -> str:
        return f"{self.tag}:epoch"

    @property
    def lease(self) -> str:
        return f"{self.tag}:lease"

    @property
    def topics(self) -> str:
        return f"{self.tag}:topics"

    @property
    def far(self) -> str:
        return f"{self.tag}:far"

    @property
    def due(self) -> str:
        return f"{self.tag}:due"

    @property
    def far_counts(self) -> str:
        return f"{self.tag}:farcount"


class Layout:
    """The key names of a keyspace of ``partitions`` under ``prefix``."""

    def __init__(self, prefix: str, partitions: int, *, single_slot: bool = False) -> None:
        if not prefix or "{" in prefix or "}" in prefix:
            raise PartitionsError(f"redis prefix {prefix!r}: must be non-empty, without braces")
        self.prefix = prefix
        self.partitions = check_partitions(partitions)
        self.meta = f"{{{prefix}}}:meta"
        self.members = f"{{{prefix}}}:members"
        self.nodes = f"{{{prefix}}}:nodes"
        self.assignment = f"{{{prefix}}}:assignment"
        self.single_node_tasks = f"{{{prefix}}}:tasks"
        # Every partition under the keyspace's own tag, in one slot: what the
        # previous release used on a Redis Cluster. Only read now, by the
        # move to the spread layout at first start (spread.py).
        self.single_slot = single_slot

    def seats(self, topic: str) -> str:
        """The claims on ``topic``'s seats: in the ``{<prefix>}`` slot, with the
        members they are checked against (a brace in the topic's name comes
        after the tag, which is the first pair: the slot stays the same)."""
        return f"{{{self.prefix}}}:seats:{topic}"

    def partition(self, partition: int) -> PartitionKeys:
        if not 0 <= partition < self.partitions:
            raise PartitionsError(
                f"partition {partition!r}: this keyspace has partitions 0..{self.partitions - 1}"
            )
        if self.single_slot:
            return PartitionKeys(partition, f"{{{self.prefix}}}:p{partition:03d}")
        return PartitionKeys(partition, f"{{{self.prefix}:p{partition:03d}}}")

    def of(self, task_id: str) -> PartitionKeys:
        return self.partition(partition_of(task_id, self.partitions))

    def __iter__(self) -> Iterator[PartitionKeys]:
        return (self.partition(p) for p in range(self.partitions))


@dataclass(frozen=True)
class Holder:
    """Who holds a partition's lease, as the lease key says, and for how long still."""

    node: str
    address: str
    epoch: int
    ttl_ms: int


def parse_holder(value: str, ttl_ms: int) -> Holder:
    """A lease key's value, ``"<epoch> <node> <address>"``, as its holder."""
    epoch, _, rest = value.partition(" ")
    node, _, address = rest.partition(" ")
    return Holder(node, address, int(epoch) if epoch.isdigit() else 0, ttl_ms)


async def record_partitions(client: Client, layout: Layout) -> None:
    """Record P in the meta key at first use; refuse a keyspace made with another P."""
    await client.hsetnx(layout.meta, "partitions", layout.partitions)
    stored = await client.hget(layout.meta, "partitions")
    if stored is None or int(stored) != layout.partitions:
        raise PartitionsError(
            f"keyspace {layout.prefix!r} has {_text(stored)} partitions (in {layout.meta}),"
            f" not {layout.partitions}: P is fixed when a keyspace is first used"
        )


def _text(value: bytes | str | None) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
