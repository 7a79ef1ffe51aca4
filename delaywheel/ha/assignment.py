"""Which partitions each live node should own: balanced, moving the fewest.

Every (node, partition) pair has a rendezvous score, a hash (``weight``).
Plain rendezvous gives each partition to the live node of the highest
score, which is not balanced: with 16 partitions two nodes owned 5 and 11.
Here each of N live nodes owns ``P // N`` or ``P // N + 1``.

``rebalance(previous, nodes)`` is what a node computes when the members
change, from the assignment every node follows now (the record in Redis,
ha/membership.py). It moves the fewest partitions any balanced assignment
can move from ``previous``:

1. The ``P % N`` larger shares go first to the nodes that own more than
   ``P // N`` now (by score, when there are more of them than shares): each
   such node keeps one partition more than it could otherwise.
2. Each node keeps what it owns, up to its share: the partitions it scores
   highest.
3. The rest (a gone node's, a node's beyond its share) go to the nodes
   below their share, the pairs taken highest score first: a partition goes
   to the node of its pair unless it is placed already or the node is full
   (at ``P // N + 1``, or at ``P // N`` once the larger shares are all
   taken: which nodes take the ones left of step 1 is the scores' choice).

A node keeps ``min(owned, share)``, and step 1 makes the sum of those the
largest any choice of shares allows, so no balanced assignment moves fewer.
A join moves the joiner's share, taken from the nodes that own the most; a
leave moves the leaver's partitions and nothing else. From nothing
(``assignment(nodes)``, a keyspace's first record) step 3 alone decides: a
function of the member list alone, which every node computes alike.

``plan`` turns the assignment followed and the lease map into what this
node claims and hands back.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache

# The pseudo-partition whose scores order the nodes for the larger shares.
_SHARE_ORDER = -1


@lru_cache(maxsize=65_536)  # a rebalance asks P x N of them: the same ones
def weight(node: str, partition: int) -> int:
    """The rendezvous score of ``node`` for ``partition``: 64 bits of BLAKE2b.

    (Not CRC-32: its linearity makes the scores of one partition correlate
    across node names, which skews the balance.)
    """
    digest = hashlib.blake2b(f"{partition}/{node}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def ranking(partition: int, nodes: Iterable[str]) -> list[str]:
    """``nodes`` best first for ``partition`` (ties, unlikely, by name)."""
    return sorted(nodes, key=lambda node: (weight(node, partition), node), reverse=True)


def first_choice(partition: int, nodes: Iterable[str]) -> str | None:
    """The node that ranks ``partition`` first; None when there are no nodes."""
    return max(nodes, key=lambda node: (weight(node, partition), node), default=None)


def assignment(nodes: Collection[str], partitions: int) -> dict[int, str]:
    """partition -> its node over ``nodes`` (none: {}), balanced, from nothing."""
    return rebalance({}, nodes, partitions)


def is_balanced(owners: Mapping[int, str], nodes: Collection[str], partitions: int) -> bool:
    """Every partition owned by one of ``nodes``, each owning P // N or P // N + 1."""
    names = set(nodes)
    if not names or sorted(owners) != list(range(partitions)):
        return False
    loads = dict.fromkeys(names, 0)
    for node in owners.values():
        if node not in loads:
            return False
        loads[node] += 1
    low = partitions // len(names)
    return all(low <= load <= low + 1 for load in loads.values())


def rebalance(
    previous: Mapping[int, str], nodes: Collection[str], partitions: int
) -> dict[int, str]:
    """partition -> its node over ``nodes`` (none: {}), balanced, moving the fewest
    from ``previous`` (partition -> node; any of them, any node: see the module
    docstring). ``previous`` itself when it is balanced over ``nodes`` already."""
    names = sorted(set(nodes))
    if not names:
        return {}
    if is_balanced(previous, names, partitions):
        return dict(previous)
    low, extra = divmod(partitions, len(names))
    owned: dict[str, list[int]] = {node: [] for node in names}
    free: list[int] = []
    for p in range(partitions):
        owner = previous.get(p)
        if owner in owned:
            owned[owner].append(p)
        else:  # free, or a gone node's
            free.append(p)
    # Step 1: the larger shares to nodes that would give up a partition without one.
    over = [node for node in names if len(owned[node]) > low]
    over.sort(key=lambda node: (weight(node, _SHARE_ORDER), node), reverse=True)
    larger = set(over[:extra])
    # Step 2: each keeps its best, up to its share.
    placed: dict[int, str] = {}
    loads: dict[str, int] = {}
    for node in names:
        share = low + (node in larger)
        mine = sorted(owned[node], key=lambda p: (weight(node, p), p), reverse=True)
        for p in mine[:share]:
            placed[p] = node
        free += mine[share:]
        loads[node] = min(len(mine), share)
    # Step 3: the rest by score, highest pair first.
    larger_left = extra - len(larger)

    def full(node: str) -> bool:
        return loads[node] > low or (loads[node] == low and not larger_left)

    pairs = sorted((weight(node, p), node, p) for node in names if not full(node) for p in free)
    for _, node, p in reversed(pairs):
        if p in placed or full(node):
            continue
        if loads[node] == low:  # its low + 1st: one fewer node may own that many
            larger_left -= 1
        placed[p] = node
        loads[node] += 1
        if len(placed) == partitions:
            break
    return placed


def moved(before: Mapping[int, str], after: Mapping[int, str]) -> int:
    """Partitions whose node differs between two assignments."""
    return sum(before.get(p) != node for p, node in after.items())


@dataclass(frozen=True)
class Plan:
    claim: frozenset[int]  # free, and assigned to this node: acquire them
    hand_back: frozenset[int]  # held, but assigned to another live, registered node


def plan(
    node: str,
    live: Collection[str],
    assigned: Mapping[int, str],
    owners: Mapping[int, str | None],
    held: Collection[int] = (),
) -> Plan:
    """What ``node`` should claim and hand back, by the assignment it follows.

    ``live`` is the registered members (``Membership.look``); this node
    counts as live whatever its registration says, so a node whose own
    registration lapsed keeps what it holds rather than hand it to nobody.
    ``assigned`` is partition -> node (the record followed, ha/membership.py).
    ``owners`` says who holds each partition's lease (absent or None: free).
    A held partition is handed back only to a node in ``live``: a node that
    is not registered (not started yet, or expired) is never waited for.
    ``held`` is what this node holds and serves now: never claimed again,
    even when its lease key is gone (deleted, or lost by Redis). Claiming it
    would load its tasks a second time beside the ones served, and fire
    each twice; the keeper's next renewal finds the lease gone and drops
    the partition, and the round after that claims it with a new epoch.
    """
    members = set(live) | {node}
    claim, hand_back = set(), set()
    for p, to in assigned.items():
        owner = owners.get(p)
        if owner is None and to == node and p not in held:
            claim.add(p)
        elif owner == node and to != node and to in members:
            hand_back.add(p)
    return Plan(frozenset(claim), frozenset(hand_back))
