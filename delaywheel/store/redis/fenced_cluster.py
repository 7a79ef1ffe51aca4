"""Fenced flushes on a Redis Cluster: one writer per primary, the primaries independent.

How it works. Each partition's keys share a hash tag of their own
(layout.py), so the partitions' slots spread over the primaries.
``submit`` groups a flush's writes by the primary that serves each
partition's slot (redis-py's slot map) and hands each group to that
primary's ``FencedWriter`` (fenced.py): one pipeline per primary, its
epoch-checked EVALSHAs then, with ``replicas``, WAIT on the same connection.
The groups go out together, so a flush still costs one round trip per
primary, and each primary's writes are reported (``done(writes, outcome)``)
as soon as that primary has answered: a primary that does not answer, or
whose WAIT fails, holds up or fails only its own partitions.

Order. A partition has at most one write in this writer at a time: a write
submitted while an earlier one of its partition is still out (retried,
say) waits behind it, and goes when that one is reported (the journal
never does this: it keeps one write per partition in flight itself; a
caller of ``Store.submit`` may). So a write sent again is never overtaken
by a newer write of its partition, and nothing else waits for it.

Redirects and failovers. A script answered MOVED, ASK, TRYAGAIN or
CLUSTERDOWN ran nothing; a group whose connection failed (its primary
killed) may or may not have run. Either way those writes are sent again:
MOVED to the node it names, ASK to the node it names behind ``ASKING``, the
rest after the slot map is read again (a replica promoted in the meantime).
Sending again is safe: a script is absolute puts and deletes checked by the
epoch, so running it twice changes nothing, and one whose partition has a
new owner by then is refused ``FENCED`` like any other. The retries back off
from ``RETRY_FIRST_S``, doubling up to ``RETRY_MAX_S``, for at most
``RETRY_FOR_S`` from the first send. A write whose partition this node
dropped meanwhile (``held`` says no: self-fenced at 0.8 L) is not sent
again but reported fenced. What is still unwritten after ``RETRY_FOR_S`` is
reported failed with ``StoreUnavailable`` (outcome unknown: its requests are
answered ``unavailable`` and clients retry with the same id).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial

from redis.asyncio import RedisCluster

from delaywheel.cancelling import CANCEL_WAIT_S, cancel_and_wait
from delaywheel.store.base import StoreUnavailable
from delaywheel.store.redis.fenced import (
    Address,
    Fenced,
    FencedWriter,
    FlushOutcome,
    OnOne,
    OnPart,
    PartitionKeys,
    PartitionWrite,
    outcome_only,
)
from delaywheel.store.redis.link import JournalLink

log = logging.getLogger("delaywheel.store")

# How long a flush keeps trying the partitions a failover or reshard left
# unwritten: a promotion with a cluster-node-timeout of a few seconds fits.
RETRY_FOR_S = 5.0
RETRY_FIRST_S = 0.05
RETRY_MAX_S = 0.5
# How often ``drain`` looks whether the flushes are done.
DRAIN_POLL_S = 0.01

MakeLink = Callable[[str, int], JournalLink]
# Whether this node still holds (partition, epoch): the store's epochs.
Held = Callable[[int, int], bool]
# Where one write goes next: a node named by ASK (with ASKING) or MOVED, or
# None for the slot's primary on the current map.
Target = tuple[Address, bool] | None


class _Retry:
    """Writes of one submit that go again together, and their bounds."""

    __slots__ = ("deadline_s", "done", "last", "round")

    def __init__(self, done: OnPart, deadline_s: float, round_: int = 0, last: str = "") -> None:
        self.done = done
        self.deadline_s = deadline_s
        self.round = round_
        self.last = last  # the last reason a write had to be sent again


class ClusterFencedWriter:
    """Fenced flushes over one link per Cluster primary (see the module docstring)."""

    def __init__(
        self,
        client: RedisCluster,
        make_link: MakeLink,
        *,
        replicas: int = 0,
        wait_timeout_ms: int = 1000,
        held: Held | None = None,
    ) -> None:
        self.client = client
        self._make_link = make_link
        self.replicas = replicas
        self.wait_timeout_ms = wait_timeout_ms
        self._writers: dict[Address, FencedWriter] = {}
        # Partitions with a write out -> the writes of theirs waiting behind it.
        self._out: dict[int, deque[tuple[PartitionWrite, _Retry]]] = {}
        self._closed = False
        self._tasks: set[asyncio.Task[None]] = set()  # resends waiting
        self._closing: set[asyncio.Task[None]] = set()  # writers of former primaries
        self.retried = 0  # writes sent again (a redirect or a failover): for tests and logs
        self.held = held

    def primaries(self) -> set[Address]:
        """The primaries that have a writer now."""
        return set(self._writers)

    def submit(self, writes: Sequence[PartitionWrite], done: OnPart) -> None:
        """Send ``writes``; ``done(part, outcome)`` as each part is settled, every
        write in exactly one part."""
        if self._closed:
            done(writes, FlushOutcome(error=StoreUnavailable("fenced writes: closed")))
            return
        if not writes:
            return
        unit = _Retry(done, time.monotonic() + RETRY_FOR_S)
        out = self._out
        now: list[tuple[PartitionWrite, Target]] = []
        for write in writes:
            behind = out.get(write.partition)
            if behind is None:
                out[write.partition] = deque()
                now.append((write, None))
            else:  # an earlier write of its partition is out: after it
                behind.append((write, unit))
        if now:
            self._send(unit, now)

    def submit_one(
        self,
        partition: int,
        epoch: int,
        keys: PartitionKeys,
        task_id: str,
        record: bytes | None,
        done: OnOne,
    ) -> None:
        """``submit`` of one change, answered as ``FencedWriter.submit_one`` is
        (here always with its outcome)."""
        write = PartitionWrite(partition, epoch, *keys, {task_id: record})
        self.submit([write], partial(outcome_only, done))

    def _send(self, unit: _Retry, writes: list[tuple[PartitionWrite, Target]]) -> None:
        unit.round += 1
        groups: dict[tuple[Address, bool], list[PartitionWrite]] = {}
        unrouted: list[tuple[PartitionWrite, Target]] = []
        for write, target in writes:
            if target is None:
                node = self._primary_of(write.tasks_key)
                if node is None:
                    unrouted.append((write, None))
                    unit.last = f"no node serves the slot of {write.tasks_key}"
                    continue
                target = (node, False)
            groups.setdefault(target, []).append(write)
        for (address, asking), group in groups.items():
            self._writer(address).submit(group, partial(self._answered, unit), asking=asking)
        if unrouted:
            self._retry(unit, unrouted)

    def primary_of(self, key: str) -> Address | None:
        """The primary that serves ``key``'s slot on the map now (None: none)."""
        return self._primary_of(key)

    def _primary_of(self, key: str) -> Address | None:
        try:
            node = self.client.get_node_from_key(key)
        except Exception:  # SlotNotCoveredError: a slot without a live owner
            return None
        return None if node is None else (node.host, int(node.port))

    def _writer(self, address: Address) -> FencedWriter:
        writer = self._writers.get(address)
        if writer is None:
            writer = self._writers[address] = FencedWriter(
                self._make_link(*address),
                replicas=self.replicas,
                wait_timeout_ms=self.wait_timeout_ms,
                keep_redirects=True,
            )
        return writer

    def _answered(self, unit: _Retry, group: list[PartitionWrite], outcome: FlushOutcome) -> None:
        """One primary's answer: what it settled is reported now, the rest retried."""
        if not outcome.reached:  # the link failed: any of it may or may not have run
            assert outcome.error is not None
            unit.last = str(outcome.error)
            self._retry(unit, [(write, None) for write in group])
            return
        retry: list[tuple[PartitionWrite, Target]] = []
        if outcome.redirected:
            by_partition = {write.partition: write for write in group}
            for partition, reply in outcome.redirected.items():
                retry.append((by_partition[partition], _target(reply)))
                unit.last = reply
            group = [write for write in group if write.partition not in outcome.redirected]
            outcome.redirected = {}
        if group:  # written, fenced, or failed for good (too few replicas, a refusal)
            self._settle(unit, group, outcome)
        if retry:
            self._retry(unit, retry)

    def _retry(self, unit: _Retry, retry: list[tuple[PartitionWrite, Target]]) -> None:
        held = self.held
        if held is not None:  # a partition dropped meanwhile (self-fenced) is not sent again
            dropped = [write for write, _ in retry if not held(write.partition, write.epoch)]
            if dropped:
                fenced = {
                    write.partition: Fenced(
                        f"partition {write.partition}: dropped by this node while its write"
                        f" at epoch {write.epoch} waited to be sent again"
                    )
                    for write in dropped
                }
                self._settle(unit, dropped, FlushOutcome(fenced=fenced))
                retry = [(w, t) for w, t in retry if w.partition not in fenced]
                if not retry:
                    return
        self.retried += len(retry)
        if self._closed or time.monotonic() >= unit.deadline_s:
            partitions = sorted(write.partition for write, _ in retry)
            error = StoreUnavailable(
                f"fenced write of partition(s) {partitions} not done after {unit.round}"
                f" attempt(s) in {RETRY_FOR_S:g} s: {unit.last}"
            )
            self._settle(unit, [write for write, _ in retry], FlushOutcome(error=error))
            return
        if unit.round == 1:
            log.info(
                "fenced write of %d partition(s) sent again (%s)",
                len(retry),
                unit.last,
                extra={"partitions": sorted(write.partition for write, _ in retry)},
            )
        # A MOVED or ASK names the node: at once. Otherwise wait a little, then
        # read the map again (a promotion takes a cluster-node-timeout or more).
        at_once = unit.round <= 2 and all(target is not None for _, target in retry)
        delay_s = 0.0 if at_once else min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** (unit.round - 1))
        again = _Retry(unit.done, unit.deadline_s, unit.round, unit.last)
        task = asyncio.get_running_loop().create_task(self._resend(again, retry, delay_s))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _resend(
        self, unit: _Retry, retry: list[tuple[PartitionWrite, Target]], delay_s: float
    ) -> None:
        try:
            if delay_s:
                await asyncio.sleep(delay_s)
            await self._refresh()
        except asyncio.CancelledError:
            unit.deadline_s = 0.0  # closing: fail what is left
            self._retry(unit, retry)
            raise
        self._send(unit, retry)

    async def _refresh(self) -> None:
        """Read the slot map again; drop the writers of nodes no longer primaries."""
        try:
            await self.client.nodes_manager.initialize()
        except Exception as exc:  # the cluster still settling: the next round tries again
            log.debug("slot map refresh failed: %r", exc)
            return
        primaries = {(node.host, int(node.port)) for node in self.client.get_primaries()}
        for address in set(self._writers) - primaries:
            writer = self._writers.pop(address)
            task = asyncio.get_running_loop().create_task(writer.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    def _settle(self, unit: _Retry, writes: list[PartitionWrite], outcome: FlushOutcome) -> None:
        """Report ``writes``, and send the writes of their partitions waiting behind."""
        try:
            unit.done(writes, outcome)
        finally:
            for write in writes:
                self._next_of(write.partition)

    def _next_of(self, partition: int) -> None:
        behind = self._out.get(partition)
        if behind is None:
            return
        if not behind:
            del self._out[partition]
            return
        write, unit = behind.popleft()
        if self._closed:
            closed = StoreUnavailable("fenced writes: closed")
            self._settle(unit, [write], FlushOutcome(error=closed))
        else:
            self._send(unit, [(write, None)])

    async def drain(self) -> None:
        """Wait until every flush submitted so far has its outcome (each within
        ``RETRY_FOR_S`` of its start); polled: it is for close, not per flush."""
        while self._out or self._tasks:  # a partition in _out has a write out
            await asyncio.sleep(DRAIN_POLL_S)

    async def close(self) -> None:
        """Fail what is still queued and close every link (``drain`` first to
        let it finish: the store does)."""
        self._closed = True
        # Again while a resend that ended started another, within one bound (a
        # resend reads the slot map with redis-py, which can swallow a cancel).
        deadline_s = time.monotonic() + CANCEL_WAIT_S
        while self._tasks and time.monotonic() < deadline_s:
            await cancel_and_wait(list(self._tasks), deadline_s - time.monotonic())
        writers, self._writers = list(self._writers.values()), {}
        for writer in writers:
            with contextlib.suppress(Exception):
                await writer.close()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)


def _target(reply: str) -> Target:
    """Where a redirect sends the write: ``MOVED|ASK <slot> <host>:<port>``, else None."""
    words = reply.split()
    if len(words) == 3 and words[0] in ("MOVED", "ASK"):
        host, _, port = words[2].rpartition(":")
        if port.isdigit():
            return (host, int(port)), words[0] == "ASK"
    return None
