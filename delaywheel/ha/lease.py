"""Partition leases, fenced by an epoch, and the keeper that renews them.

A partition's lease key (``{<prefix>:pNNN}:lease``, partitions.py) holds
``"<epoch> <node> <address>"`` with a PX expiry of L; its epoch key counts
the grants. All three operations are one script each, so nothing slips in
between the check and the change:

- acquire: if the lease is free, INCR the epoch and SET the lease PX L; the
  answer is the new epoch, or the holder and its time left.
- renew: extend only while the lease still holds exactly our value and the
  epoch key is still our epoch (compare-and-extend, never a bare PEXPIRE:
  rq#1531 and redbeat#127 extended a lock someone else had taken).
- release: delete only our own value (compare-and-delete).

A lease alone cannot stop an owner that paused past its expiry; the epoch
can, because every journal flush checks it at the store (store/redis/fenced.py).
The keeper adds the owner's own half: it renews every L/3 and, for each
partition, measures on the monotonic clock from the *send* of the last
renewal that succeeded. When 0.8 L passes with no newer success the
partition is self-fenced (``on_lost`` is called and the keeper forgets it)
even if Redis never answers: Redis expires the lease L after that send at
the earliest, so the owner stops 0.2 L before anyone else can start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

from delaywheel.cancelling import cancel_and_wait
from delaywheel.store.redis.layout import Holder, parse_holder
from delaywheel.store.redis.scripts import NodeScripts, Script, text

log = logging.getLogger("delaywheel.cluster")

# The fraction of L after a renewal's send at which its owner stops.
FENCE_AFTER = 0.8
# Renewals per lease period.
RENEWALS_PER_LEASE = 3

_ACQUIRE = Script(
    """
local held = redis.call('GET', KEYS[2])
if held then
  return {0, held, redis.call('PTTL', KEYS[2])}
end
local epoch = redis.call('INCR', KEYS[1])
redis.call('SET', KEYS[2], tostring(epoch) .. ' ' .. ARGV[1], 'PX', ARGV[2])
return {epoch}
"""
)
_RENEW = Script(
    """
if redis.call('GET', KEYS[2]) == ARGV[1] and redis.call('GET', KEYS[1]) == ARGV[2] then
  return redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
return 0
"""
)
_RELEASE = Script(
    """
if redis.call('GET', KEYS[2]) == ARGV[1] then
  return redis.call('DEL', KEYS[2])
end
return 0
"""
)


_ADOPT = Script(
    """
local held = redis.call('GET', KEYS[2])
if held ~= ARGV[1] then
  return {0, held or '', redis.call('PTTL', KEYS[2])}
end
local epoch = redis.call('INCR', KEYS[1])
redis.call('SET', KEYS[2], tostring(epoch) .. ' ' .. ARGV[2], 'PX', ARGV[3])
return {epoch}
"""
)


class LeaseError(ValueError):
    """A lease period out of range."""


class Leases(NodeScripts):
    """The lease scripts for one node, on one redis-py client."""

    SCRIPTS = (_ACQUIRE, _RENEW, _RELEASE, _ADOPT)

    def token(self, epoch: int) -> str:
        return f"{epoch} {self.node} {self.address}"

    async def acquire(self, partition: int, lease_ms: int) -> int | Holder:
        """The new epoch when the lease was free, else its holder."""
        keys = self.layout.partition(partition)
        reply: list[Any] = await _ACQUIRE.run(
            self.client, [keys.epoch, keys.lease], [f"{self.node} {self.address}", lease_ms]
        )
        if reply[0] != 0:
            return int(reply[0])
        return parse_holder(text(reply[1]), int(reply[2]))

    async def adopt(self, partition: int, epoch: int, lease_ms: int) -> int | Holder:
        """Take over a lease this node's name holds at ``epoch`` (its previous
        process, gone): a new epoch, so that process's writes are fenced."""
        keys = self.layout.partition(partition)
        reply: list[Any] = await _ADOPT.run(
            self.client,
            [keys.epoch, keys.lease],
            [self.token(epoch), f"{self.node} {self.address}", lease_ms],
        )
        if reply[0] != 0:
            return int(reply[0])
        return parse_holder(text(reply[1]), int(reply[2]))

    async def renew(self, partition: int, epoch: int, lease_ms: int) -> bool:
        keys = self.layout.partition(partition)
        done = await _RENEW.run(
            self.client, [keys.epoch, keys.lease], [self.token(epoch), epoch, lease_ms]
        )
        return bool(done)

    async def release(self, partition: int, epoch: int) -> bool:
        keys = self.layout.partition(partition)
        done = await _RELEASE.run(self.client, [keys.epoch, keys.lease], [self.token(epoch)])
        return bool(done)

    async def holder(self, partition: int) -> Holder | None:
        keys = self.layout.partition(partition)
        pipe = self.client.pipeline(transaction=False)
        pipe.get(keys.lease)
        pipe.pttl(keys.lease)
        value, ttl_ms = await pipe.execute()
        return None if value is None else parse_holder(text(value), int(ttl_ms))

    async def holders(
        self, groups: Sequence[Sequence[int]], timeout_s: float | None = None
    ) -> tuple[dict[int, Holder], set[int]]:
        """Every partition's holder (no time left: ``ttl_ms`` 0), a free
        partition missing; and the partitions whose primary did not answer
        within ``timeout_s`` (``read_by_primary``: a pipeline of GETs per group)."""
        values, unknown = await self.read_by_primary(
            groups, lambda pipe, p: pipe.get(self.layout.partition(p).lease), timeout_s
        )
        found = {
            partition: parse_holder(text(value), 0)
            for partition, value in values.items()
            if value is not None
        }
        return found, unknown


