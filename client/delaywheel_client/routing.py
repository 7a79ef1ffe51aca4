"""What both cluster clients share, without any I/O: the partition map, the hash, and the
rules for ``moved``, ``tryagain`` and a node that cannot be reached.

A task's partition is ``zlib.crc32(id as UTF-8) % partitions`` (docs/protocol.md), and the
map from ``cluster`` names each partition's owner by its ``address`` (``"host:port"``). A
server older than the ``cluster`` method answers ``no_method``: it owns every task, so the
map is one partition owned by that server.
"""

from __future__ import annotations

import dataclasses
import uuid
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from delaywheel_client.connection import parse_url
from delaywheel_client.errors import ConnectionFailed, DelaywheelError

# ``moved`` is followed this many times per call (each time with a fresh map) before the
# call raises it: more means the nodes disagree about ownership for longer than a refresh.
MAX_MOVED_FOLLOWS = 3

# How long one call keeps trying while its partition has no reachable owner (``tryagain``,
# or the owner's connection refused): a crashed owner's lease runs out within 2 leases
# (2 x 10 s by default), then a live node takes the partition over.
FAILOVER_TIMEOUT_S = 30.0

# A blocking ``reserve`` waits on one node at a time for at most this long, polling the
# others in between: a task that becomes ready on another node waits at most this long.
RESERVE_SLICE_S = 0.5

# Sleep bounds between tries while a partition has no owner that answers.
RETRY_MIN_S = 0.05
RETRY_MAX_S = 1.0

# The methods whose first param is a task id: they go to that task's owner.
ID_METHODS = frozenset({"update", "delete", "get", "ack", "release", "touch", "kick_task"})


def partition_of(task_id: str, partitions: int) -> int:
    """The partition of ``task_id``: ``zlib.crc32(id as UTF-8) % partitions``."""
    return zlib.crc32(task_id.encode("utf-8")) % partitions


def new_task_id() -> str:
    """A client-made id: ``add`` always sends one, so that sending it again is safe."""
    return uuid.uuid4().hex


def split_address(address: str) -> tuple[str, int]:
    """``"host:port"`` (or ``[v6]:port``, or a ``delaywheel://`` URL) -> (host, port)."""
    host, port, _ = parse_url(address)
    return host, port


def parse_seeds(seeds: str | Sequence[str]) -> list[str]:
    """The seed addresses, from a list or a comma-separated string; each one checked."""
    items = seeds.split(",") if isinstance(seeds, str) else list(seeds)
    addresses = [item.strip() for item in items if item.strip()]
    if not addresses:
        raise ValueError(f"no seed addresses (host:port, comma-separated): {seeds!r}")
    for address in addresses:
        split_address(address)  # raises ValueError naming it
    return addresses


@dataclasses.dataclass
class PartitionMap:
    """Who owns which partition, as one node described it. ``owners[p]`` is the address of
    partition ``p``'s owner, or None while it has none."""

    partitions: int
    owners: list[str | None]
    raw: dict[str, Any]

    @classmethod
    def from_cluster(cls, result: Any, asked: str) -> PartitionMap:
        """The map from a ``cluster`` result; ``asked`` names the node, for errors."""
        if not isinstance(result, Mapping):
            raise DelaywheelError(f"{asked}: cluster answered {result!r}, not a map", "internal")
        partitions = result.get("partitions")
        if type(partitions) is not int or partitions < 1:
            raise DelaywheelError(f"{asked}: cluster gave partitions {partitions!r}", "internal")
        owners: list[str | None] = [None] * partitions
        for entry in result.get("owners") or ():
            if not isinstance(entry, Mapping):
                continue
            partition, address = entry.get("partition"), entry.get("address")
            if type(partition) is int and 0 <= partition < partitions:
                owners[partition] = address if isinstance(address, str) and address else None
        return cls(partitions, owners, dict(result))

    @classmethod
    def single(cls, address: str) -> PartitionMap:
        """The map of a server without ``cluster``: it owns everything."""
        raw = {
            "node": address,
            "partitions": 1,
            "lease_s": None,
            "owners": [{"partition": 0, "node": address, "address": address, "epoch": None}],
        }
        return cls(1, [address], raw)

    def owner_of(self, task_id: str) -> str | None:
        return self.owners[partition_of(task_id, self.partitions)]

    def nodes(self) -> list[str]:
        """The owners' addresses, each once, sorted (the order ``reserve`` rotates through)."""
        return sorted({address for address in self.owners if address is not None})

    def follow(self, data: Any) -> None:
        """Take a ``moved`` error's hint: ``data["owner"]`` owns ``data["partition"]``."""
        if not isinstance(data, Mapping):
            return
        partition, owner = data.get("partition"), data.get("owner")
        if type(partition) is int and 0 <= partition < self.partitions and isinstance(owner, str):
            self.owners[partition] = owner


