"""The store's owner on a node (delaywheel/ha/rights.py): what a refused write
or a new primary changes at once, and the news the coordinator waits on."""

from __future__ import annotations

import asyncio

from delaywheel.ha.rights import NodeRights
from delaywheel.ha.sharing import Owner, Sharing
from delaywheel.store.redis import Holder


def _node() -> NodeRights:
    sharing = Sharing(node="a", address="127.0.0.1:7001", partitions=4, lease_s=3.0)
    for partition in range(4):
        sharing.serve(partition, 7)
    rights = NodeRights(sharing)
    rights.epochs.update(dict.fromkeys(range(4), 7))
    return rights


def test_a_refused_partition_is_neither_written_nor_served_at_once() -> None:
    rights = _node()
    holder = Holder(node="b", address="127.0.0.1:7002", epoch=8, ttl_ms=0)
    rights.fenced({1, 2}, {2: holder})
    assert rights.epochs == {0: 7, 3: 7}
    assert set(rights.sharing.serving) == {0, 3} and not rights.sharing.owns_all
    assert rights.sharing.owners[2] == Owner("b", "127.0.0.1:7002", 8)
    assert rights.sharing.owners[1] == Owner("a", "127.0.0.1:7001", 7)  # no holder named


def test_the_news_gathers_until_taken() -> None:
    async def scenario() -> None:
        rights = _node()
        waiting = asyncio.get_running_loop().create_task(rights.news())
        await asyncio.sleep(0)
        assert not waiting.done()  # nothing to tell yet
        rights.fenced({1}, {})
        rights.primary_changed("10.0.0.1", 6379)
        rights.fenced({3}, {})
        rights.primary_changed("10.0.0.2", 6380)
        assert await asyncio.wait_for(waiting, 5.0) == ([{1}, {3}], ("10.0.0.2", 6380))
        later = asyncio.get_running_loop().create_task(rights.news())
        await asyncio.sleep(0)
        assert not later.done()  # all taken
        rights.fenced(set(), {})
        assert await asyncio.wait_for(later, 5.0) == ([set()], None)

    asyncio.run(scenario())
