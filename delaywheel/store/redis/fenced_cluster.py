"""Fenced flushes on a Redis Cluster: one writer per primary, the primaries in parallel.

How it works. Each partition's keys share a hash tag of their own
(layout.py), so the partitions' slots spread over the primaries.
``submit`` groups a flush's writes by the primary that serves each
partition's slot (redis-py's slot map) and hands each group to that
primary's ``FencedWriter`` (fenced.py): one pipeline per primary, its
epoch-checked EVALSHAs then, with ``replicas``, WAIT on the same connection.
The groups go out together, so a flush still costs one round trip, and
``done`` is called once, when every primary has answered, with their
outcomes merged: nothing is reported durable before all of it is.

Redirects and failovers. A script answered MOVED, ASK, TRYAGAIN or
CLUSTERDOWN ran nothing; a group whose connection failed (its primary
killed) may or may not have run. Either way those writes are sent again:
MOVED to the node it names, ASK to the node it names behind ``ASKING``, the
rest after the slot map is read again (a replica promoted in the meantime).
Sending again is safe: a script is absolute puts and deletes checked by the
epoch, so running it twice changes nothing, and one whose partition has a
new owner by then is refused ``FENCED`` like any other. Flushes go one at a
time (the journal has only one in flight: engine/journal.py), so a write
sent again is never overtaken by a newer write of its partition. The retries
back off from ``RETRY_FIRST_S``, doubling up to ``RETRY_MAX_S``, for at
most ``RETRY_FOR_S``. A write whose partition this node dropped meanwhile
(``held`` says no: self-fenced at 0.8 L) is not sent again but reported
fenced. What is still unwritten after ``RETRY_FOR_S`` fails the whole flush
with ``StoreUnavailable`` (outcome unknown: its requests are answered
``unavailable`` and clients retry with the same id).
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
    Fenced,
    FencedWriter,
    FlushOutcome,
    OnOutcome,
    PartitionWrite,
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

Address = tuple[str, int]
MakeLink = Callable[[str, int], JournalLink]
# Whether this node still holds (partition, epoch): the store's epochs.
Held = Callable[[int, int], bool]
# Where one write goes next: a node named by ASK (with ASKING) or MOVED, or
# None for the slot's primary on the current map.
Target = tuple[Address, bool] | None


class _Flush:
    """One submitted flush while its writes are out (see the module docstring)."""

    __slots__ = ("deadline_s", "done", "last", "outcome", "pending", "retry", "round", "writes")

    def __init__(self, writes: Sequence[PartitionWrite], done: OnOutcome) -> None:
        self.writes = writes
        self.done = done
        self.outcome = FlushOutcome()
        self.deadline_s = time.monotonic() + RETRY_FOR_S
        self.round = 0
        self.pending = 0  # groups of this round not answered yet
        self.retry: list[tuple[PartitionWrite, Target]] = []
        self.last = ""  # the last reason a write had to be sent again


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
        self._queue: deque[_Flush] = deque()
        self._current: _Flush | None = None
        self._closed = False
        self._tasks: set[asyncio.Task[None]] = set()  # resends waiting
        self._closing: set[asyncio.Task[None]] = set()  # writers of former primaries
        self.retried = 0  # writes sent again (a redirect or a failover): for tests and logs
        self.held = held

    def primaries(self) -> set[Address]:
        """The primaries that have a writer now."""
        return set(self._writers)

    def submit(self, writes: Sequence[PartitionWrite], done: OnOutcome) -> None:
        if self._closed:
            done(FlushOutcome(error=StoreUnavailable("fenced writes: closed")))
            return
        if not writes:
            done(FlushOutcome(replicas=None))
            return
        self._queue.append(_Flush(writes, done))
        if self._current is None:
            self._next()

    def _next(self) -> None:
        if self._closed:
            self._current = None
            self._fail_queued()
        elif self._queue:
            self._current = flush = self._queue.popleft()
            self._send(flush, [(write, None) for write in flush.writes])
        else:
            self._current = None

    def _send(self, flush: _Flush, writes: list[tuple[PartitionWrite, Target]]) -> None:
        flush.round += 1
        groups: dict[tuple[Address, bool], list[PartitionWrite]] = {}
        for write, target in writes:
            if target is None:
                node = self._primary_of(write.tasks_key)
                if node is None:
                    flush.retry.append((write, None))
                    flush.last = f"no node serves the slot of {write.tasks_key}"
                    continue
                target = (node, False)
            groups.setdefault(target, []).append(write)
        flush.pending = len(groups)
        if not groups:
            self._round_done(flush)
            return
        for (address, asking), group in groups.items():
            self._writer(address).submit(
                group, partial(self._answered, flush, group), asking=asking
            )

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

    def _answered(self, flush: _Flush, group: list[PartitionWrite], outcome: FlushOutcome) -> None:
        merged = flush.outcome
        merged.written += outcome.written
        merged.fenced.update(outcome.fenced)
        if outcome.replicas is not None:
            merged.replicas = (
                outcome.replicas
                if merged.replicas is None
                else min(merged.replicas, outcome.replicas)
            )
        if not outcome.reached:  # the link failed: any of it may or may not have run
            assert outcome.error is not None
            flush.retry += [(write, None) for write in group]
            flush.last = str(outcome.error)
        elif outcome.error is not None and merged.error is None:
            merged.error = outcome.error  # too few replicas, or a refusal: final
        by_partition = {write.partition: write for write in group}
        for partition, reply in outcome.redirected.items():
            flush.retry.append((by_partition[partition], _target(reply)))
            flush.last = reply
        flush.pending -= 1
        if flush.pending == 0:
            self._round_done(flush)

    def _round_done(self, flush: _Flush) -> None:
        if not flush.retry:
            self._finish(flush)
            return
        retry, flush.retry = flush.retry, []
        held = self.held
        if held is not None:  # a partition dropped meanwhile (self-fenced) is not sent again
            for write, _ in retry:
                if not held(write.partition, write.epoch):
                    flush.outcome.fenced[write.partition] = Fenced(
                        f"partition {write.partition}: dropped by this node while its write"
                        f" at epoch {write.epoch} waited to be sent again"
                    )
            retry = [(w, t) for w, t in retry if w.partition not in flush.outcome.fenced]
            if not retry:
                self._finish(flush)
                return
        self.retried += len(retry)
        if self._closed or time.monotonic() >= flush.deadline_s:
            partitions = sorted(write.partition for write, _ in retry)
            flush.outcome.error = flush.outcome.error or StoreUnavailable(
                f"fenced write of partition(s) {partitions} not done after {flush.round}"
                f" attempt(s) in {RETRY_FOR_S:g} s: {flush.last}"
            )
            self._finish(flush)
            return
        if flush.round == 1:
            log.info(
                "fenced write of %d partition(s) sent again (%s)",
                len(retry),
                flush.last,
                extra={"partitions": sorted(write.partition for write, _ in retry)},
            )
        # A MOVED or ASK names the node: at once. Otherwise wait a little, then
        # read the map again (a promotion takes a cluster-node-timeout or more).
        at_once = flush.round <= 2 and all(target is not None for _, target in retry)
        delay_s = 0.0 if at_once else min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** (flush.round - 1))
        task = asyncio.get_running_loop().create_task(self._resend(flush, retry, delay_s))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _resend(
        self, flush: _Flush, retry: list[tuple[PartitionWrite, Target]], delay_s: float
    ) -> None:
        try:
            if delay_s:
                await asyncio.sleep(delay_s)
            await self._refresh()
        except asyncio.CancelledError:
            flush.retry = retry
            flush.deadline_s = 0.0  # closing: fail what is left
            self._round_done(flush)
            raise
        self._send(flush, retry)

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

    def _finish(self, flush: _Flush) -> None:
        try:
            flush.done(flush.outcome)
        finally:
            self._next()

    async def drain(self) -> None:
        """Wait until every flush submitted so far has its outcome (each within
        ``RETRY_FOR_S`` of its start); polled: it is for close, not per flush."""
        while self._current is not None or self._queue:
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
        if self._current is None:
            self._fail_queued()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    def _fail_queued(self) -> None:
        while self._queue:
            self._queue.popleft().done(
                FlushOutcome(error=StoreUnavailable("fenced writes: closed"))
            )


def _target(reply: str) -> Target:
    """Where a redirect sends the write: ``MOVED|ASK <slot> <host>:<port>``, else None."""
    words = reply.split()
    if len(words) == 3 and words[0] in ("MOVED", "ASK"):
        host, _, port = words[2].rpartition(":")
        if port.isdigit():
            return (host, int(port)), words[0] == "ASK"
    return None
