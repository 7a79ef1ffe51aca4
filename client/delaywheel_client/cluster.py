"""The blocking client for several nodes: ``ClusterClient``, with ``Client``'s methods.

How it works. It asks a seed for the partition map (``cluster``), keeps one ``Client`` per
node, and sends each call about a task to the node that owns the task's partition
(``zlib.crc32(id) % partitions``). The methods are commands.py's; this class says only how
a call is sent: by running its plan (plans.py, written once for this client and
``AsyncClusterClient``, which run the plans with their own I/O). The rules (retry.py;
docs/protocol.md, "Several nodes: the clients"):

- ``moved``: the hint is taken, the map fetched again, and the call resent: at once 3
  times in a row, then after a backoff, until ``failover_timeout_s``. An ``add_many``
  refused so is grouped again by the fetched map.
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
  polling the others in between. The nodes are the map's, fetched again when it is older
  than ``MAP_MAX_AGE_S``: a node that joined since is polled too.
- ``stats`` answers ``{"nodes": {address: that node's stats, or {"error": message}},
  "tasks": the sum}``; ``kick`` and ``list`` visit every node (``list``'s cursor names the
  node it is on); ``ping`` pings every node. These too visit the map's nodes, the map
  fetched again first when older than ``MAP_MAX_AGE_S``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from delaywheel_client.client import Client
from delaywheel_client.commands import Blocking, Shape
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
class ClusterClient(ClusterBase[Client], Blocking):
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

    # -- how a call is sent ------------------------------------------------------

    def _send(
        self, method: str, params: Sequence[Any], wait_s: float = 0.0, shape: Shape = None
    ) -> Any:
        result = self._run(method_plan(self, method, params))
        return result if shape is None else shape(result)

    def _by_name(self, method: str, params: Sequence[Any]) -> Any:
        return self._run(call_plan(self, method, with_id(method, params), False))

    def _run(self, plan: Plan) -> Any:
        """Carry out a plans.py plan with blocking I/O; its return value."""
        answer: Any = None
        while True:
            try:
                op = plan.send(answer)
            except StopIteration as done:
                return done.value
            if isinstance(op, Send):
                try:
                    answer = self.node(op.address)._by_name(op.method, op.params)
                except DelaywheelError as exc:
                    answer = exc
            elif isinstance(op, SendEach):
                answer = {}
                for address in op.addresses:
                    try:
                        answer[address] = self.node(address)._by_name(op.method, op.params)
                    except DelaywheelError as exc:
                        answer[address] = exc
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

    def pipeline(self) -> ClusterPipeline:
        """A batch: queue calls, then send them in one write and read every reply.

        Example::

            with dw.pipeline() as pipe:  # executes on a clean exit
                for n in range(1000):
                    pipe.add("thumbnails", {"image": n})
            first_id = pipe.results[0]["id"]
        """
        return ClusterPipeline(self)


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
