"""The fenced journal flush: one script per partition checks the epoch, then writes.

How it works. A flush carries, for each partition it touches, the epoch its
writer holds (the lease's fencing token, ha/lease.py) and the batch of
puts and removes. Each partition's batch is one EVALSHA of ``FLUSH_SCRIPT``
over that partition's keys, its epoch key, its tasks hash and its lease key
(one hash tag, so one Cluster slot): when the stored epoch is not the
writer's, the script answers ``FENCED ...``, naming the lease's holder (who
deposed the writer, for the ``moved`` answer), and writes nothing; otherwise
it applies the
HSET/HDEL batch. A script runs atomically, so no acquire can slip in between
the check and the writes. A deposed owner's flush is refused, whatever it
believes about its lease.

With ``replicas`` > 0 the EVALSHAs are followed by ``WAIT replicas
timeout_ms`` in the same pipeline on the same connection: one round trip,
and WAIT counts the replicas that have everything this connection wrote
before it. Fewer than asked within the timeout is ``TooFewReplicas``: the
writes are on the primary but may not survive its failover, so their
durability is unknown (the engine answers ``unavailable`` and keeps the
changes, as the primary does: ``Unconfirmed``; the client retries with the
same id).

The bytes go over the store's own hiredis link (link.py), not
redis-py: this is the per-request path. The scripts, their atomicity, and
their loading at every link's handshake are flush_scripts.py's.

On a Redis Cluster a flush may only carry partitions whose slots one node
serves: ``ClusterFencedWriter`` (fenced_cluster.py) keeps one ``FencedWriter``
per primary, whose link does not follow MOVED itself; a script answered with
a redirect (MOVED, ASK, TRYAGAIN, CLUSTERDOWN) ran nothing, and its outcome
lists it in ``redirected`` for that writer to route again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple, cast

import hiredis

from delaywheel.store.base import Changes, StoreError, StoreUnavailable, Tiers, Unconfirmed
from delaywheel.store.redis.flush_scripts import FLUSH_FAR_SHA, FLUSH_SHA
from delaywheel.store.redis.flush_scripts import LOAD_SCRIPTS as LOAD_SCRIPTS  # topology's import
from delaywheel.store.redis.link import Command, Flush, JournalLink

# Packed EVALSHA heads kept (FencedWriter.submit_one): one per partition and
# epoch; a node that keeps losing and taking partitions starts afresh.
MAX_HEADS = 4096

# Replies of a Redis Cluster node that ran nothing of the command: the slot is
# elsewhere (MOVED), moving (ASK, TRYAGAIN), or the cluster is down.
REDIRECTS = ("MOVED ", "ASK ", "TRYAGAIN", "CLUSTERDOWN")
_ASKING = hiredis.pack_command(("ASKING",))


class Fenced(StoreError):
    """A partition's write was refused: its epoch moved on (another node owns it).
    ``lease``: the partition's lease key's value as the refusing script read
    it (its holder, ``layout.parse_holder`` reads it), None when the
    lease was free or the refusal was this node's own."""

    def __init__(self, message: str, lease: str | None = None) -> None:
        super().__init__(message)
        self.lease = lease


def refusal(partition: int, reply: str) -> Fenced:
    """The ``Fenced`` of a script's ``FENCED <epoch key> is E, not W; lease <value>``."""
    said, _, lease = reply[len("FENCED ") :].partition("; lease ")
    if not lease:
        return Fenced(f"partition {partition}: write refused, {said}; the lease is free")
    return Fenced(f"partition {partition}: write refused, {said}; the lease is {lease!r}", lease)


class TooFewReplicas(Unconfirmed):
    """WAIT saw fewer replicas than asked in time: written, durability unknown."""


class PartitionWrite(NamedTuple):
    """One partition's share of a flush (a NamedTuple, not a frozen dataclass:
    one is made per partition per flush, and a tuple is made 4x faster)."""

    partition: int
    epoch: int
    epoch_key: str
    tasks_key: str
    lease_key: str  # read only by a refusal, to name the holder
    changes: Changes
    # Far-tier changes (store/base.py) and the partition's far, due and
    # far-count keys: the write is then FLUSH_FAR_SCRIPT's.
    tiers: Tiers | None = None
    far_keys: tuple[str, str, str] | None = None


