"""The seats of a topic's concurrency, handed between the nodes through Redis.

A topic's ``concurrency`` C is split between the nodes serving partitions in
whole seats (engine/shares.py). With C below the number N of those nodes no
split gives every node a seat, and a node with none would hold the topic's
tasks until the partitions moved. So such a topic's seats are claimed in
Redis instead: a hash per topic, ``{<prefix>}:seats:<topic>`` (node ->
seats held, seats wanted, since when it waits), in the slot of the members
zset it is checked against, changed only by one script, which

1. drops the entries of nodes no longer live in the members (a dead node's
   seats come back once its registration expires, within a lease),
2. grants the caller min(what it claims, C - the others' seats): the seats
   held never add up to more than C. A node that waited longer than the
   caller has the seats it waits for kept for it: the caller may keep or
   lower its claim, not grow into those,
3. lets a node lower its claim (to 0: its entry goes), and
4. tells the caller how many seats the others wait for beyond those free.

Every coordinator round (``period_s``), for each such topic, a node with
tasks of it, or an entry for it, calls the script once (the topics' calls
at once). It claims what it can use (in flight, and ready or due deliveries
behind the gate, up to C), and its gate lets through only the seats it
holds. It never claims fewer than it has in flight, and lowers its gate
before the call, so no task starts while the claim is being lowered: the
sum of what the nodes have in flight stays within C. When the last reply
said others wait, a node that holds seats gives one back: its gate lets no
new task start, and at the first round its tasks in flight are below its
remaining seats it lowers its claim. It had its seat since its last round
at least, so a busy node takes its turn and passes the seat on, and the one
that waited longest gets it at its next round: a seat changes hands within
about two rounds of the task that held it ending. A node with no tasks of
the topic makes no call, and the topics split in whole seats (C >= N), and
a single node, none at all.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol

from delaywheel.store.redis.client import Client
from delaywheel.store.redis.layout import Layout
from delaywheel.store.redis.scripts import Arg, NodeScripts, Script

# KEYS: the members zset, the topic's seats hash. ARGV: this node, C, the
# seats it claims, the seats it wants (claimed, or waited for), the hash's
# time to live in ms. Returns {seats granted, seats the others wait for
# beyond those free}.
_CLAIM = Script(
    """
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local me, total = ARGV[1], tonumber(ARGV[2])
local claim, wanted = tonumber(ARGV[3]), tonumber(ARGV[4])
local function live(node)
  local expires = redis.call('ZSCORE', KEYS[1], node)
  return expires and tonumber(expires) > now_ms
