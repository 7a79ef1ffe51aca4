"""Several nodes on one keyspace: partitions, leases, membership (issue 16).

- ``partitions``: which partition a task id is in, and the Redis key layout.
- ``lease``: acquiring, renewing and releasing a partition's lease, and the
  keeper that renews them and self-fences a partition it may have lost.
- ``membership``: the live nodes (registered with expiries from Redis
  ``TIME``) and the rendezvous assignment of partitions over them.

The engine is wired to these next; the fenced journal flush they rely on is
``delaywheel.store.fenced``.
"""
