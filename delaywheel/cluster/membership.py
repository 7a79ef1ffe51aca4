"""Which nodes are live, and which partitions each should own (balanced rendezvous).

Membership: a node registers in ``{<prefix>}:members`` (a zset of node ->
expiry in ms) and ``{<prefix>}:nodes`` (node -> address), and re-registers
well within its time to live. The expiry is computed inside the script from
Redis ``TIME``, never from the node's clock, so nodes whose clocks disagree
still agree on who is live. The same scripts drop the entries that expired.

Assignment: balanced and sticky rendezvous. Each (node, partition) pair has
a score, a hash (rendezvous hashing, highest random weight). Plain
rendezvous gives each partition to the live node of the highest score,
which is not balanced: with 16 partitions two nodes owned 5 and 11. Here
each of N live nodes owns ``P // N`` or ``P // N + 1`` (its quota), and
what already has a live owner stays with it where the quotas allow:

1. quotas: the ``P % N`` larger ones go to the nodes that own the most now
   (then by name);
2. each node keeps the partitions it owns now, up to its quota (those it
   scores highest);
3. the rest (free, a gone node's, or over a quota) go by score, highest
   pair first, to the nodes below their quota.

So when a node joins, only the partitions it takes move, its quota (the
fewest any balanced assignment moves), and they come from the nodes over
their new quota; when one leaves, only its own move. With no owners (a
keyspace's start) step 3 alone decides, by score. No coordinator: every
node computes the same plan from the same member list and lease map (read
each round), and the lease settles any race between two nodes that saw
them differently for a moment. Measured by tests/test_cluster_partitions.py
(balance for N = 1..8 with P = 16 and 64, moves of a join and of a leave).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from delaywheel.cluster._scripts import NodeScripts, Script, text

_REGISTER = Script(
    """
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_ms)
for _, node in ipairs(gone) do
  redis.call('ZREM', KEYS[1], node)
  redis.call('HDEL', KEYS[2], node)
end
local expires_ms = now_ms + tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], string.format('%d', expires_ms), ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
return {string.format('%d', now_ms), string.format('%d', expires_ms)}
"""
)
_LIVE = Script(
    """
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. string.format('%d', now_ms), '+inf')
local found = {}
for _, node in ipairs(live) do
  found[#found + 1] = node
  found[#found + 1] = redis.call('HGET', KEYS[2], node) or ''
end
return found
"""
)
_LEAVE = Script(
    """
redis.call('ZREM', KEYS[1], ARGV[1])
return redis.call('HDEL', KEYS[2], ARGV[1])
"""
)


@dataclass(frozen=True)
class Registration:
    now_ms: int  # Redis's clock when it registered
    expires_ms: int


class Membership(NodeScripts):
    """This node's registration, and the live members, on one redis-py client."""

    SCRIPTS = (_REGISTER, _LIVE, _LEAVE)

    async def register(self, ttl_ms: int) -> Registration:
        """Register (or stay registered) until Redis's ``TIME`` + ``ttl_ms``."""
        reply: list[Any] = await _REGISTER.run(
            self.client, self._keys(), [self.node, self.address, int(ttl_ms)]
        )
        return Registration(int(reply[0]), int(reply[1]))

    async def live(self) -> dict[str, str]:
        """node -> address of every member whose registration has not expired."""
        reply: list[Any] = await _LIVE.run(self.client, self._keys(), [])
        return {text(reply[i]): text(reply[i + 1]) for i in range(0, len(reply), 2)}

    async def leave(self) -> None:
        await _LEAVE.run(self.client, self._keys(), [self.node])

    def _keys(self) -> list[str]:
        return [self.layout.members, self.layout.nodes]


@lru_cache(maxsize=65_536)  # each round asks P x N of them: the same ones
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


def assignment(
    nodes: Collection[str], partitions: int, owners: Mapping[int, str | None] | None = None
) -> dict[int, str]:
    """partition -> its node over ``nodes`` (none: {}), balanced, keeping what
    ``owners`` (partition -> node, None: free) gives a node in ``nodes`` where
    the quotas allow (see the module docstring)."""
    names = sorted(set(nodes))
    if not names:
        return {}
    low, extra = divmod(partitions, len(names))
    current = {p: node for p, node in (owners or {}).items() if node in names}
    owned = Counter(current.values())
    by_owned = sorted(names, key=lambda node: (-owned[node], node))
    quota = {node: low + (i < extra) for i, node in enumerate(by_owned)}
    placed: dict[int, str] = {}
    load = dict.fromkeys(names, 0)
    for node in names:
        mine = [p for p, owner in current.items() if owner == node]
        mine.sort(key=lambda p: (weight(node, p), p), reverse=True)
        for p in mine[: quota[node]]:
            placed[p] = node
        load[node] = min(len(mine), quota[node])
    pairs = sorted(
        (weight(node, p), node, p) for node in names for p in range(partitions) if p not in placed
    )
    for _, node, p in reversed(pairs):  # the highest score first
        if p not in placed and load[node] < quota[node]:
            placed[p] = node
            load[node] += 1
    return placed


@dataclass(frozen=True)
class Plan:
    claim: frozenset[int]  # free, and assigned to this node: acquire them
    hand_back: frozenset[int]  # held, but assigned to another live, registered node


def plan(
    node: str,
    live: Collection[str],
    partitions: int,
    owners: Mapping[int, str | None],
    held: Collection[int] = (),
) -> Plan:
    """What ``node`` should claim and hand back.

    ``live`` is the registered members (``Membership.live()``); this node
    counts as live whatever its registration says, so a node whose own
    registration lapsed keeps what it holds rather than hand it to nobody.
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
    assigned = assignment(members, partitions, owners)
    claim, hand_back = set(), set()
    for p in range(partitions):
        to = assigned[p]
        owner = owners.get(p)
        if owner is None and to == node and p not in held:
            claim.add(p)
        elif owner == node and to != node:
            hand_back.add(p)
    return Plan(frozenset(claim), frozenset(hand_back))
