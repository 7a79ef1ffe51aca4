"""Which partitions this node serves, and the answer for a task in another.

With a shared Redis keyspace (store/redis/store.py) a task belongs to
partition ``crc32(id) % P`` (an occurrence ``s:{X}:{digits}`` hashes ``X``;
store/redis/layout.py), and the engine holds
and serves only the tasks of the partitions this node owns now. A request
naming a task of any other partition is answered ``moved`` with the owner
the store last showed, or ``tryagain`` while it has none. ``serving`` is
what requests see; the coordinator (ha/coordinator.py) fills it as it
acquires partitions (``serve``) and empties it first when it hands one back
or loses it (``unserve``). It is the engine's ``Ownership`` (ha/ownership.py)
on a node of several; a single-node store (memory, SQLite) gets
``WholeKeyspace`` instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from delaywheel_client.partitions import partition_of

from delaywheel.errors import RequestError

# How long a client should wait before asking again for a partition that has
# no owner: a takeover is a lease period at most, usually much less.
RETRY_AFTER_MS = 250


@dataclass
class Owner:
    node: str | None
    address: str | None
    epoch: int | None


class Sharing:
    def __init__(self, *, node: str, address: str, partitions: int, lease_s: float) -> None:
        self.node = node
        self.address = address
        self.partitions = partitions
        self.lease_s = lease_s
        # partition -> epoch, for requests: changed only by serve and unserve,
        # which keep owns_all (the engine's short cut, ha/ownership.py) true to it.
        self.serving: dict[int, int] = {}
        # partition -> epoch of the partitions being loaded (acquired, not yet
        # served): their deliveries carry it (``epoch_of``) from the first,
        # which may start while the load awaits the store.
        self.loading: dict[int, int] = {}
        # partition -> epoch of the partitions being handed back: served no
        # more, but an attempt of theirs that starts meanwhile (its write came
        # back during the handback's drain) carries it, not 0.
        self.leaving: dict[int, int] = {}
        self.owns_all = False
        # Who owns each partition, as the store showed at the coordinator's
        # last look (read by ``cluster`` and the ``moved`` answers).
        self.owners: dict[int, Owner] = {}

    def load(self, partition: int, epoch: int) -> None:
        """``partition`` is acquired under ``epoch`` and its tasks are about to
        be loaded: not served to requests yet, but what of it fires carries
        ``epoch``."""
        self.loading[partition] = epoch

    def serve(self, partition: int, epoch: int) -> None:
        """Serve ``partition`` from now on, under ``epoch`` (a partition gained)."""
        self.loading.pop(partition, None)
        self.serving[partition] = epoch
        self.owners[partition] = Owner(self.node, self.address, epoch)
        self.owns_all = len(self.serving) == self.partitions

    def unserve(self, partition: int) -> int | None:
        """Serve ``partition`` no more (handed back, lost, or its load given up);
        its epoch, if it was served."""
        self.loading.pop(partition, None)
        epoch = self.serving.pop(partition, None)
        self.owns_all = len(self.serving) == self.partitions
        return epoch

    def hand_back(self, partition: int) -> None:
        """``unserve`` for a handback: its epoch stays for its deliveries
        (``epoch_of``) until ``handed_back``."""
        epoch = self.unserve(partition)
        if epoch is not None:
            self.leaving[partition] = epoch

    def handed_back(self, partition: int) -> None:
        self.leaving.pop(partition, None)

    def partition_of(self, task_id: str) -> int:
        return partition_of(task_id, self.partitions)

    def partition_counts(self) -> dict[str, int]:
        """This node's partitions served now; the others' as the leases showed
        (a partition it let go of and still sees as its own counts for no one)."""
        counts = {self.node: len(self.serving)}
        serving = self.serving
        for partition, owner in self.owners.items():
            node = owner.node
            if node is not None and node != self.node and partition not in serving:
                counts[node] = counts.get(node, 0) + 1
        return counts

    def owns(self, task_id: str) -> bool:
        # Serving every partition (one node, the default), every id is ours: no
        # hash per add (docs/performance.md, "Measurements behind the code").
        return self.owns_all or partition_of(task_id, self.partitions) in self.serving

    def check(self, task_id: str) -> None:
        """Raise ``moved`` or ``tryagain`` unless this node serves ``task_id`` now."""
        if self.owns_all:  # as in owns
            return
        partition = partition_of(task_id, self.partitions)
        if partition not in self.serving:
            raise self.elsewhere(partition, task_id)

    def new_id(self, first: str, more: Callable[[], str]) -> str:
        """A server-made id in a partition this node serves (P / served tries on average)."""
        serving, partitions = self.serving, self.partitions
        if partition_of(first, partitions) in serving:
            return first
        if not serving:
            raise self.none_served()
        while True:
            task_id = more()
            if partition_of(task_id, partitions) in serving:
                return task_id

    def epoch_of(self, task_id: str) -> int:
        partition = partition_of(task_id, self.partitions)
        epoch = self.serving.get(partition)
        if epoch is None:
            return self.loading.get(partition) or self.leaving.get(partition, 0)
        return epoch

    def elsewhere(self, partition: int, task_id: str | None = None) -> RequestError:
        owner = self.owners.get(partition)
        what = (
            f"task {task_id!r} is in partition {partition}" if task_id else f"partition {partition}"
        )
        if owner is not None and owner.node is not None and owner.node != self.node:
            return RequestError(
                "moved",
                f"{what}, owned by {owner.node} at {owner.address}",
                {"partition": partition, "owner": owner.address, "epoch": owner.epoch},
            )
        return RequestError(
            "tryagain",
            f"{what}, which no node serves just now (a takeover is under way)",
            {"partition": partition, "retry_after_ms": RETRY_AFTER_MS},
        )

    def none_served(self) -> RequestError:
        """``add`` without an id on a node that serves no partition."""
        return RequestError(
            "tryagain",
            f"node {self.node} serves no partition just now",
            {"partition": None, "retry_after_ms": RETRY_AFTER_MS},
        )

    def cluster_map(self, here: str = "") -> dict[str, Any]:
        """The ``cluster`` reply: every partition's owner as last seen (``here``,
        the listening address, is not needed: this node's is ``address``)."""
        owners = []
        for partition in range(self.partitions):
            owner = self.owners.get(partition)
            owners.append(
                {
                    "partition": partition,
                    "node": None if owner is None else owner.node,
                    "address": None if owner is None else owner.address,
                    "epoch": None if owner is None else owner.epoch,
                }
            )
        return {
            "node": self.node,
            "partitions": self.partitions,
            "lease_s": self.lease_s,
            "owners": owners,
        }

    def stats(self) -> list[dict[str, int]]:
        return [{"partition": p, "epoch": e} for p, e in sorted(self.serving.items())]
