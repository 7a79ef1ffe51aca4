"""This node's rights in a shared keyspace: the Redis store's ``Owner``.

The store needs its owner when it is built (store/redis/owner.py), before
the engine and the coordinator, which both need the store. So the owner is
built first and knows only what exists by then: the partitions this node
may write (``epochs``, which the coordinator fills as it acquires them) and
the ``Sharing`` that requests read. What the store reports is done here in
two parts:

- at once, inside the store's call: a partition whose write was refused is
  no longer written (out of ``epochs``) nor served (``Sharing.unserve``),
  and its new holder, when the refusing script named one, is shown to
  requests (answered ``moved`` to it, not ``tryagain``);
- the rest is news for the coordinator, which is given these rights when it
  is built and waits on its ``news()``: it forgets the leases, counts and logs the
  losses, and takes the partitions' tasks out of the engine (a loop turn
  later at least, after the journal rolled their lanes back), and after a
  new primary it reads the epochs again (ha/failover.py).

Until a coordinator waits on it, the news only gathers, and nothing is
written (``epochs`` is empty).
"""

from __future__ import annotations

import asyncio

from delaywheel.ha.sharing import Owner, Sharing
from delaywheel.store.redis import Holders

Address = tuple[str, int]


class NodeRights:
    def __init__(self, sharing: Sharing) -> None:
        self.epochs: dict[int, int] = {}
        self.sharing = sharing
        self._news = asyncio.Event()  # set when there are refusals or a primary to tell
        self._refused: list[set[int]] = []  # the partitions of each refusal
        self._failed_over_to: Address | None = None

    def fenced(self, fenced: set[int], holders: Holders) -> None:
        """The store's: a write was refused for ``fenced`` (see the module docstring)."""
        sharing = self.sharing
        for partition in fenced:
            sharing.unserve(partition)
            self.epochs.pop(partition, None)
            holder = holders.get(partition)
            if holder is not None:
                sharing.owners[partition] = Owner(holder.node, holder.address, holder.epoch)
        self._refused.append(set(fenced))
        self._news.set()

    def primary_changed(self, host: str, port: int) -> None:
        """The store's: the topology follows a new primary (Sentinel's failover)."""
        self._failed_over_to = (host, port)
        self._news.set()

    async def news(self) -> tuple[list[set[int]], Address | None]:
        """Once there is news: the refusals since the last call (oldest first,
        each a set of partitions), and the newest primary named, if any."""
        await self._news.wait()
        self._news.clear()
        refused, self._refused = self._refused, []
        address, self._failed_over_to = self._failed_over_to, None
        return refused, address