end
local others, mine, since = 0, 0, now_ms
local waits = {}
local entries = redis.call('HGETALL', KEYS[2])
for i = 1, #entries, 2 do
  local node = entries[i]
  local held, want, from = string.match(entries[i + 1], '^(%d+) (%d+) (%d+)$')
  if node == me then
    if held then
      mine = tonumber(held)
      if tonumber(want) > mine then since = tonumber(from) end
    end
  elseif held == nil or not live(node) then
    redis.call('HDEL', KEYS[2], node)
  else
    others = others + tonumber(held)
    if tonumber(want) > tonumber(held) then
      waits[#waits + 1] = {tonumber(from), node, tonumber(want) - tonumber(held)}
    end
  end
end
local free = math.max(0, total - others)
local kept_for_others = 0
for _, w in ipairs(waits) do
  if w[1] < since or (w[1] == since and w[2] < me) then
    kept_for_others = kept_for_others + w[3]
  end
end
local limit = free - kept_for_others
if limit < mine then
  limit = math.min(mine, free)
end
local grant = math.max(0, math.min(claim, limit))
if not live(me) then  -- the others would drop its entry: none is kept
  grant, wanted = 0, 0
end
wanted = math.max(wanted, grant)
if wanted == 0 then
  redis.call('HDEL', KEYS[2], me)
else
  if wanted == grant then
    since = now_ms
  end
  redis.call('HSET', KEYS[2], me, string.format('%d %d %d', grant, wanted, since))
  redis.call('PEXPIRE', KEYS[2], ARGV[5])
end
local short = 0
for _, w in ipairs(waits) do
  short = short + w[3]
end
return {grant, math.max(0, short - (free - grant))}
"""
)


class SeatHost(Protocol):
    """What the seats ask of the engine (engine/engine.py keeps it)."""

    def handed_topics(self) -> dict[str, int]:
        """The topics whose concurrency is handed between the nodes, with it."""
        ...

    def seat_use(self, topic: str) -> tuple[int, int]:
        """``topic``'s tasks in flight here, and those waiting for a seat."""
        ...

    def hold_seats(self, topic: str, seats: int) -> None:
        """Let ``seats`` of ``topic``'s tasks be in flight here."""
        ...


@dataclass(frozen=True, slots=True)
class Claim:
    """This node's entry for a topic, as the script answered last."""

    seats: int  # granted
    short: int  # seats the other nodes waited for beyond those free


NO_CLAIM = Claim(0, 0)


class Seats(NodeScripts):
    """This node's claims on the seats of the topics whose concurrency is handed."""

    SCRIPTS = (_CLAIM,)

    def __init__(
        self,
        client: Client,
        layout: Layout,
        node: str,
        address: str,
        host: SeatHost,
        lease_s: float,
    ) -> None:
        super().__init__(client, layout, node, address)
        self.host = host
        # A hash no node calls on for this long goes: longer than a registration.
        self.ttl_ms = round(3 * lease_s * 1000)
        # A call is given this long, as the round's reads (a claim cut short
        # is answered by the next round; meanwhile only the seats sure are held).
        self.timeout_s = lease_s / 3
        self.claims: dict[str, Claim] = {}  # the topics this node has an entry for

    async def round(self) -> None:
        """One call per topic with tasks here or an entry (see the module docstring)."""
        handed = self.host.handed_topics()
        for topic in [topic for topic in self.claims if topic not in handed]:
            # Split in whole seats again, or no longer limited: the entry goes.
            self.host.hold_seats(topic, 0)
            await self.claim(topic, 0, 0, 0)
            del self.claims[topic]
        # All at once: each topic's turn touches only its own hash and gate, and
        # a round of many such topics then waits one round trip, not one each.
        turns = [self._turn(topic, total) for topic, total in handed.items()]
        for outcome in await asyncio.gather(*turns, return_exceptions=True):
            if isinstance(outcome, BaseException):
                raise outcome  # the round's caller logs it; the next round tries again

    async def _turn(self, topic: str, total: int) -> None:
        before = self.claims.get(topic, NO_CLAIM)
        in_flight, waiting = self.host.seat_use(topic)
        wanted = min(total, in_flight + waiting)
        if wanted == 0 and topic not in self.claims:
            return  # nothing held, nothing to ask for
        keep = wanted
        if before.short and before.seats:  # others wait: one seat back, no new task meanwhile
            keep = min(keep, before.seats - 1)
        # Lowered before the call, in the same step as in_flight was read: no
        # task starts while the claim is lowered, so it never goes below them.
        sure = min(keep, before.seats)
        self.host.hold_seats(topic, sure)
        # Until the reply, only what Redis holds whether or not the call lands
        # (a reply lost with the claim lowered must not leave more here).
        self.claims[topic] = Claim(sure, before.short)
        seats, short = await self.claim(topic, total, max(keep, in_flight), wanted)
        if seats == 0 and wanted == 0:
            self.claims.pop(topic, None)
        else:
            self.claims[topic] = Claim(seats, short)
        self.host.hold_seats(topic, min(keep, seats))

    async def claim(self, topic: str, total: int, seats: int, wanted: int) -> tuple[int, int]:
        """Claim ``seats`` of ``topic``'s ``total`` (wanting ``wanted``): the seats
        granted, and those the others wait for beyond the free ones."""
        keys = [self.layout.members, self.layout.seats(topic)]
        args: list[Arg] = [self.node, total, seats, wanted, self.ttl_ms]
        call = _CLAIM.run(self.client, keys, args)
        reply: list[Any] = await asyncio.wait_for(call, self.timeout_s)
        return int(reply[0]), int(reply[1])
