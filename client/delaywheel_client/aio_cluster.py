"""The asyncio client for several nodes: ``AsyncClusterClient``, ``AsyncClient``'s methods.

It routes, follows ``moved``, waits out ``tryagain`` and resends ``add`` exactly as
``ClusterClient`` does (cluster.py, routing.py; docs/protocol.md, "Several nodes"), with
one ``AsyncClient`` per node.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

from delaywheel_client.aio import AsyncClient
from delaywheel_client.calls import (
    Task,
    TaskList,
    Topics,
    list_query,
    schedule_query,
    task_fields,
)
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


class AsyncClusterClient(ClusterBase[AsyncClient]):
    """An asyncio client for several delaywheel nodes; every ``ClusterClient`` method, as a
    coroutine.

    Example::

        async with AsyncClusterClient(["10.0.0.1:3450", "10.0.0.2:3450"]) as dw:
            await dw.add("emails", {"to": "a@example.com"}, delay=30)
            task = await dw.reserve("emails", timeout=5)

    ``seeds`` and the keywords are ``ClusterClient``'s. The map is fetched by the first
    call (or by ``connect``).
    """

    _node_class = AsyncClient

    @classmethod
    async def connect(cls, seeds: str | Sequence[str], **kw: Any) -> AsyncClusterClient:
        """A client with the map fetched (``kw`` as ``__init__``)."""
        client = cls(seeds, **kw)
        await client.refresh()
        return client

    async def refresh(self) -> PartitionMap:
        """Fetch the map again, from the known nodes and then the seeds, first answer wins."""
        pmap: PartitionMap = await self._run(refresh_call(self))
        return pmap

    async def partition_map(self) -> PartitionMap:
        """The map as last fetched (fetched now if it never was)."""
        return self._map if self._map is not None else await self.refresh()

    # -- routed calls ----------------------------------------------------------

    async def _routed(
        self, method: str, params: Sequence[Any], task_id: str | None, resent: bool = False
    ) -> Any:
        """``method`` on the owner of ``task_id`` (any node when None); retry.py's rules."""
        return await self._run(routed_call(self, method, params, task_id, resent))

    async def _run(self, plan: Plan) -> Any:
        """Carry out a retry.py plan with asyncio I/O; its return value."""
        answer: Any = None
        while True:
            try:
                op = plan.send(answer)
            except StopIteration as done:
                return done.value
            if isinstance(op, Send):
                try:
                    answer = await self.node(op.address).call(op.method, *op.params)
                except DelaywheelError as exc:
                    answer = exc
            elif isinstance(op, SendMany):
                try:
                    answer = await self.node(op.address)._call_many(op.calls, op.timeout_s)
                except DelaywheelError as exc:
                    answer = exc
            elif isinstance(op, Pause):
                self._follow(op.step.hint)
                if op.step.wait_s > 0:
                    await asyncio.sleep(op.step.wait_s)
                await self._refresh_quietly()
                answer = None
            else:  # FETCH_MAP
                answer = await self.partition_map()

    async def _refresh_quietly(self) -> None:
        # Every node unreachable: the call's own retry says so.
        with contextlib.suppress(ConnectionFailed):
            await self.refresh()

    async def _each_node(
        self, fn: Callable[[AsyncClient], Awaitable[_T]]
    ) -> dict[str, _T | DelaywheelError]:
        nodes = self._all_nodes(await self.partition_map())
        answers = await asyncio.gather(
            *(fn(self.node(address)) for address in nodes), return_exceptions=True
        )
        results: dict[str, _T | DelaywheelError] = {}
        for address, answer in zip(nodes, answers, strict=True):
            if isinstance(answer, BaseException) and not isinstance(answer, DelaywheelError):
                raise answer
            results[address] = answer
        return results

    async def close(self) -> None:
        """Close every node's connection."""
        for client in self._close_nodes():
            await client.close()

    async def __aenter__(self) -> AsyncClusterClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- methods: ClusterClient's, as coroutines, with Client's docstrings -----------------

    async def call(self, method: str, *params: Any) -> Any:
        """Any method by name, with the protocol's params: ``call("get", "task-1")``."""
        return await self._run(call_plan(self, method, with_id(method, params), False))

    async def ping(self) -> str:
        """``"pong"``."""
        for result in (await self._each_node(lambda client: client.ping())).values():
            if isinstance(result, DelaywheelError):
                raise result
        return "pong"

    async def add(
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
        result: Task = await self.call("add", fields)
        return result

    async def add_many(self, tasks: Iterable[Mapping[str, Any]]) -> TaskList:
        """Add task maps all or nothing; returns ``add``'s result for each, in order."""
        (given,) = with_id("add_many", ([dict(t) for t in tasks],))
        results: TaskList = await self._run(add_many_call(self, given))
        return results

    async def update(self, id: str, **changes: Any) -> Task:
        """Change ``delay``/``at``, ``body``, ``topic``, ``ttr``, ``target`` or
        ``max_attempts``; returns the updated task."""
        result: Task = await self._routed("update", (id, changes), id)
        return result

    async def delete(self, id: str) -> bool:
        """True if the task existed."""
        return bool(await self._routed("delete", (id,), id))

    async def get(self, id: str) -> Task | None:
        """The task, or None."""
        result: Task | None = await self._routed("get", (id,), id)
        return result

    async def reserve(self, topics: Topics, timeout: float = 0) -> Task | None:
        """The oldest ready task of ``topics``, now reserved, or None after ``timeout`` s."""
        task: Task | None = await self._run(reserve_call(self, topics, timeout))
        return task

    async def ack(self, id: str) -> bool:
        """The reserved task is done and removed."""
        return bool(await self._routed("ack", (id,), id))

    async def release(self, id: str, delay: float = 0) -> bool:
        """Put a reserved task back, due after ``delay`` seconds."""
        return bool(await self._routed("release", (id, delay), id))

    async def touch(self, id: str) -> float:
        """Extend a reservation by its ttr; returns the new deadline (Unix s)."""
        result: float = await self._routed("touch", (id,), id)
        return result

    async def kick(self, topic: str, count: int) -> int:
        """Make up to ``count`` dead tasks of ``topic`` ready again; returns how many."""
        kicked = 0
        for address in self._all_nodes(await self.partition_map()):
            if kicked >= count:
                break
            kicked += int(await self.node(address).kick(topic, count - kicked))
        return kicked

    async def kick_task(self, task_id: str) -> bool:
        """Make one dead task ready again (due now, if it has a target); True."""
        return bool(await self._routed("kick_task", (task_id,), task_id))

    async def schedule_next(
        self, schedule: str | Mapping[str, Any], n: int | None = None
    ) -> dict[str, Any]:
        """The next ``n`` (1-1000, default 5) times of a schedule id or unsaved spec map
        (``cron``, ``tz`` or ``every``, ``anchor``): ``{"times", "description"}``."""
        params = (schedule,) if n is None else (schedule, n)
        # A saved schedule lives in the partition of its id; a spec needs no node's state.
        owner = schedule if isinstance(schedule, str) else None
        result: dict[str, Any] = await self._routed("schedule_next", params, owner)
        return result

    async def stats(self) -> dict[str, Any]:
        """Counts by state and topic, wheel settings, store URL, uptime, version, ..."""
        return stats_by_node(await self._each_node(lambda client: client.stats()))

    async def cluster(self) -> dict[str, Any]:
        """The keyspace's partition map: ``{"node", "partitions", "lease_s", "owners":
        [{"partition", "node", "address", "epoch"}, ...]}`` (docs/ha.md)."""
        return (await self.refresh()).answer()

    def pipeline(self) -> AsyncClusterPipeline:
        """Queue calls and send them together, one batch per owner::

        async with dw.pipeline() as pipe:  # executes on a clean exit
            for n in range(1000):
                pipe.add("thumbnails", {"image": n})
        first_id = pipe.results[0]["id"]
        """
        return AsyncClusterPipeline(self)

    async def iter_tasks(
        self, *, topic: str | None = None, state: str | None = None, page_size: int = 1000
    ) -> AsyncIterator[Task]:
        cursor = None
        while True:
            page = await self.list(topic=topic, state=state, limit=page_size, cursor=cursor)
            for task in page["tasks"]:
                yield task
            cursor = page["next"]
            if cursor is None:
                return

    async def schedule_add(self, schedule: Mapping[str, Any]) -> dict[str, Any]:
        """Save a recurring schedule (``id``, ``cron``+``tz`` or ``every``, the task template,
        policies; docs/schedules.md): the schedule map with its state."""
        result: dict[str, Any] = await self._routed(
            "schedule_add", (dict(schedule),), schedule.get("id")
        )
        return result

    async def schedule_update(
        self, schedule_id: str, changes: Mapping[str, Any], expected_version: int | None = None
    ) -> dict[str, Any]:
        """Change a schedule (null removes a field); a stale ``expected_version`` raises
        ``Conflict``. The next occurrence is the first after max(now, last_fired)."""
        result: dict[str, Any] = await self._routed(
            "schedule_update",
            (schedule_id, dict(changes))
            if expected_version is None
            else (schedule_id, dict(changes), expected_version),
            schedule_id,
        )
        return result

    async def schedule_pause(self, schedule_id: str, note: str | None = None) -> dict[str, Any]:
        """Pause a schedule (its pending occurrence goes in the same write), with a note."""
        result: dict[str, Any] = await self._routed(
            "schedule_pause", (schedule_id,) if note is None else (schedule_id, note), schedule_id
        )
        return result

    async def schedule_resume(self, schedule_id: str) -> dict[str, Any]:
        """Resume a paused schedule from now (what passed while paused is not fired)."""
        result: dict[str, Any] = await self._routed("schedule_resume", (schedule_id,), schedule_id)
        return result

    async def schedule_delete(self, schedule_id: str) -> bool:
        """Delete a schedule; True if it existed (occurrences already put stay tasks)."""
        result: bool = await self._routed("schedule_delete", (schedule_id,), schedule_id)
        return result

    async def schedule_get(self, schedule_id: str) -> dict[str, Any] | None:
        """A schedule's map with ``version``, ``paused``, ``note``, ``next``, ``last_fired``,
        ``counts``; None if there is none."""
        result: dict[str, Any] | None = await self._routed(
            "schedule_get", (schedule_id,), schedule_id
        )
        return result

    async def schedule_list(
        self,
        *,
        topic: str | None = None,
        paused: bool | None = None,
        limit: int | None = None,
        cursor: Any = None,
    ) -> dict[str, Any]:
        """One page: ``{"schedules": [...], "next": cursor or None}`` (limit <= 1000)."""
        nodes = self._all_nodes(await self.partition_map())
        address, inner = list_start(nodes, cursor)
        query = schedule_query(topic, paused, limit, inner)
        page = await self.node(address).call("schedule_list", query)
        return list_page(nodes, address, page, "schedules")

    async def schedule_trigger(self, schedule_id: str) -> dict[str, Any]:
        """One extra occurrence now: ``{"id": its task id}``."""
        result: dict[str, Any] = await self._routed("schedule_trigger", (schedule_id,), schedule_id)
        return result

    async def schedule_backfill(self, schedule_id: str, start: float, end: float) -> dict[str, Any]:
        """Fire the occurrences in [start, min(end, now)] under their own ids (Unix s):
        ``{"ids": [...put], "existing": n}``."""
        result: dict[str, Any] = await self._routed(
            "schedule_backfill", (schedule_id, start, end), schedule_id
        )
        return result

    async def list(
        self,
        *,
        topic: str | None = None,
        state: str | None = None,
        limit: int | None = None,
        cursor: Any = None,
    ) -> dict[str, Any]:
        """One page: ``{"tasks": [...], "next": cursor or None}`` (limit <= 1000)."""
        nodes = self._all_nodes(await self.partition_map())
        address, inner = list_start(nodes, cursor)
        page = await self.node(address).call("list", list_query(topic, state, limit, inner))
        return list_page(nodes, address, page)


class AsyncClusterPipeline(QueuedCalls):
    """Queued calls for ``AsyncClusterClient``, one batch per owner; see ``ClusterPipeline``.
    ``await execute()`` returns the results in call order."""

    def __init__(self, client: AsyncClusterClient) -> None:
        super().__init__(client.timeout_s)
        self._client = client

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        calls, timeout_s = self._take()
        results = await self._client._run(pipeline_call(self._client, calls, timeout_s))
        return self._settled(results, raise_on_error)

    async def __aenter__(self) -> AsyncClusterPipeline:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        if exc_type is None:
            await self.execute()
        else:
            self._take()


__all__ = ["AsyncClusterClient", "AsyncClusterPipeline"]
