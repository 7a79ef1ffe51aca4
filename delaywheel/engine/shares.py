"""A node's share of a topic's limits, when several nodes serve the topic's tasks.

A topic's tasks are spread over the partitions by their ids, so each node
holds about its partitions' share of them, and each node applies its share
of the topic's limits to its own tasks (docs/ha.md, "Topic settings on
several nodes"). Of P partitions, a node serving k of them gets:

- ``rate`` * k / P: the nodes' rates add up to at most the topic's, since a
  partition is served by one node at a time and each node counts only what
  it serves itself (its own k is the partitions it serves now);
- ``concurrency``, in whole tasks: seats split by the largest remainder of
  ``concurrency`` * k / P over every node serving some partitions, their sum
  at most the topic's. Where the limit is at least the number of those
  nodes, each has at least one (taken from the node with the most); where
  it is smaller (``handed``), no split gives every node a seat, so the
  seats are handed between the nodes through Redis instead (ha/seats.py)
  and the gate holds the seats this node has now;
- ``burst``, split in the same way, but each such node has at least one: a
  bucket smaller than one task lets nothing out. The sum is ``burst`` or the
  number of nodes, whichever is more;
- a pause as it is: every node holds the topic.

The seats need the other nodes' counts: they come from the partition map
this node read last (the leases), so every node that read the same map
splits the same way. Ties go by a hash of the topic and the node's name, so
that the topics' odd seats fall on different nodes. A single node (one
partition of one) gets the settings unchanged.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from delaywheel.engine.topics import TopicSettings


@dataclass(frozen=True, slots=True)
class Basis:
    """The partitions served by each node, as this node knows them."""

    node: str  # this node's name ("" for a single node)
    partitions: int  # P
    counts: tuple[tuple[str, int], ...]  # (node, partitions it serves), by name; this node's too

    @property
    def mine(self) -> int:
        return dict(self.counts).get(self.node, 0)

    @property
    def whole(self) -> bool:
        """This node serves every partition: its shares are the whole limits."""
        return self.mine == self.partitions


ALONE = Basis("", 1, (("", 1),))


@dataclass(frozen=True, slots=True)
class Gate:
    """What this node applies to a topic: its settings' pause, its share of the limits."""

    paused_until: float | None
    rate: float | None  # tasks a second; 0: none here
    burst: int
    concurrency: int | None  # 0: none here

    def paused(self, now_s: float) -> bool:
        return self.paused_until is not None and now_s < self.paused_until

    def to_map(self) -> dict[str, float | int | None]:
        return {
            "paused_until": self.paused_until,
            "rate": self.rate,
            "burst": self.burst,
            "concurrency": self.concurrency,
        }


def gate_of(topic: str, settings: TopicSettings, basis: Basis, seats_held: int = 0) -> Gate:
    """This node's gate for ``topic`` under ``settings``, given who serves what;
    ``seats_held``: the seats this node holds now of a concurrency ``handed``
    between the nodes."""
    if basis.whole:
        return Gate(settings.paused_until, settings.rate, settings.bucket, settings.concurrency)
    mine = basis.mine
    rate = None if settings.rate is None else settings.rate * mine / basis.partitions
    burst = seats(topic, settings.bucket, basis, at_least_one=True).get(basis.node, 0)
    concurrency = None
    if handed(settings, basis):
        concurrency = seats_held
    elif settings.concurrency is not None:
        concurrency = seats(topic, settings.concurrency, basis).get(basis.node, 0)
    return Gate(settings.paused_until, rate, max(burst, 1), concurrency)


def handed(settings: TopicSettings, basis: Basis) -> bool:
    """Whether the topic's concurrency is below the number of nodes serving
    partitions: its seats are handed between them (ha/seats.py), not split."""
    if settings.concurrency is None or basis.whole:
        return False
    return settings.concurrency < sum(1 for _, k in basis.counts if k > 0)


def seats(topic: str, total: int, basis: Basis, *, at_least_one: bool = False) -> dict[str, int]:
    """``total`` split over the nodes serving some partitions, in proportion to
    how many (see the module docstring); nodes serving none are left out."""
    serving = [(node, k) for node, k in basis.counts if k > 0]
    if not serving:
        return {}
    partitions = basis.partitions
    owned = sum(k for _, k in serving)
    # Whole seats first, then the ones left by the largest remainders.
    given = {node: total * k // partitions for node, k in serving}
    left = total * owned // partitions - sum(given.values())

    def by_remainder(pair: tuple[str, int]) -> tuple[int, int]:
        return total * pair[1] % partitions, _rank(topic, pair[0])

    for node, _ in sorted(serving, key=by_remainder, reverse=True)[:left]:
        given[node] += 1
    if sum(given.values()) >= len(given):
        # Each node at least one, from the node with the most (the lowest ranked of those).
        for node, _ in sorted(serving, key=lambda pair: _rank(topic, pair[0]), reverse=True):
            if given[node] == 0:
                richest = max(given, key=lambda name: (given[name], -_rank(topic, name)))
                given[richest] -= 1
                given[node] = 1
    elif at_least_one:  # fewer than the nodes: one each, more than the total
        given = dict.fromkeys(given, 1)
    return given


def _rank(topic: str, node: str) -> int:
    """A tie-breaker of ``node`` for ``topic``, the same on every node."""
    digest = hashlib.blake2b(f"{topic}/{node}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")