@dataclass
class FlushOutcome:
    """What a fenced flush did. ``error`` None and ``fenced`` empty: all durable."""

    written: list[int] = field(default_factory=list)  # partitions whose writes landed
    fenced: dict[int, Fenced] = field(default_factory=dict)
    replicas: int | None = None  # confirmed by WAIT; None when none were asked for
    error: StoreError | None = None  # the whole flush: unreachable, refused, too few replicas
    # Partitions a Cluster node redirected (nothing ran), with its reply; only
    # when the writer was asked to keep them (``keep_redirects``), else an error.
    redirected: dict[int, str] = field(default_factory=dict)
    reached: bool = True  # False: the link failed before every reply came


# A part of a submitted flush is done: those writes, and their outcome. Both
# writers (this one, and a Cluster's in fenced_cluster.py) report so: one
# server answers a flush in one part.
OnPart = Callable[[Sequence["PartitionWrite"], FlushOutcome], None]
# submit_one's answer: the outcome, or None for "written" (the one-server
# writer's commonest answer, which makes no outcome).
OnOne = Callable[[FlushOutcome | None], None]
Address = tuple[str, int]
# A partition's (epoch key, tasks key, lease key), in the order a flush names them.
PartitionKeys = tuple[str, str, str]


def fenced_flush(
    writes: Sequence[PartitionWrite],
    *,
    replicas: int = 0,
    wait_timeout_ms: int = 1000,
    asking: bool = False,
) -> Flush:
    """One EVALSHA per partition, then ``WAIT`` when ``replicas`` > 0: one flush.

    ``asking``: each EVALSHA follows an ``ASKING`` (a Cluster node importing
    the slot serves it only so), whose ``+OK`` replies ``outcome_of`` skips."""
    if replicas < 0 or wait_timeout_ms < 1:  # WAIT 0 ms would block for ever
        raise ValueError(f"replicas {replicas!r}, wait {wait_timeout_ms!r} ms: must be >= 0, >= 1")
    pack = hiredis.pack_command
    if len(writes) == 1 and not replicas and not asking:  # the commonest: one request's change
        return Flush(pack(_evalsha(writes[0])), 1, keep_replies=True)
    if asking:
        packed = [_ASKING + pack(_evalsha(write)) for write in writes]
        if replicas:
            packed.append(pack(cast(Any, ("WAIT", replicas, wait_timeout_ms))))
        return Flush(b"".join(packed), 2 * len(writes) + bool(replicas), keep_replies=True)
    packed = [pack(_evalsha(write)) for write in writes]
    if replicas:
        packed.append(pack(cast(Any, ("WAIT", replicas, wait_timeout_ms))))
    return Flush(b"".join(packed), len(packed), keep_replies=True)


def _bulk(value: str | int) -> bytes:
    data = str(value).encode()
    return b"$%d\r\n%b\r\n" % (len(data), data)


# One change's EVALSHA, packed by hand (``FencedWriter.submit_one``): its
# arguments after the command's header are the same for every change of a
# partition at an epoch but the last two or three, and hiredis.pack_command
# takes twice as long for the nine arguments as this join (docs/performance.md,
# "Measurements behind the code").
_ONE_PUT = b"*10\r\n"  # EVALSHA sha 3 epoch-key tasks-key lease-key epoch 1 id record
_ONE_REMOVE = b"*9\r\n"  # EVALSHA sha 3 epoch-key tasks-key lease-key epoch 0 id
_PUTS_1 = _bulk(1)
_PUTS_0 = _bulk(0)
_CRLF = b"\r\n"


def _head(keys: PartitionKeys, epoch: int) -> bytes:
    """The arguments of a partition's EVALSHA up to its epoch, packed."""
    return b"".join(_bulk(arg) for arg in ("EVALSHA", FLUSH_SHA, 3, *keys, epoch))


