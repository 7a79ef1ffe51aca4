"""The asyncio client for several nodes: ``AsyncClusterClient``, ``AsyncClient``'s methods.

It routes, follows ``moved``, waits out ``tryagain`` and resends ``add`` exactly as
``ClusterClient`` does: the methods are commands.py's and the calls plans.py's, which this
class runs with asyncio I/O, one ``AsyncClient`` per node (routing.py; docs/protocol.md,
"Several nodes").
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from delaywheel_client.aio import AsyncClient
from delaywheel_client.commands import Awaiting, Shape
from delaywheel_client.errors import ConnectionFailed, DelaywheelError
from delaywheel_client.pipeline import QueuedCalls
from delaywheel_client.plans import (
    Pause,
    Plan,
    Send,
    SendEach,
    SendMany,
    call_plan,
    method_plan,
    pipeline_call,
    refresh_call,
)
from delaywheel_client.routing import ClusterBase, PartitionMap, with_id
from delaywheel_client.serve import serve


@serve
class AsyncClusterClient(ClusterBase[AsyncClient], Awaiting):
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

    # -- how a call is sent ------------------------------------------------------

    async def _send(
        self, method: str, params: Sequence[Any], wait_s: float = 0.0, shape: Shape = None
    ) -> Any:
        result = await self._run(method_plan(self, method, params))
        return result if shape is None else shape(result)

    async def _by_name(self, method: str, params: Sequence[Any]) -> Any:
        return await self._run(call_plan(self, method, with_id(method, params), False))

    async def _run(self, plan: Plan) -> Any:
        """Carry out a plans.py plan with asyncio I/O; its return value."""
        answer: Any = None
        while True:
            try:
                op = plan.send(answer)
            except StopIteration as done:
                return done.value
            if isinstance(op, Send):
                try:
                    answer = await self.node(op.address)._by_name(op.method, op.params)
                except DelaywheelError as exc:
                    answer = exc
            elif isinstance(op, SendEach):
                answer = await self._each_node(op.addresses, op.method, op.params)
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
        self, addresses: Sequence[str], method: str, params: Sequence[Any]
    ) -> dict[str, Any]:
        """``method`` sent to every node at once: each one's answer or ``DelaywheelError``."""
        answers = await asyncio.gather(
            *(self.node(address)._by_name(method, params) for address in addresses),
            return_exceptions=True,
        )
        results: dict[str, Any] = {}
        for address, answer in zip(addresses, answers, strict=True):
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

    def pipeline(self) -> AsyncClusterPipeline:
        """Queue calls and send them together, one batch per owner::

        async with dw.pipeline() as pipe:  # executes on a clean exit
            for n in range(1000):
                pipe.add("thumbnails", {"image": n})
        first_id = pipe.results[0]["id"]
        """
        return AsyncClusterPipeline(self)


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
