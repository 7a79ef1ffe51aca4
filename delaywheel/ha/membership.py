"""Which nodes are live, and the assignment record every node follows.

Membership: a node registers in ``{<prefix>}:members`` (a zset of node ->
expiry in ms) and ``{<prefix>}:nodes`` (node -> address), and re-registers
well within its time to live. The expiry is computed inside the script from
Redis ``TIME``, never from the node's clock, so nodes whose clocks disagree
still agree on who is live. The same scripts drop the entries that expired.

The assignment record, ``{<prefix>}:assignment`` (a hash: ``version``,
``nodes``, ``owners``), says which node owns each partition. A balanced
assignment that moves few partitions at a join or a leave needs history:
no balanced function of the member list alone moves as few as plain
rendezvous (docs/ha.md, "Which node owns which partitions"). The history is
this record, not the lease map: with every lease key deleted (HA scenario
5), an assignment computed from the leases forgot who owned what, and the
nodes took partitions from each other while still serving them. The record
is another key, so each node takes back its own.

- ``look`` reads the live members and the record in one script, so a node
  never sees a record written for members it does not see yet; the record's
  body comes only when its version differs from the one the node has.
- ``propose`` writes a record only if the stored version is still the one
  the node read (compare-and-set), or there is none when it read none. A
  node whose round finds the record unbalanced over the live members (a
  join, a leave) proposes ``rebalance(record, live)`` (ha/assignment.py),
  the fewest moves balance allows, with the next generation. Nodes that saw
  the same change compute the same record; a loser gets the stored record
  in the same reply and follows it.
- With the record missing (deleted, or lost by Redis), each node goes on
  following its last copy and proposes it again; a node that never saw one
  (a new keyspace) proposes ``assignment(live)``, from the member list
  alone. The first write wins and the others follow it. (Falling back to
  the member list alone instead, with the record and every lease key
  deleted, a node claimed partitions whose holder had not yet found its
  lease gone, and both served them for a moment: tests/test_ha_assignment.py.)

A node stays registered by a loop of its own (``Presence``), not by the
coordinator's round: a round can wait seconds (a dead Cluster primary, a
first load of a million tasks), and with the registration in it the others
saw the node gone and took its partitions while it still served them.

The record says where partitions should go; the leases still decide who
serves one: a node claims only a free lease, and a holder hands back
(stops serving, then releases) before the next one acquires.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from delaywheel.cancelling import cancel_and_wait
from delaywheel.store.redis.scripts import NodeScripts, Script, text

log = logging.getLogger("delaywheel.cluster")

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
# The live members, and the record when its version is not ARGV[1]'s.
_LOOK = Script(
    """
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. string.format('%d', now_ms), '+inf')
local found = {}
for _, node in ipairs(live) do
  found[#found + 1] = node
  found[#found + 1] = redis.call('HGET', KEYS[2], node) or ''
end
local version = redis.call('HGET', KEYS[3], 'version')
if not version then
  return {found}
end
if version == ARGV[1] then
  return {found, version}
end
local record = redis.call('HMGET', KEYS[3], 'nodes', 'owners')
return {found, version, record[1] or '', record[2] or ''}
"""
)
# Write the record if the stored version is still ARGV[1] ('': none stored);
# else the stored one.
_PROPOSE = Script(
    """
local version = redis.call('HGET', KEYS[1], 'version') or ''
if version == ARGV[1] then
  redis.call('HSET', KEYS[1], 'version', ARGV[2], 'nodes', ARGV[3], 'owners', ARGV[4])
  return {1}
end
if version == '' then
  return {0}
end
local record = redis.call('HMGET', KEYS[1], 'nodes', 'owners')
return {0, version, record[1] or '', record[2] or ''}
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


@dataclass(frozen=True)
class Record:
    """The assignment every node follows, as stored: partition -> node."""

    version: str  # "<generation>:<random hex>", new at each write: what a write compares
    owners: dict[int, str]

    @classmethod
    def new(cls, generation: int, owners: Mapping[int, str]) -> Record:
        # The random part: two records of one generation (one lost by a Redis
        # failover, one written after it) never pass for each other.
        return cls(f"{generation}:{secrets.token_hex(4)}", dict(owners))

    @property
    def generation(self) -> int:
        head = self.version.partition(":")[0]
        return int(head) if head.isdigit() else 0

    def encode(self) -> tuple[str, str]:
        """``nodes`` (names, spaced) and ``owners`` (each partition's index into them)."""
        names = sorted(set(self.owners.values()))
        index = {node: i for i, node in enumerate(names)}
        owners = " ".join(str(index[self.owners[p]]) for p in sorted(self.owners))
        return " ".join(names), owners

    @classmethod
    def decode(cls, version: Any, nodes: Any, owners: Any, partitions: int) -> Record:
        """A stored record; one that is not P partitions' (written by hand, say)
        assigns nothing, so the next round writes a whole one over it."""
        names = text(nodes).split()
        found = text(owners).split()
        if len(found) != partitions or not all(i.isdigit() and int(i) < len(names) for i in found):
            return cls(text(version), {})
        return cls(text(version), {p: names[int(i)] for p, i in enumerate(found)})


@dataclass(frozen=True)
class Look:
    """One look at the group: the live members and the assignment record."""

    live: dict[str, str]  # node -> address
    version: str | None  # the record's; None: there is none
    record: Record | None  # None when there is none or its version is the one known


class Membership(NodeScripts):
    """This node's registration, the live members and the assignment record, on
    one redis-py client."""

    SCRIPTS = (_REGISTER, _LOOK, _LEAVE, _PROPOSE)

    async def register(self, ttl_ms: int) -> Registration:
        """Register (or stay registered) until Redis's ``TIME`` + ``ttl_ms``."""
        reply: list[Any] = await _REGISTER.run(
            self.client, self._keys(), [self.node, self.address, int(ttl_ms)]
        )
        return Registration(int(reply[0]), int(reply[1]))

    async def live(self) -> dict[str, str]:
        """node -> address of every member whose registration has not expired."""
        return (await self.look()).live

    async def look(self, known: str | None = None) -> Look:
        """The live members and the record; its body only when its version is not
        ``known``."""
        keys = [*self._keys(), self.layout.assignment]
        reply: list[Any] = await _LOOK.run(self.client, keys, [known or ""])
        found = reply[0]
        live = {text(found[i]): text(found[i + 1]) for i in range(0, len(found), 2)}
        if len(reply) == 1:
            return Look(live, None, None)
        if len(reply) == 2:
            return Look(live, text(reply[1]), None)
        return Look(live, text(reply[1]), self._record(reply[1:]))

    async def propose(self, read: str | None, record: Record) -> tuple[bool, Record | None]:
        """Write ``record`` if the stored version is still ``read`` (None: there is
        still none). (True, record) when written, else (False, the stored one or None)."""
        nodes, owners = record.encode()
        reply: list[Any] = await _PROPOSE.run(
            self.client, [self.layout.assignment], [read or "", record.version, nodes, owners]
        )
        if reply[0] == 1:
            return True, record
        if len(reply) == 1:
            return False, None
        return False, self._record(reply[1:])

    def _record(self, stored: list[Any]) -> Record:
        version, nodes, owners = stored
        return Record.decode(version, nodes, owners, self.layout.partitions)

    async def leave(self) -> None:
        await _LEAVE.run(self.client, self._keys(), [self.node])

    def _keys(self) -> list[str]:
        return [self.layout.members, self.layout.nodes]


class Presence:
    """Keeps this node registered: every ``period_s``, for ``lease_s`` from
    Redis's clock, each registration given ``period_s`` to answer."""

    def __init__(self, membership: Membership, lease_s: float, period_s: float) -> None:
        self.membership = membership
        self.ttl_ms = round(lease_s * 1000)
        self.period_s = period_s
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Register once (raising if Redis does not take it), then keep at it."""
        await self.membership.register(self.ttl_ms)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._keep())

    async def stop(self) -> None:
        """Stop registering; the registration lapses by itself, or ``leave`` ends it."""
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait({task})  # a registration in flight can swallow a cancel

    async def _keep(self) -> None:
        loop = asyncio.get_running_loop()
        # Until stop lets go of this task, whose one cancel may have been swallowed.
        while self._task is asyncio.current_task():
            started_s = loop.time()
            try:
                await asyncio.wait_for(self.membership.register(self.ttl_ms), self.period_s)
            except Exception as exc:  # Redis away: the registration lapses after lease_s
                log.debug("registration failed: %r", exc)
            await asyncio.sleep(max(0.0, started_s + self.period_s - loop.time()))
