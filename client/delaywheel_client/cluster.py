"""The blocking client for several nodes: ``ClusterClient``, with ``Client``'s methods.

How it works. It asks a seed for the partition map (``cluster``), keeps one ``Client`` per
node, and sends each call about a task to the node that owns the task's partition
(``zlib.crc32(id) % partitions``). The rules (retry.py, written once for this client and
``AsyncClusterClient``, which run its plans with their own I/O; docs/protocol.md,
"Several nodes: the clients"):

- ``moved``: the hint is taken, the map fetched again, and the call resent, at most 3
  times in a row. An ``add_many`` refused so is grouped again by the fetched map.
- ``tryagain`` (no owner yet), an owner that cannot be reached, or one that closed the
  connection saying ``unavailable``: sleep ``retry_after_ms`` (or back off), fetch the
  map, resend, for up to ``failover_timeout_s``.
- Outcome unknown (``unavailable``, a reply lost after sending): ``add``, ``add_many``
  and reads are resent at most 3 times; other writes raise.
- ``add`` always sends an id (``uuid4().hex`` unless given), so a resend is safe: when a
  resent add answers ``exists`` and the stored task has the same id, topic and body, the
  first send landed and the add succeeds; otherwise ``Exists`` is raised.
- ``reserve`` polls every node in turn, starting one node further on each call, so none is
  starved; a blocking one waits on one node at a time for at most ``reserve_slice_s``,
  polling the others in between.
- ``stats`` answers ``{"nodes": {address: that node's stats, or {"error": message}},
  "tasks": the sum}``; ``kick`` and ``list`` visit every node (``list``'s cursor names the
  node it is on); ``ping`` pings every node.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

from delaywheel_client.calls import (
    Task,
    TaskList,
    Topics,
    list_query,
    schedule_query,
    task_fields,
)
from delaywheel_client.client import Client
from delaywheel_client.errors import ConnectionFailed, DelaywheelError
from delaywheel_client.pipeline import QueuedCalls
from delaywheel_client.retry import (
    Pause,
    Plan,
    Send,
    SendMany,
    add_many_call,
    call_plan,
    pipeline_call,
    refresh_call,
    reserve_call,
    routed_call,
)
from delaywheel_client.routing import (
    ClusterBase,
    PartitionMap,
    list_page,
    list_start,
    stats_by_node,
    with_id,
)

_T = TypeVar("_T")


class ClusterClient(ClusterBase[Client]):
    """A blocking client for several delaywheel nodes on one keyspace, safe to share
    between threads.

    Example::

        dw = ClusterClient(["10.0.0.1:3450", "10.0.0.2:3450"], token="secret")
        dw.add("emails", {"to": "a@example.com"}, delay=30)  # to the id's owner
        task = dw.reserve("emails", timeout=5)                # from whichever node has one

    ``seeds`` are ``"host:port"`` strings (a list, or one comma-separated string); any one
    that answers gives the map. The other keywords are ``Client``'s, used for every node,
    and ``failover_timeout_s`` and ``reserve_slice_s`` (see the module docstring).
    """

    _node_class = Client

    def refresh(self) -> PartitionMap:
        """Fetch the map again, from the known nodes and then the seeds, first answer wins."""
        pmap: PartitionMap = self._run(refresh_call(self))
        return pmap

    def partition_map(self) -> PartitionMap:
        """The map as last fetched (fetched now if it never was)."""
        return self._map if self._map is not None else self.refresh()

    # -- routed calls ----------------------------------------------------------

    def _routed(
        self, method: str, params: Sequence[Any], task_id: str | None, resent: bool = False
    ) -> Any:
        """``method`` on the owner of ``task_id`` (any node when None); retry.py's rules."""
        return self._run(routed_call(self, method, params, task_id, resent))

    def _run(self, plan: Plan) -> Any:
        """Carry out a retry.py plan with blocking I/O; its return value."""
        answer: Any = None
        while True:
            try:
                op = plan.send(answer)
            except StopIteration as done:
                return done.value
            if isinstance(op, Send):
                try:
                    answer = self.node(op.address).call(op.method, *op.params)
                except DelaywheelError as exc:
                    answer = exc
            elif isinstance(op, SendMany):
                try:
                    answer = self.node(op.address)._call_many(op.calls, op.timeout_s)
                except DelaywheelError as exc:
                    answer = exc
            elif isinstance(op, Pause):
                self._follow(op.step.hint)
                if op.step.wait_s > 0:
                    time.sleep(op.step.wait_s)
                self._refresh_quietly()
                answer = None
            else:  # FETCH_MAP
                answer = self.partition_map()

    def _refresh_quietly(self) -> None:
        # Every node unreachable: the call's own retry says so.
        with contextlib.suppress(ConnectionFailed):
            self.refresh()

    def _each_node(self, fn: Callable[[Client], _T]) -> dict[str, _T | DelaywheelError]:
        results: dict[str, _T | DelaywheelError] = {}
        for address in self._all_nodes(self.partition_map()):
            try:
                results[address] = fn(self.node(address))
            except DelaywheelError as exc:
                results[address] = exc
        return results

    def close(self) -> None:
        """Close every node's connections."""
        for client in self._close_nodes():
            client.close()

    def __enter__(self) -> ClusterClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- methods ---------------------------------------------------------------

    def call(self, method: str, *params: Any) -> Any:
        """Any method by name, with the protocol's params: ``call("get", "task-1")``."""
        return self._run(call_plan(self, method, with_id(method, params), False))

    def ping(self) -> str:
        """``"pong"``."""
        for result in self._each_node(lambda client: client.ping()).values():
            if isinstance(result, DelaywheelError):
                raise result
        return "pong"

    def add(
        self,
        topic: str,
        body: Any = None,
        *,
        delay: float | None = None,
        at: float | None = None,
        id: str | None = None,
        ttr: float | None = None,
        max_attempts: int | None = None,
        target: Mapping[str, Any] | None = None,
    ) -> Task:
        """Add a task; returns ``{"id", "at", "cycle", "slot"}``. Keys left None are not sent
        (the server's defaults apply: due now, ttr 60 s, 5 attempts, the ready queue)."""
        fields = task_fields(topic, body, delay, at, id, ttr, max_attempts, target)
        result: Task = self.call("add", fields)
        return result

    def add_many(self, tasks: Iterable[Mapping[str, Any]]) -> TaskList:
        """Add task maps all or nothing; returns ``add``'s result for each, in order."""
        (given,) = with_id("add_many", ([dict(t) for t in tasks],))
        results: TaskList = self._run(add_many_call(self, given))
        return results

    def update(self, id: str, **changes: Any) -> Task:
        """Change ``delay``/``at``, ``body``, ``topic``, ``ttr``, ``target`` or
        ``max_attempts``; returns the updated task."""
        result: Task = self._routed("update", (id, changes), id)
        return result

    def delete(self, id: str) -> bool:
        """True if the task existed."""
        return bool(self._routed("delete", (id,), id))

    def get(self, id: str) -> Task | None:
        """The task, or None."""
        result: Task | None = self._routed("get", (id,), id)
        return result

    def reserve(self, topics: Topics, timeout: float = 0) -> Task | None:
        """The oldest ready task of ``topics``, now reserved, or None after ``timeout`` s."""
        task: Task | None = self._run(reserve_call(self, topics, timeout))
        return task

    def ack(self, id: str) -> bool:
        """The reserved task is done and removed."""
        return bool(self._routed("ack", (id,), id))

    def release(self, id: str, delay: float = 0) -> bool:
        """Put a reserved task back, due after ``delay`` seconds."""
        return bool(self._routed("release", (id, delay), id))

    def touch(self, id: str) -> float:
        """Extend a reservation by its ttr; returns the new deadline (Unix s)."""
        result: float = self._routed("touch", (id,), id)
        return result

    def kick(self, topic: str, count: int) -> int:
        """Make up to ``count`` dead tasks of ``topic`` ready again; returns how many."""
        kicked = 0
        for address in self._all_nodes(self.partition_map()):
            if kicked >= count:
                break
            kicked += int(self.node(address).kick(topic, count - kicked))
        return kicked

    def kick_task(self, task_id: str) -> bool:
        """Make one dead task ready again (due now, if it has a target); True."""
        return bool(self._routed("kick_task", (task_id,), task_id))

    def schedule_next(
        self, schedule: str | Mapping[str, Any], n: int | None = None
    ) -> dict[str, Any]:
        """The next ``n`` (1-1000, default 5) times of a schedule id or unsaved spec map
        (``cron``, ``tz`` or ``every``, ``anchor``): ``{"times", "description"}``."""
        params = (schedule,) if n is None else (schedule, n)
        # A saved schedule lives in the partition of its id; a spec needs no node's state.
        owner = schedule if isinstance(schedule, str) else None
        result: dict[str, Any] = self._routed("schedule_next", params, owner)
        return result

    def stats(self) -> dict[str, Any]:
        """Counts by state and topic, wheel settings, store URL, uptime, version, ..."""
        return stats_by_node(self._each_node(lambda client: client.stats()))

    def cluster(self) -> dict[str, Any]:
        """The keyspace's partition map: ``{"node", "partitions", "lease_s", "owners":
        [{"partition", "node", "address", "epoch"}, ...]}`` (docs/ha.md)."""
        return self.refresh().answer()

    def pipeline(self) -> ClusterPipeline:
        """A batch: queue calls, then send them in one write and read every reply.

        Example::

            with dw.pipeline() as pipe:  # executes on a clean exit
                for n in range(1000):
                    pipe.add("thumbnails", {"image": n})
            first_id = pipe.results[0]["id"]
        """
        return ClusterPipeline(self)

    def iter_tasks(
        self, *, topic: str | None = None, state: str | None = None, page_size: int = 1000
    ) -> Iterator[Task]:
        """Every matching task, following ``list``'s ``next`` cursor page by page."""
        cursor = None
        while True:
            page = self.list(topic=topic, state=state, limit=page_size, cursor=cursor)
            yield from page["tasks"]
            cursor = page["next"]
            if cursor is None:
                return

    # Defined last: inside the class body, the name ``list`` is this method from here on.
    def schedule_add(self, schedule: Mapping[str, Any]) -> dict[str, Any]:
        """Save a recurring schedule (``id``, ``cron``+``tz`` or ``every``, the task template,
        policies; docs/schedules.md): the schedule map with its state."""
        result: dict[str, Any] = self._routed("schedule_add", (dict(schedule),), schedule.get("id"))
        return result

    def schedule_update(
        self, schedule_id: str, changes: Mapping[str, Any], expected_version: int | None = None
    ) -> dict[str, Any]:
        """Change a schedule (null removes a field); a stale ``expected_version`` raises
        ``Conflict``. The next occurrence is the first after max(now, last_fired)."""
        result: dict[str, Any] = self._routed(
            "schedule_update",
            (schedule_id, dict(changes))
            if expected_version is None
            else (schedule_id, dict(changes), expected_version),
            schedule_id,
        )
        return result

    def schedule_pause(self, schedule_id: str, note: str | None = None) -> dict[str, Any]:
        """Pause a schedule (its pending occurrence goes in the same write), with a note."""
        result: dict[str, Any] = self._routed(
            "schedule_pause", (schedule_id,) if note is None else (schedule_id, note), schedule_id
        )
        return result

    def schedule_resume(self, schedule_id: str) -> dict[str, Any]:
        """Resume a paused schedule from now (what passed while paused is not fired)."""
        result: dict[str, Any] = self._routed("schedule_resume", (schedule_id,), schedule_id)
        return result

    def schedule_delete(self, schedule_id: str) -> bool:
        """Delete a schedule; True if it existed (occurrences already put stay tasks)."""
        result: bool = self._routed("schedule_delete", (schedule_id,), schedule_id)
        return result

    def schedule_get(self, schedule_id: str) -> dict[str, Any] | None:
        """A schedule's map with ``version``, ``paused``, ``note``, ``next``, ``last_fired``,
        ``counts``; None if there is none."""
        result: dict[str, Any] | None = self._routed("schedule_get", (schedule_id,), schedule_id)
        return result

    def schedule_list(
        self,
        *,
        topic: str | None = None,
        paused: bool | None = None,
        limit: int | None = None,
        cursor: Any = None,
    ) -> dict[str, Any]:
        """One page: ``{"schedules": [...], "next": cursor or None}`` (limit <= 1000)."""
        nodes = self._all_nodes(self.partition_map())
        address, inner = list_start(nodes, cursor)
        query = schedule_query(topic, paused, limit, inner)
        page = self.node(address).call("schedule_list", query)
        return list_page(nodes, address, page, "schedules")

    def schedule_trigger(self, schedule_id: str) -> dict[str, Any]:
        """One extra occurrence now: ``{"id": its task id}``."""
        result: dict[str, Any] = self._routed("schedule_trigger", (schedule_id,), schedule_id)
        return result

    def schedule_backfill(self, schedule_id: str, start: float, end: float) -> dict[str, Any]:
        """Fire the occurrences in [start, min(end, now)] under their own ids (Unix s):
        ``{"ids": [...put], "existing": n}``."""
        result: dict[str, Any] = self._routed(
            "schedule_backfill", (schedule_id, start, end), schedule_id
        )
        return result

    def list(
        self,
        *,
        topic: str | None = None,
        state: str | None = None,
        limit: int | None = None,
        cursor: Any = None,
    ) -> dict[str, Any]:
        """One page: ``{"tasks": [...], "next": cursor or None}`` (limit <= 1000)."""
        nodes = self._all_nodes(self.partition_map())
        address, inner = list_start(nodes, cursor)
        page = self.node(address).call("list", list_query(topic, state, limit, inner))
        return list_page(nodes, address, page)


class ClusterPipeline(QueuedCalls):
    """Queued calls, sent as one batch per owner by ``execute()``; see ``Client.pipeline()``.

    Each call goes to its task's owner (calls about no task to one node); a call answered
    ``moved`` or ``tryagain``, or whose node could not be reached before anything was sent,
    is sent again on its own as ``ClusterClient`` sends it. Results come in call order, as
    in ``Pipeline``.
    """

    def __init__(self, client: ClusterClient) -> None:
        super().__init__(client.timeout_s)
        self._client = client

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        calls, timeout_s = self._take()
        results = self._client._run(pipeline_call(self._client, calls, timeout_s))
        return self._settled(results, raise_on_error)

    def __enter__(self) -> ClusterPipeline:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.execute()
        else:
            self._take()


__all__ = ["ClusterClient", "ClusterPipeline"]