def error_data(exc: DelaywheelError) -> Any:
    """The error's third element (``moved``'s owner, ``tryagain``'s wait), if it has one."""
    return getattr(exc, "data", None)


def retry_after_s(exc: DelaywheelError, attempt: int) -> float:
    """How long to sleep after ``tryagain`` (its ``retry_after_ms``) or an unreachable owner
    (a backoff from ``RETRY_MIN_S`` doubling to ``RETRY_MAX_S``)."""
    data = error_data(exc)
    if exc.code == "tryagain" and isinstance(data, Mapping):
        wait_ms = data.get("retry_after_ms")
        if isinstance(wait_ms, (int, float)) and wait_ms >= 0:
            return float(min(max(wait_ms / 1000, RETRY_MIN_S), FAILOVER_TIMEOUT_S))
    return float(min(RETRY_MIN_S * 2 ** min(attempt, 8), RETRY_MAX_S))


def may_resend(method: str, exc: ConnectionFailed) -> bool:
    """Whether a call that failed with ``exc`` may go to the (new) owner again: when it was
    never sent, when it is read-only, or when it is ``add`` (it always carries an id, so an
    add that did land answers ``exists``, which the caller checks)."""
    from delaywheel_client.methods import READ_ONLY_METHODS

    if getattr(exc, "closed_by", None) is not None:
        return False
    sent_maybe_applied = bool(getattr(exc, "maybe_applied", False))
    return not sent_maybe_applied or method in READ_ONLY_METHODS or method == "add"


def same_task(fields: Mapping[str, Any], stored: Any) -> bool:
    """Whether ``stored`` (``get``'s task) is the task ``fields`` (an ``add``'s map) added:
    same topic and body. An ``exists`` that answers a resent add of the same task is the
    first send having landed; anything else is another task with that id."""
    return (
        isinstance(stored, Mapping)
        and stored.get("topic") == fields.get("topic")
        and stored.get("body") == fields.get("body")
    )


def added_result(task_id: str, stored: Mapping[str, Any]) -> dict[str, Any]:
    """``add``'s result for a task that was already there: its id and time."""
    result = {"id": task_id, "at": stored.get("at")}
    for key in ("cycle", "slot"):
        if key in stored:
            result[key] = stored[key]
    return result


def route(method: str, params: Sequence[Any]) -> str | None:
    """The task id a call is routed by, or None for a call any node answers."""
    if method in ID_METHODS and params and isinstance(params[0], str):
        return params[0]
    if method == "add" and params and isinstance(params[0], Mapping):
        task_id = params[0].get("id")
        return task_id if isinstance(task_id, str) else None
    return None


def with_id(method: str, params: Sequence[Any]) -> tuple[Any, ...]:
    """``params`` with an id given to an ``add`` (or each task of ``add_many``) that has none."""
    if method == "add" and params and isinstance(params[0], Mapping) and "id" not in params[0]:
        return ({**params[0], "id": new_task_id()}, *params[1:])
    if method == "add_many" and params and isinstance(params[0], Sequence):
        tasks = [
            {**t, "id": new_task_id()} if isinstance(t, Mapping) and "id" not in t else t
            for t in params[0]
        ]
        return (tasks, *params[1:])
    return tuple(params)
