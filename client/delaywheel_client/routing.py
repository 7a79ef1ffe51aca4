"""What both cluster clients share, without any I/O: the partition map, the hash, and the
rules for ``moved``, ``tryagain`` and a node that cannot be reached.

A task's partition is ``zlib.crc32(id as UTF-8) % partitions`` (an occurrence
``s:{X}:{digits}`` hashes ``X``: partitions.py; docs/protocol.md), and the
map from ``cluster`` names each partition's owner by its ``address`` (``"host:port"``). A
server older than the ``cluster`` method answers ``no_method``: it owns every task, so the
map is one partition owned by that server.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Generic, TypeVar

from delaywheel_client._tls import PathLike
from delaywheel_client.commands import ROUTES
from delaywheel_client.connection import ClientBase, parse_url
from delaywheel_client.errors import ConnectionFailed, DelaywheelError
from delaywheel_client.partitions import partition_of

# ``moved`` is followed at once this many times in a row (each time with a fresh map);
# past that the nodes disagree about ownership for longer than a refresh (a partition
# moving: the old owner names the new one before the new one serves it), and each
# further follow waits a backoff first, until the call's deadline.
MOVED_AT_ONCE = 3

# How long one call keeps trying while its partition has no reachable owner (``tryagain``,
# or the owner's connection refused): a crashed owner's lease runs out within 2 leases
# (2 x 10 s by default), then a live node takes the partition over.
FAILOVER_TIMEOUT_S = 30.0

# A blocking ``reserve`` waits on one node at a time for at most this long, polling the
# others in between: a task that becomes ready on another node waits at most this long.
RESERVE_SLICE_S = 0.5

# ``reserve`` fetches the map again when it is older than this: it asks the nodes of the
# map, and a node that joined (or came back) since is in no map taken before, while no
# reserve is ever answered ``moved`` to say so. One ``cluster`` a client at most this often.
MAP_MAX_AGE_S = 5.0

# Sleep bounds between tries while a partition has no owner that answers.
RETRY_MIN_S = 0.05
RETRY_MAX_S = 1.0


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


@dataclasses.dataclass(frozen=True)
class PartitionMap:
    """Who owns which partition, as one node described it. ``owners[p]`` is the address of
    partition ``p``'s owner, or None while it has none.

    Immutable: a client replaces its map whole (``ClusterBase._map``, one reference), so a
    thread or task that took it goes on reading one consistent snapshot while another
    follows a ``moved`` hint or fetches the map anew."""

    partitions: int
    owners: tuple[str | None, ...]
    raw: Mapping[str, Any]

    def __post_init__(self) -> None:
        # A list given by hand (tests, a caller's own map) is frozen too.
        object.__setattr__(self, "owners", tuple(self.owners))

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
        return cls(partitions, tuple(owners), copy.deepcopy(dict(result)))

    @classmethod
    def single(cls, address: str) -> PartitionMap:
        """The map of a server without ``cluster``: it owns everything."""
        raw = {
            "node": address,
            "partitions": 1,
            "lease_s": None,
            "owners": [{"partition": 0, "node": address, "address": address, "epoch": None}],
        }
        return cls(1, (address,), raw)

    def owner_of(self, task_id: str) -> str | None:
        return self.owners[partition_of(task_id, self.partitions)]

    def nodes(self) -> list[str]:
        """The owners' addresses, each once, sorted (the order ``reserve`` rotates through)."""
        return sorted({address for address in self.owners if address is not None})

    def followed(self, data: Any) -> PartitionMap:
        """This map with a ``moved`` error's hint taken: ``data["owner"]`` owns
        ``data["partition"]``. A hint that names no partition of this map changes nothing."""
        if not isinstance(data, Mapping):
            return self
        partition, owner = data.get("partition"), data.get("owner")
        if type(partition) is not int or not 0 <= partition < self.partitions:
            return self
        if not isinstance(owner, str) or self.owners[partition] == owner:
            return self
        owners = list(self.owners)
        owners[partition] = owner
        return dataclasses.replace(self, owners=tuple(owners))

    def answer(self) -> dict[str, Any]:
        """The ``cluster`` result this map came from, a copy the caller may change."""
        return copy.deepcopy(dict(self.raw))


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


def route(method: str, params: Sequence[Any]) -> str | None:
    """The task id a call is routed by (the param commands.py names for its method), or
    None for a call any node answers."""
    rule = ROUTES.get(method)
    return None if rule is None else rule(params)


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


def group_by_owner(
    calls: Sequence[tuple[str, Sequence[Any]]], pmap: PartitionMap, any_node: Callable[[], str]
) -> dict[str, list[int]]:
    """A pipeline's calls (their indexes) by the node each goes to: its task's owner, or
    ``any_node()`` for a call about no task or a partition without an owner."""
    groups: dict[str, list[int]] = {}
    for index, (method, params) in enumerate(calls):
        task_id = route(method, params)
        owner = pmap.owner_of(task_id) if task_id is not None else None
        groups.setdefault(owner or any_node(), []).append(index)
    return groups


def list_start(nodes: Sequence[str], cursor: Any) -> tuple[str, Any]:
    """Where a cluster ``list`` page starts: (node, that node's cursor). The cluster's
    cursor is ``[address, the node's cursor]``, the nodes visited in sorted order."""
    if cursor is None:
        return nodes[0], None
    if isinstance(cursor, Sequence) and len(cursor) == 2 and cursor[0] in nodes:
        return cursor[0], cursor[1]
    raise ValueError(f"not a cursor of this cluster's list: {cursor!r}")


