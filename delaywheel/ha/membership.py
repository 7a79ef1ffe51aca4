"""Which nodes are live, and which partitions each should own (balanced rendezvous).

Membership: a node registers in ``{<prefix>}:members`` (a zset of node ->
expiry in ms) and ``{<prefix>}:nodes`` (node -> address), and re-registers
well within its time to live. The expiry is computed inside the script from
Redis ``TIME``, never from the node's clock, so nodes whose clocks disagree
still agree on who is live. The same scripts drop the entries that expired.

Assignment: balanced rendezvous. Each (node, partition) pair has a score,
a hash (rendezvous hashing, highest random weight). Plain rendezvous gives
each partition to the live node of the highest score, which is not
balanced: with 16 partitions two nodes owned 5 and 11. Here each of N live
nodes owns ``P // N`` or ``P // N + 1``: the pairs are taken highest score
first, and a partition goes to the node of its pair unless it has one
already or the node is full (at ``P // N + 1``, or at ``P // N`` once
``P % N`` nodes have ``P // N + 1``: which nodes own one more is the
scores' choice, not the names'). A function of the member list alone, as
plain rendezvous is: every node computes the same assignment from the same
member list, even with no lease to read (every lease key deleted, or lost
by Redis), and the lease settles any race between two nodes that saw
different lists for a moment. Keeping partitions with their current owners
would move fewer, but the assignment would then depend on the lease map,
and with every lease key gone (HA scenario 5) the nodes took partitions
from each other while still serving them. The price of the balance is a
few moves more than plain rendezvous at a join or a leave, 6 % to 15 %
(docs/ha.md, "Which node owns which partitions": no balanced function of
the member list can match it).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from delaywheel.store.redis.scripts import NodeScripts, Script, text

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


def assignment(nodes: Collection[str], partitions: int) -> dict[int, str]:
    """partition -> its node over ``nodes`` (none: {}), balanced (see the module
    docstring)."""
    names = sorted(set(nodes))
    if not names:
        return {}
    low, larger = divmod(partitions, len(names))  # ``larger`` nodes own low + 1
    loads = dict.fromkeys(names, 0)
    pairs = sorted((weight(node, p), node, p) for node in names for p in range(partitions))
    placed: dict[int, str] = {}
    for _, node, p in reversed(pairs):  # the highest score first
        if p in placed or loads[node] > low or (loads[node] == low and not larger):
            continue
        if loads[node] == low:  # its low + 1st: one fewer node may own that many
            larger -= 1
        placed[p] = node
        loads[node] += 1
        if len(placed) == partitions:
            break
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
    assigned = assignment(members, partitions)
    claim, hand_back = set(), set()
    for p in range(partitions):
        to = assigned[p]
        owner = owners.get(p)
        if owner is None and to == node and p not in held:
            claim.add(p)
        elif owner == node and to != node:
            hand_back.add(p)
    return Plan(frozenset(claim), frozenset(hand_back))
