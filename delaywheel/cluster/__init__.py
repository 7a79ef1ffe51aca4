"""Several nodes on one keyspace: leases, membership, failover (issue 16).

- ``lease``: acquiring, renewing and releasing a partition's lease, and the
  keeper that renews them and self-fences a partition it may have lost.
- ``membership``: the live nodes (registered with expiries from Redis
  ``TIME``) and the rendezvous assignment of partitions over them.
- ``failover``: after a Sentinel failover, which partitions the node keeps.

The key layout, the lease value's reader and the fenced journal flush they
rely on are the Redis store's (``delaywheel.store.redis``).
"""
