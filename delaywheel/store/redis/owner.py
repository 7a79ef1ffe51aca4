"""What the Redis store is given by whoever owns its partitions, when it is built.

The store writes a partition only at the epoch its owner holds for it (the
fenced flush, fenced.py). The owner is the node's high-availability side
(the coordinator and its leases), which the store may not import: it hands
the store an ``Owner`` instead, a Protocol, so any object of that shape will
do:

- ``epochs``: partition -> the epoch this node may write it with. The store
  reads this very dict at every write (a partition not in it is refused
  without a round trip); the owner adds a partition when it acquires it and
  removes it when it loses or hands it back.
- ``fenced(fenced, holders)``: a write was refused for ``fenced`` (their
  epoch moved on: another node owns them, named in ``holders`` when the
  refusing script read a lease). Called before their lanes are answered;
  the flush's other partitions are written and answered on their own.
- ``primary_changed(host, port)``: the topology follows a new primary
  (Sentinel's failover): the epochs held may have been lost with the last
  writes of the old one.

With no owner (a tool, the bench, a test: one process alone on the
keyspace) the store is its own ``SoleOwner``: at open it takes every
partition at the epoch Redis holds for it, setting 0 where none was ever
held, and writes them all. It acquires no lease: a node that acquires a
partition afterwards bumps its epoch, and the sole owner's next write of it
is refused (``FencedWrite``), never written behind that node's back. Use it
on a keyspace no node serves.
"""

from __future__ import annotations

from typing import Protocol

from delaywheel.store.redis.layout import Holder

# The holders the refusing scripts named, by partition.
Holders = dict[int, Holder]


class Owner(Protocol):
    @property
    def epochs(self) -> dict[int, int]: ...

    def fenced(self, fenced: set[int], holders: Holders) -> None: ...

    def primary_changed(self, host: str, port: int) -> None: ...


class SoleOwner:
    """One process alone on the keyspace (see the module docstring)."""

    def __init__(self) -> None:
        self._epochs: dict[int, int] = {}  # filled by the store at open

    @property
    def epochs(self) -> dict[int, int]:
        return self._epochs

    def fenced(self, fenced: set[int], holders: Holders) -> None:
        """Nothing to drop: the write fails ``FencedWrite``, naming the partitions."""

    def primary_changed(self, host: str, port: int) -> None:
        """Nothing to re-read: the next write is fenced if an epoch was lost."""
