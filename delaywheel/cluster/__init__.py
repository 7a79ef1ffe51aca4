"""The Redis side of a keyspace several nodes share (issue 16).

- ``partitions``: which partition a task id is in, and the Redis key layout.
- ``holder``: the lease key's value read as its holder.
- ``keyspace``: the store the server runs on Redis, one fenced flush per partition.
- ``migrate``, ``spread``: the single-node hash and the old layout moved into partitions.

Leases, membership and the coordinator are ``delaywheel.ha``; the fenced
journal flush is ``delaywheel.store.fenced``.
"""
