"""The Redis store: ``redis://``, ``rediss://`` (TLS) and ``redis+sentinel://``.

One store, ``RedisStore`` (store.py), for plain Redis, a Redis Cluster and
Sentinel: what differs between them is its topology's (topology.py,
sentinel.py), asked, never tested for. Its modules:

- ``store``: the store: partitioned records, the fenced write path, open.
- ``owner``: what the store is given by whoever owns its partitions (the
  coordinator on a node; the store itself for one process alone).
- ``topology``, ``sentinel``: which connection serves a key, the primary
  and its changes, the writer each kind of Redis needs.
- ``layout``: the key names (partitions, epochs, leases, meta) and P.
- ``fenced``, ``fenced_cluster``: the epoch-checked flush, the only way the
  store writes; over ``link``, the write connection (hiredis on a plain
  ``asyncio.Protocol``: the per-request path).
- ``scan``: the one loader (HSCAN, UTF-8 checked, read ahead).
- ``migrate``, ``spread``: the moves of older layouts, at open (the
  single-node release's one hash is read there, and only there).
- ``client``: redis-py's clients and Redis's own settings; ``scripts``:
  redis-py scripts (leases, membership).

What "durable" means here: Redis acknowledged the write (the partition's
script, and WAIT with ``--replicas N``). Whether that survives a crash is
Redis's configuration, checked at open (``warnings()``):

- AOF on with ``appendfsync always``: nothing acknowledged is lost, even on a
  power cut.
- AOF on with ``appendfsync everysec`` (the usual setting): a crash of Redis
  alone loses nothing; a power cut or OS crash can lose up to about the last
  second of writes.
- AOF off: every write since the last RDB snapshot is lost on a Redis crash.
- An evicting ``maxmemory-policy`` can drop records at any time.
- Replication is asynchronous: a failover to a replica can lose the last
  writes acknowledged by the old primary (``--replicas N`` narrows that).

Bounded time: connects and replies time out (``connect_timeout_s``,
``timeout_s``, 5 s each), and writes in flight when the connection drops
are sent again, once, on a new connection (which covers a Redis restart
between writes; sending a fenced flush again is harmless: absolute puts and
removes, checked by the epoch). So a dead or silent Redis gives
``StoreUnavailable`` within about 2 x (connect_timeout_s + timeout_s) at
worst, and at once when nothing listens. The write connection reconnects
by itself on the next write once Redis is back: the store never needs
reopening. (On a node, the leases decide too: a partition whose lease could
not be renewed for 0.8 of its period is dropped, and taken again, loaded
from Redis, once Redis answers: docs/ha.md.)
"""

from __future__ import annotations

from delaywheel.store.redis.layout import DEFAULT_PARTITIONS, Holder
from delaywheel.store.redis.owner import Holders, Owner, SoleOwner
from delaywheel.store.redis.store import REPLICAS_WAIT_S, FencedWrite, RedisStore
from delaywheel.store.redis.topology import Topology

__all__ = [
    "DEFAULT_PARTITIONS",
    "REPLICAS_WAIT_S",
    "FencedWrite",
    "Holder",
    "Holders",
    "Owner",
    "RedisStore",
    "SoleOwner",
    "Topology",
]
