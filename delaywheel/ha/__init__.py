"""High availability: several nodes serving one shared Redis keyspace (docs/ha.md).

- ``sharing``: which partitions this node serves, and the ``moved`` or
  ``tryagain`` answer for a task of any other; the engine is given it.
- ``lease``: acquiring, renewing and releasing a partition's lease, and the
  keeper that renews them and self-fences a partition it may have lost.
- ``membership``: the live nodes (registered with expiries from Redis
  ``TIME``) and the assignment record in Redis that every node follows.
- ``assignment``: which partitions each live node should own, balanced,
  moving the fewest at a join or a leave; what a node claims and hands back.
- ``failover``: after a Sentinel failover, which partitions may still be served.
- ``topics``: the topic settings each owner publishes and every node reads.
- ``coordinator``: the node's rounds: claim, load, serve, hand back, drop.
- ``losses``: partitions dropped at once (a lease lost, a write refused, a
  failover), one log line per kind.

Below the engine: the coordinator asks of it only what ``host.Host``
names. The store's side (the partitions' keys, the fenced flush) is
``delaywheel.store.redis``.
"""
