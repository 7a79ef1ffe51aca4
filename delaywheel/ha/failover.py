"""After a Sentinel failover: which owned partitions this node may still serve.

Replication is asynchronous, so the promoted replica may lack the last
writes of the old primary, an acquire's INCR of an epoch and SET of a lease
among them. On such a primary this node's epoch for a partition may be
ahead of the stored one, and the next acquire by another node would hand
out the very epoch this node holds: both would pass the flush's check. So
when the store follows Sentinel to a new primary (store/redis/sentinel.py), the
coordinator reads every owned partition's epoch and lease there again. A
partition is kept only when its epoch is the one this node holds and its
lease still holds this node's token for it; any other is dropped, and the
coordinator's next round acquires it anew (a new epoch). When the server
named is not a primary (yet another failover meanwhile), every partition is
dropped: nothing there can be trusted.
"""

from __future__ import annotations

from collections.abc import Callable

from delaywheel.store.redis.layout import Layout
from delaywheel.store.redis.scripts import text
from delaywheel.store.redis.topology import Topology


async def stale_partitions(
    store: Topology,
    address: tuple[str, int],
    layout: Layout,
    held: dict[int, int],
    token: Callable[[int], str],
) -> set[int]:
    """The partitions of ``held`` (partition -> epoch) not to serve any more, by
    what the primary at ``address`` holds; ``token(epoch)`` is this node's lease value."""
    order = sorted(held)
    keys = []
    for partition in order:
        keys += [layout.partition(partition).epoch, layout.partition(partition).lease]
    role, values = await store.read_on_primary(*address, keys)
    if role != "master":
        return set(held)
    stale = set()
    for i, partition in enumerate(order):
        epoch, lease = values[2 * i], values[2 * i + 1]
        ours = held[partition]
        if epoch is None or text(epoch) != str(ours) or lease is None or text(lease) != token(ours):
            stale.add(partition)
    return stale