def list_page(
    nodes: Sequence[str], address: str, page: Mapping[str, Any], key: str = "tasks"
) -> dict[str, Any]:
    """The cluster's page from one node's (``list``'s, or ``schedule_list``'s with ``key``
    ``"schedules"``): ``next`` goes on at that node, then the next."""
    if page["next"] is not None:
        return {key: page[key], "next": [address, page["next"]]}
    after = nodes.index(address) + 1
    following = [nodes[after], None] if after < len(nodes) else None
    return {key: page[key], "next": following}


def stats_by_node(results: Mapping[str, Any]) -> dict[str, Any]:
    """``stats`` of a cluster: each node's (``{"error": ...}`` for one that failed) and the
    sum of their ``tasks``."""
    nodes: dict[str, Any] = {}
    tasks = 0
    for address, result in results.items():
        if isinstance(result, DelaywheelError):
            nodes[address] = {"error": str(result)}
        else:
            nodes[address] = result
            tasks += int(result.get("tasks") or 0)
    return {"nodes": nodes, "tasks": tasks}


_N = TypeVar("_N", bound=ClientBase)


class ClusterBase(Generic[_N]):
    """What ``ClusterClient`` and ``AsyncClusterClient`` share: the settings, one client
    per node (``_node_class``), the map as last fetched, and the rotation of nodes."""

    _node_class: ClassVar[type[Any]]

    def __init__(
        self,
        seeds: str | Sequence[str],
        token: str | None = None,
        *,
        timeout_s: float = 10.0,
        connect_timeout_s: float = 5.0,
        retries: int = 3,
        tls: Any = False,
        tls_ca: PathLike | None = None,
        tls_cert: PathLike | None = None,
        tls_key: PathLike | None = None,
        server_hostname: str | None = None,
        failover_timeout_s: float = FAILOVER_TIMEOUT_S,
        reserve_slice_s: float = RESERVE_SLICE_S,
    ) -> None:
        self.seeds = parse_seeds(seeds)
        self.token = token
        self.timeout_s = timeout_s
        self.failover_timeout_s = failover_timeout_s
        self.reserve_slice_s = reserve_slice_s
        self._node_kw: dict[str, Any] = {
            "token": token,
            "timeout_s": timeout_s,
            "connect_timeout_s": connect_timeout_s,
            "retries": retries,
            "tls": tls,
            "tls_ca": tls_ca,
            "tls_cert": tls_cert,
            "tls_key": tls_key,
            "server_hostname": server_hostname,
        }
        self._nodes: dict[str, _N] = {}
        self._lock = threading.Lock()
        self._map: PartitionMap | None = None
        self._map_s = 0.0  # when the map was fetched (monotonic)
        self._turn = 0  # where the next reserve starts in the node rotation
        self._closed = False

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {','.join(self.seeds)}>"

    def node(self, address: str) -> _N:
        """The client of one node, by its ``"host:port"`` (made on first use)."""
        with self._lock:
            client = self._nodes.get(address)
            if client is None:
                if self._closed:
                    raise ConnectionFailed(f"{address}: the client is closed")
                host, port = split_address(address)
                client = self._nodes[address] = self._node_class(host, port, **self._node_kw)
            return client

    def _refresh_order(self) -> list[str]:
        """Where to ask for the map: the nodes of the last map, then the seeds."""
        pmap = self._map
        known = pmap.nodes() if pmap is not None else []
        return list(dict.fromkeys([*known, *self.seeds]))

    def _take_map(self, address: str, answer: Any) -> PartitionMap:
        """The map from ``address``'s answer to ``cluster`` (an error raises, but
        ``no_method``: a server without partitions owns everything)."""
        if isinstance(answer, DelaywheelError):
            if answer.code != "no_method":
                raise answer
            pmap = PartitionMap.single(address)
        else:
            pmap = PartitionMap.from_cluster(answer, address)
        self._map = pmap  # replaced whole: readers keep the snapshot they took
        self._map_s = time.monotonic()
        return pmap

    def _map_is_old(self) -> bool:
        """The map was fetched over ``MAP_MAX_AGE_S`` ago (a ``moved`` hint taken since
        does not make it new: it names one partition's owner, not who joined)."""
        return self._map is not None and time.monotonic() - self._map_s > MAP_MAX_AGE_S

    def _follow(self, hint: Any) -> None:
        """Take a ``moved`` hint into the map (a new snapshot, made under the lock so that
        two threads' hints do not undo each other)."""
        if hint is None:
            return
        with self._lock:
            if self._map is not None:
                self._map = self._map.followed(hint)

    def _address_in(self, pmap: PartitionMap, task_id: str | None) -> str:
        """Where a call about ``task_id`` goes: its owner, or (no id, or no owner just
        now) the next node in turn."""
        owner = pmap.owner_of(task_id) if task_id is not None else None
        return owner or self._next_in_turn(pmap)

    def _next_in_turn(self, pmap: PartitionMap) -> str:
        """One node for a call that any node answers: a different one each time."""
        return self._rotate(pmap)[0]

    def _all_nodes(self, pmap: PartitionMap) -> list[str]:
        return pmap.nodes() or self.seeds[:1]

    def _rotate(self, pmap: PartitionMap) -> list[str]:
        """Every node, starting one further on at each call: no node is always last."""
        nodes = self._all_nodes(pmap)
        with self._lock:
            start = self._turn % len(nodes)
            self._turn += 1
        return nodes[start:] + nodes[:start]

    def _close_nodes(self) -> list[_N]:
        with self._lock:
            self._closed = True
            return list(self._nodes.values())