def _evalsha(write: PartitionWrite) -> Any:
    if write.tiers is not None:
        return _evalsha_far(write)
    puts: list[str | bytes] = []
    removes: list[str] = []
    for task_id, record in write.changes.items():
        if record is None:
            removes.append(task_id)
        else:
            puts += (task_id, record)
    return (
        "EVALSHA",
        FLUSH_SHA,
        3,
        write.epoch_key,
        write.tasks_key,
        write.lease_key,
        write.epoch,
        len(puts) // 2,
        *puts,
        *removes,
    )


def _evalsha_far(write: PartitionWrite) -> Any:
    tiers = write.tiers
    assert tiers is not None and write.far_keys is not None
    was_far = [item for pair in tiers.was_far.items() for item in pair]
    groups = tiers.groups
    blind = [item for task_id in tiers.blind for item in (task_id, groups.get(task_id, ""))]
    changes: list[str | bytes] = []
    for task_id, record in write.changes.items():
        if record is None:
            changes += (task_id, "r", "", "", "")
        elif task_id in tiers.far:
            due_s, topic = tiers.far[task_id]
            changes += (task_id, "f", record, repr(due_s), topic)
        else:
            changes += (task_id, "p", record, "", "")
    return (
        "EVALSHA",
        FLUSH_FAR_SHA,
        6,
        write.epoch_key,
        write.tasks_key,
        write.lease_key,
        *write.far_keys,
        write.epoch,
        len(tiers.blind),
        len(tiers.was_far),
        len(write.changes),
        *blind,
        *was_far,
        *changes,
    )


def outcome_of(
    writes: Sequence[PartitionWrite],
    replicas: int,
    flush: Flush,
    exc: Exception | None,
    where: str,
    *,
    keep_redirects: bool = False,
    asking: bool = False,
) -> FlushOutcome:
    """Read a finished fenced flush's replies into its outcome."""
    outcome = FlushOutcome()
    replies = flush.replies or []
    if len(replies) < flush.expected:  # the link failed before every reply came
        outcome.error = StoreUnavailable(f"store {where}: fenced write failed: {exc}")
        outcome.reached = False
        return outcome
    if asking:  # drop ASKING's +OK before each script's reply
        replies = replies[1 : 2 * len(writes) : 2] + replies[2 * len(writes) :]
    if not replicas and len(writes) == 1 and type(replies[0]) is int:  # the commonest: written
        outcome.written.append(writes[0].partition)
        return outcome
    for write, reply in zip(writes, replies, strict=False):
        if isinstance(reply, hiredis.ReplyError):
            if str(reply).startswith("FENCED "):
                outcome.fenced[write.partition] = refusal(write.partition, str(reply))
            elif keep_redirects and str(reply).startswith(REDIRECTS):
                outcome.redirected[write.partition] = str(reply)
            elif outcome.error is None:
                outcome.error = StoreError(f"store {where}: partition {write.partition}: {reply}")
        else:
            outcome.written.append(write.partition)
            if type(reply) is list and write.tiers is not None:  # the blind puts refused
                write.tiers.conflicts.update(
                    each.decode() if isinstance(each, bytes) else str(each) for each in reply
                )
    if replicas:
        confirmed = replies[len(writes)]
        if isinstance(confirmed, hiredis.ReplyError) or not isinstance(confirmed, int):
            outcome.error = outcome.error or StoreUnavailable(
                f"store {where}: WAIT {replicas} failed: {confirmed!r}"
            )
        else:
            outcome.replicas = confirmed
            if confirmed < replicas and outcome.error is None:
                outcome.error = TooFewReplicas(
                    f"store {where}: WAIT {replicas}: {confirmed} replica(s) confirmed in time;"
                    " the write may not survive a failover"
                )
    return outcome


def outcome_only(done: OnOne, _writes: Sequence[PartitionWrite], outcome: FlushOutcome) -> None:
    """An ``OnPart`` answer to ``submit_one``'s caller, who knows the write."""
    done(outcome)


def _called(exc: Exception | None) -> None:
    """A finished flush's ``done``: it has been called once already."""


