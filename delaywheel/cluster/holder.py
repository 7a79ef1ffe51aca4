"""Who holds a partition's lease, read from the lease key's value.

The lease scripts (ha/lease.py) write ``"<epoch> <node> <address>"``; two
layers read it: the keyspace, to name the new holder when a flush is
refused (``moved`` to it), and the coordinator's round (the owner map).
The reader lives here, beside the key layout, so that the store's side
needs nothing of ``ha``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Holder:
    """Who holds a partition's lease, as the lease key says, and for how long still."""

    node: str
    address: str
    epoch: int
    ttl_ms: int


def parse_holder(value: str, ttl_ms: int) -> Holder:
    """A lease key's value, ``"<epoch> <node> <address>"``, as its holder."""
    epoch, _, rest = value.partition(" ")
    node, _, address = rest.partition(" ")
    return Holder(node, address, int(epoch) if epoch.isdigit() else 0, ttl_ms)
