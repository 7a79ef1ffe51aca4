"""How a cluster client retries, written once for ``ClusterClient`` and
``AsyncClusterClient``, without any I/O.

``Retry`` decides, error by error, whether a call is raised, sent again (after a wait
and a fresh map) or confirmed (a resent ``add`` answered ``exists``). ``routed_call``
and ``add_many_call`` are the calls themselves as generators of what to do next
(``FETCH_MAP``, ``Send``, ``Pause``): each client runs them with its own I/O, blocking
or asyncio (``ClusterClient._run``, ``AsyncClusterClient._run``), so the logic exists
once. docs/protocol.md, "Several nodes: the clients", states the rules for users.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any, NamedTuple, TypeAlias

from delaywheel_client.calls import topic_list
from delaywheel_client.errors import (
    ConnectionFailed,
    DelaywheelError,
    ServerClosed,
    error_from_reply,
)
from delaywheel_client.methods import READ_ONLY_METHODS
from delaywheel_client.protocol import Response
from delaywheel_client.routing import (
    MAX_MOVED_FOLLOWS,
    ClusterBase,
    PartitionMap,
    error_data,
    group_by_owner,
    retry_after_s,
    route,
    with_id,
)

# A call whose outcome is unknown (answered ``unavailable``, or its reply lost after it was
# sent) is sent again at most this many times, and only when sending it again is safe:
# an ``add``/``add_many`` (each task carries its id, so a send that landed answers
# ``exists``) or a read. Any other write raises at once: the caller decides.
MAX_UNKNOWN_RESENDS = 3
UNKNOWN_OUTCOME_RESENDABLE = READ_ONLY_METHODS | {"add", "add_many"}

# What ``Retry.after`` tells the client to do with a failed call.
RAISE = "raise"  # raise the error
RESEND = "resend"  # wait ``Step.wait_s`` (after following ``Step.hint``), refresh, resend
CONFIRM = "confirm"  # a resent add answered ``exists``: read the task, compare (same_task)


class Step(NamedTuple):
    action: str
    wait_s: float = 0.0
    hint: Any = None  # a ``moved`` error's data: the map takes it before the resend


@dataclasses.dataclass
class Retry:
    """One call's retry policy, the same for ``ClusterClient`` and ``AsyncClusterClient``:
    the client makes the call, and on each error asks ``after`` what to do next.

    - ``moved``: follow the hint, refresh, resend at once, at most ``MAX_MOVED_FOLLOWS``
      times in a row (a call that then gets through starts the count again).
    - ``tryagain``, an owner that cannot be reached (nothing was sent), and a node that
      closed the connection saying ``unavailable`` (over its connection limit, or going
      away): wait (``retry_after_ms``, or a backoff), refresh, resend, until ``deadline_s``.
    - outcome unknown (``unavailable``; a reply lost after sending): resend at most
      ``MAX_UNKNOWN_RESENDS`` times, for ``UNKNOWN_OUTCOME_RESENDABLE`` methods only.
    - ``exists`` on an ``add``/``add_many`` that was sent more than once: ``CONFIRM``.
    - anything else, or the deadline passed: ``RAISE``.
    """

    method: str
    deadline_s: float  # time.monotonic() after which no more waiting
    resent: bool = False  # sent more than once: an ``exists`` may be our own first send
    moved: int = 0
    waits: int = 0
    unknown: int = 0

    def after(self, exc: DelaywheelError, now_s: float) -> Step:
        if exc.code == "exists":
            confirm = self.resent and self.method in ("add", "add_many")
            return Step(CONFIRM if confirm else RAISE)
        step = self._step(exc, now_s)
        if step.action == RESEND:
            self.resent = True
        return step

    def progressed(self) -> None:
        """Part of the call got through (one owner's batch of an ``add_many``)."""
        self.moved = 0

    def _step(self, exc: DelaywheelError, now_s: float) -> Step:
        if isinstance(exc, ServerClosed):
            # The server said why it closed: ``unavailable`` (too many connections) is
            # said before reading anything; bad input or a size limit would come again.
            return self._wait(exc, now_s) if exc.code == "unavailable" else Step(RAISE)
        if isinstance(exc, ConnectionFailed):
            return self._unknown(exc, now_s) if exc.maybe_applied else self._wait(exc, now_s)
        if exc.code == "moved":
            if self.moved >= MAX_MOVED_FOLLOWS:
                return Step(RAISE)
            self.moved += 1
            return Step(RESEND, 0.0, error_data(exc))
        if exc.code == "tryagain":
            return self._wait(exc, now_s)
        if exc.code == "unavailable":
            return self._unknown(exc, now_s)
        return Step(RAISE)

    def _wait(self, exc: DelaywheelError, now_s: float) -> Step:
        if now_s >= self.deadline_s:
            return Step(RAISE)
        wait_s = min(retry_after_s(exc, self.waits), self.deadline_s - now_s)
        self.waits += 1
        return Step(RESEND, wait_s)

    def _unknown(self, exc: DelaywheelError, now_s: float) -> Step:
        resendable = self.method in UNKNOWN_OUTCOME_RESENDABLE
        if not resendable or self.unknown >= MAX_UNKNOWN_RESENDS or now_s >= self.deadline_s:
            return Step(RAISE)
        wait_s = min(retry_after_s(exc, self.unknown), self.deadline_s - now_s)
        self.unknown += 1
        return Step(RESEND, wait_s)


def same_task(fields: Mapping[str, Any], stored: Any) -> bool:
    """Whether ``stored`` (``get``'s task) is the task ``fields`` (an ``add``'s map) added:
    same id, topic and body. An ``exists`` that answers a resent add of the same task is
    the first send having landed; anything else is another task with that id."""
    return (
        isinstance(stored, Mapping)
        and stored.get("id") == fields.get("id")
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


def confirmed_adds(
    sent: Sequence[Mapping[str, Any]], stored: Sequence[Any], error: DelaywheelError
) -> list[dict[str, Any]]:
    """The results of resent adds that answered ``exists`` (``error``), when every task
    ``sent`` is stored as it was sent (``stored``: ``get`` of each id): the first send
    landed. Otherwise ``error`` is raised: the id is another task's."""
    if len(sent) != len(stored) or not all(map(same_task, sent, stored)):
        raise error
    return [added_result(fields["id"], task) for fields, task in zip(sent, stored, strict=True)]


class BatchPlan:
    """An ``add_many`` across owners: the tasks not yet added, grouped by the current map
    each time (so those a node refused with ``moved`` go to their new owner by the
    refreshed map), and the results in the caller's order."""

    def __init__(self, tasks: Sequence[Mapping[str, Any]]) -> None:
        self.tasks = list(tasks)
        self.results: list[Any] = [None] * len(self.tasks)
        self._left = list(range(len(self.tasks)))

    def next_group(
        self, pmap: PartitionMap, any_node: Callable[[], str]
    ) -> tuple[str, list[int]] | None:
        """The node and the task indexes of the next ``add_many`` to send, or None: done."""
        if not self._left:
            return None
        as_adds = [("add", (self.tasks[i],)) for i in self._left]
        address, positions = next(iter(group_by_owner(as_adds, pmap, any_node).items()))
        return address, [self._left[p] for p in positions]

    def batch(self, indexes: Sequence[int]) -> list[Mapping[str, Any]]:
        return [self.tasks[i] for i in indexes]

    def done(self, indexes: Sequence[int], answered: Sequence[Any]) -> None:
        """One node's ``add_many`` answered (one result per task, in order)."""
        if len(answered) != len(indexes):
            raise DelaywheelError(
                f"add_many of {len(indexes)} tasks answered {len(answered)} results", "internal"
            )
        for i, result in zip(indexes, answered, strict=True):
            self.results[i] = result
        finished = set(indexes)
        self._left = [i for i in self._left if i not in finished]


def needs_resend(method: str, reply: Response | None) -> bool:
    """Whether a pipelined call goes again on its own: it was never sent (None), its
    partition was elsewhere (``moved``) or had no owner (``tryagain``), or its outcome is
    unknown (``unavailable``) and it may be sent again (``UNKNOWN_OUTCOME_RESENDABLE``)."""
    if reply is None:
        return True
    error = reply.error
    if not (isinstance(error, list) and error):
        return False
    if error[0] == "unavailable":
        return method in UNKNOWN_OUTCOME_RESENDABLE
    return error[0] in ("moved", "tryagain")


# -- the calls, as generators the clients run ------------------------------------------------


class Send(NamedTuple):
    """Send ``method`` to ``address``; the answer (or the ``DelaywheelError``) comes back."""

    address: str
    method: str
    params: Sequence[Any]


class SendMany(NamedTuple):
    """Send ``calls`` to ``address`` as one pipelined batch within ``timeout_s``; the
    replies (``Response``s, in order) or the ``DelaywheelError`` come back."""

    address: str
    calls: Sequence[tuple[str, Sequence[Any]]]
    timeout_s: float


class Pause(NamedTuple):
    """Before a resend: take ``step.hint`` into the map, sleep ``step.wait_s``, refresh."""

    step: Step


FETCH_MAP = "fetch map"  # the map as last fetched (fetched now if it never was) comes back
REFRESH = Pause(Step(RESEND))  # fetch the map again now (every node unreachable: no error)

Op: TypeAlias = Send | SendMany | Pause | str  # str: FETCH_MAP
Plan: TypeAlias = Generator[Op, Any, Any]


def refresh_call(base: ClusterBase[Any]) -> Plan:
    """The map fetched again: ``cluster`` from the known nodes, then the seeds, the first
    answer wins (``no_method``: a server without partitions, which owns everything)."""
    failures: list[str] = []
    for address in base._refresh_order():
        answer = yield Send(address, "cluster", ())
        if isinstance(answer, ConnectionFailed):
            failures.append(str(answer))
            continue
        return base._take_map(address, answer)
    raise ConnectionFailed(f"no node answered cluster: {'; '.join(failures)}")


def call_plan(base: ClusterBase[Any], method: str, params: Sequence[Any], resent: bool) -> Plan:
    """Any method by name, as ``call`` sends it (``params`` with ids already given)."""
    if method == "reserve":
        return reserve_call(base, *params)
    if method == "add_many" and len(params) == 1 and isinstance(params[0], list):
        return add_many_call(base, params[0], resent)
    return routed_call(base, method, params, route(method, params), resent)


def routed_call(
    base: ClusterBase[Any],
    method: str,
    params: Sequence[Any],
    task_id: str | None,
    resent: bool = False,
) -> Plan:
    """``method`` on the owner of ``task_id`` (any node when None), retried as ``Retry``
    decides. ``resent``: this is already a second send (a pipeline's call sent again on
    its own), so an ``exists`` may be the first send's."""
    retry = Retry(method, time.monotonic() + base.failover_timeout_s, resent)
    while True:
        pmap: PartitionMap = yield FETCH_MAP
        answer = yield Send(base._address_in(pmap, task_id), method, params)
        if not isinstance(answer, DelaywheelError):
            return answer
        step = retry.after(answer, time.monotonic())
        if step.action == CONFIRM and task_id is not None:
            stored = yield from routed_call(base, "get", (task_id,), task_id)
            return confirmed_adds(params, [stored], answer)[0]
        if step.action != RESEND:
            raise answer
        yield Pause(step)


def add_many_call(
    base: ClusterBase[Any], tasks: Sequence[Mapping[str, Any]], resent: bool = False
) -> Plan:
    """``add_many`` of ``tasks`` (each with its id): one per owner, all or nothing on each
    node, not across nodes. A batch refused (``moved``, ...) is grouped again by the
    refreshed map and sent again; the results come in the order of ``tasks``."""
    plan = BatchPlan(tasks)
    retry = Retry("add_many", time.monotonic() + base.failover_timeout_s, resent)
    while True:
        pmap: PartitionMap = yield FETCH_MAP
        group = plan.next_group(pmap, functools.partial(base._next_in_turn, pmap))
        if group is None:
            return plan.results
        address, indexes = group
        batch = plan.batch(indexes)
        answer = yield Send(address, "add_many", (batch,))
        if isinstance(answer, DelaywheelError):
            step = retry.after(answer, time.monotonic())
            if step.action == RESEND:
                yield Pause(step)
                continue
            if step.action != CONFIRM:
                raise answer
            stored = []
            for fields in batch:
                stored.append((yield from routed_call(base, "get", (fields["id"],), fields["id"])))
            answer = confirmed_adds(batch, stored, answer)
        plan.done(indexes, answer)
        retry.progressed()


def reserve_call(base: ClusterBase[Any], topics: Any, timeout: float = 0) -> Plan:
    """``reserve`` of a cluster: every node in turn without waiting (one node further on
    at each call, so none is starved), then a wait on one node for at most
    ``reserve_slice_s``, and again, until ``timeout``. A node that cannot be reached is
    skipped (and the map fetched again: its partitions move); none reachable raises."""
    wanted = topic_list(topics)
    deadline_s = time.monotonic() + max(float(timeout), 0.0)
    while True:
        pmap: PartitionMap = yield FETCH_MAP
        nodes = base._rotate(pmap)
        failures: list[ConnectionFailed] = []
        for address in nodes:
            answer = yield Send(address, "reserve", (wanted, 0))
            if isinstance(answer, ConnectionFailed):
                failures.append(answer)
            elif isinstance(answer, DelaywheelError):
                raise answer
            elif answer is not None:
                return answer
        if failures:
            yield REFRESH
            if len(failures) == len(nodes):
                raise failures[0]
        remaining_s = deadline_s - time.monotonic()
        if remaining_s <= 0:
            return None
        answer = yield Send(nodes[0], "reserve", (wanted, min(remaining_s, base.reserve_slice_s)))
        if isinstance(answer, DelaywheelError) and not isinstance(answer, ConnectionFailed):
            raise answer
        if answer is not None and not isinstance(answer, ConnectionFailed):
            return answer


def pipeline_call(
    base: ClusterBase[Any], calls: Sequence[tuple[str, Sequence[Any]]], timeout_s: float
) -> Plan:
    """A cluster pipeline: one batch per owner; a call answered ``moved`` or
    ``tryagain`` (or ``unavailable``, when it may be resent), or whose node could not be
    reached before anything was sent, goes again on its own (``call_plan``). Returns
    each call's result or ``DelaywheelError``, in call order."""
    calls = [(method, with_id(method, params)) for method, params in calls]
    pmap: PartitionMap = yield FETCH_MAP
    outcomes: list[Response | None] = [None] * len(calls)
    groups = group_by_owner(calls, pmap, functools.partial(base._next_in_turn, pmap))
    for address, indexes in groups.items():
        replies = yield SendMany(address, [calls[i] for i in indexes], timeout_s)
        if isinstance(replies, ConnectionFailed) and not replies.maybe_applied:
            continue  # nothing sent: each goes again on its own
        if isinstance(replies, DelaywheelError):
            raise replies
        for i, reply in zip(indexes, replies, strict=True):
            outcomes[i] = reply
    results: list[Any] = []
    for (method, params), reply in zip(calls, outcomes, strict=True):
        if reply is not None and not needs_resend(method, reply):
            error = reply.error
            results.append(reply.result if error is None else error_from_reply(error))
            continue
        try:
            results.append((yield from call_plan(base, method, params, True)))
        except DelaywheelError as exc:
            results.append(exc)
    return results