class FencedWriter:
    """Fenced flushes over one journal link (see the module docstring)."""

    def __init__(
        self,
        link: JournalLink,
        *,
        replicas: int = 0,
        wait_timeout_ms: int = 1000,
        keep_redirects: bool = False,
    ) -> None:
        self.link = link
        self.replicas = replicas
        self.wait_timeout_ms = wait_timeout_ms
        # A Cluster primary's writer: redirects are routed by its caller.
        self.keep_redirects = keep_redirects
        # (the partition's keys, epoch) -> _head(): submit_one's packed start
        self._heads: dict[tuple[PartitionKeys, int], bytes] = {}

    @staticmethod
    def handshake(before: Sequence[Command] = ()) -> list[Command]:
        """A link's handshake that also loads the flush script (AUTH, SELECT first)."""
        return [*before, *LOAD_SCRIPTS]

    def submit(
        self, writes: Sequence[PartitionWrite], done: OnPart, *, asking: bool = False
    ) -> None:
        """Send ``writes`` in one flush; ``done(writes, outcome)`` once it is answered."""
        if not writes:
            done(writes, FlushOutcome(replicas=None))
            return
        flush = fenced_flush(
            writes, replicas=self.replicas, wait_timeout_ms=self.wait_timeout_ms, asking=asking
        )
        link = self.link

        def finished(exc: Exception | None) -> None:
            # The flush holds this closure and the closure the flush: a cycle
            # that only the collector would free, with the batch and its tasks
            # hanging off it (docs/performance.md, "Measurements behind the code").
            flush.done = _called
            where = f"{link.address[0]}:{link.address[1]}"
            done(
                writes,
                outcome_of(
                    writes,
                    self.replicas,
                    flush,
                    exc,
                    where,
                    keep_redirects=self.keep_redirects,
                    asking=asking,
                ),
            )

        self.link.send(flush, finished)

    def submit_one(
        self,
        partition: int,
        epoch: int,
        keys: PartitionKeys,
        task_id: str,
        record: bytes | None,
        done: OnOne,
    ) -> None:
        """``submit`` of one change (``keys``: the partition's epoch, tasks and
        lease keys), the flush of one request at a time. Its commonest answer, the
        script wrote it, makes no outcome: ``done(None)``. Any other answer is
        ``done(outcome)`` as ``submit`` gives it."""
        if self.replicas:
            write = PartitionWrite(partition, epoch, *keys, {task_id: record})
            self.submit([write], partial(outcome_only, done))
            return
        head = self._heads.get((keys, epoch))
        if head is None:
            if len(self._heads) >= MAX_HEADS:  # epochs of partitions long gone
                self._heads.clear()
            head = self._heads[keys, epoch] = _head(keys, epoch)
        id_bytes = task_id.encode()
        parts: tuple[bytes, ...]
        if record is None:
            parts = (_ONE_REMOVE, head, _PUTS_0, b"$%d\r\n" % len(id_bytes), id_bytes, _CRLF)
        else:
            parts = (
                _ONE_PUT,
                head,
                _PUTS_1,
                b"$%d\r\n" % len(id_bytes),
                id_bytes,
                b"\r\n$%d\r\n" % len(record),
                record,
                _CRLF,
            )
        flush = Flush(b"".join(parts), 1, keep_replies=True)
        link = self.link

        def finished(exc: Exception | None) -> None:
            flush.done = _called  # the cycle, as in submit
            replies = flush.replies
            if replies and type(replies[0]) is int:  # the script's count: written
                done(None)
                return
            where = f"{link.address[0]}:{link.address[1]}"
            write = PartitionWrite(partition, epoch, *keys, {task_id: record})
            done(outcome_of([write], 0, flush, exc, where, keep_redirects=self.keep_redirects))

        link.send(flush, finished)

    def primary_of(self, key: str) -> Address | None:
        """None: one server (or Sentinel's primary) serves every key."""
        return None

    async def drain(self) -> None:
        """Wait until every flush sent so far has its outcome."""
        await self.link.drain()

    async def close(self) -> None:
        await self.link.close()