# (partition, epoch, why): "lost" when Redis said the lease is not ours any
# more, "fenced" when 0.8 L passed with no successful renewal.
OnLost = Callable[[int, int, str], None]


class _Held:
    __slots__ = ("epoch", "fence")

    def __init__(self, epoch: int, fence: asyncio.TimerHandle) -> None:
        self.epoch = epoch
        self.fence = fence


class LeaseKeeper:
    """Holds this node's leases: acquires, renews every L/3, self-fences, releases."""

    def __init__(self, leases: Leases, lease_s: float, on_lost: OnLost) -> None:
        if not 0.1 <= lease_s <= 3600:
            raise LeaseError(f"lease {lease_s!r} s: must be 0.1..3600 s")
        self.leases = leases
        self.lease_s = lease_s
        self.lease_ms = round(lease_s * 1000)
        self._on_lost = on_lost
        self._held: dict[int, _Held] = {}
        self._renewing: asyncio.Task[None] | None = None
        self.renewals_failed = 0  # for metrics

    @property
    def held(self) -> dict[int, int]:
        """partition -> epoch, for the partitions this node may serve now."""
        return {p: h.epoch for p, h in self._held.items()}

    def start(self) -> None:
        if self._renewing is None:
            self._renewing = asyncio.get_running_loop().create_task(self._renew_forever())

    async def acquire(self, partition: int) -> int | Holder:
        if partition in self._held:
            return self._held[partition].epoch
        sent_s = asyncio.get_running_loop().time()
        got = await self.leases.acquire(partition, self.lease_ms)
        if isinstance(got, int):
            self._hold(partition, got, sent_s)
            log.debug("acquired partition %d, epoch %d", partition, got)
        return got

    async def adopt(self, partition: int, epoch: int) -> int | Holder:
        """``Leases.adopt``, then held and renewed as an acquired lease."""
        if partition in self._held:
            return self._held[partition].epoch
        sent_s = asyncio.get_running_loop().time()
        got = await self.leases.adopt(partition, epoch, self.lease_ms)
        if isinstance(got, int):
            self._hold(partition, got, sent_s)
            log.debug(
                "acquired partition %d, epoch %d (from this node's previous run)", partition, got
            )
        return got

    def forget(self, partition: int) -> None:
        """Stop holding a partition whose write was fenced (no release: not ours)."""
        held = self._held.pop(partition, None)
        if held is not None:
            held.fence.cancel()

    def forget_all(self) -> None:
        """Stop renewing and holding every lease, releasing none (a stop that
        gave up): each expires within L of its last renewal."""
        if self._renewing is not None:
            self._renewing.cancel()
            self._renewing = None
        for partition in list(self._held):
            self.forget(partition)

    async def release(self, partition: int) -> None:
        """Give the lease back (graceful stop or handoff): stop first, then delete."""
        held = self._held.pop(partition, None)
        if held is None:
            return
        held.fence.cancel()
        await self.leases.release(partition, held.epoch)
        log.debug("released partition %d, epoch %d", partition, held.epoch)

    async def close(self, *, release: bool = True) -> None:
        renewing, self._renewing = self._renewing, None
        if renewing is not None:
            await cancel_and_wait({renewing})  # a renewal in flight can swallow a cancel
        for partition in list(self._held):
            if release:
                with contextlib.suppress(Exception):  # the lease expires by itself anyway
                    await self.release(partition)
            else:
                self._held.pop(partition).fence.cancel()

    def _hold(self, partition: int, epoch: int, sent_s: float) -> None:
        loop = asyncio.get_running_loop()
        fence = loop.call_at(sent_s + FENCE_AFTER * self.lease_s, self._lose, partition, "fenced")
        old = self._held.get(partition)
        if old is not None:
            old.fence.cancel()
        self._held[partition] = _Held(epoch, fence)

    def _lose(self, partition: int, why: str) -> None:
        held = self._held.pop(partition, None)
        if held is None:
            return
        held.fence.cancel()
        # At DEBUG: the coordinator says it, one line for the partitions lost together.
        log.debug("%s partition %d, epoch %d", why, partition, held.epoch)
        self._on_lost(partition, held.epoch, why)

    async def _renew_forever(self) -> None:
        loop = asyncio.get_running_loop()
        period_s = self.lease_s / RENEWALS_PER_LEASE
        # Until close or forget_all lets go of this task: a renewal that
        # swallowed their cancel must not go on renewing for ever.
        while self._renewing is asyncio.current_task():
            started_s = loop.time()
            held = self.held
            if held:
                await asyncio.gather(
                    *(self._renew(p, epoch, period_s) for p, epoch in held.items())
                )
            await asyncio.sleep(max(0.0, started_s + period_s - loop.time()))

    async def _renew(self, partition: int, epoch: int, timeout_s: float) -> None:
        sent_s = asyncio.get_running_loop().time()
        try:
            ours = await asyncio.wait_for(
                self.leases.renew(partition, epoch, self.lease_ms), timeout_s
            )
        except Exception as exc:  # Redis slow or gone: the fence timer decides
            self.renewals_failed += 1
            log.debug("renewal of partition %d failed: %r", partition, exc)
            return
        held = self._held.get(partition)
        if held is None or held.epoch != epoch:  # fenced or released meanwhile
            return
        if ours:
            self._hold(partition, epoch, sent_s)
        else:
            self._lose(partition, "lost")
