"""The cluster clients' calls as plans: generators of what to do next, without any I/O.

A plan yields ops (``FETCH_MAP``, ``Send``, ``SendEach``, ``SendMany``, ``Pause``) and is
given each op's answer; its return value is the call's. ``ClusterClient._run`` carries the
ops out with blocking I/O, ``AsyncClusterClient._run`` with asyncio, so each rule is
written once. ``method_plan`` is how a cluster client sends one of its methods (commands.py):
to the owner of the task its routing param names (commands.ROUTES), to any node, or, for the
methods in ``FAN_OUT``, to every node. ``call_plan`` is ``call``'s: one node, always.
docs/protocol.md, "Several nodes: the clients", states the rules for users; retry.py the
retry policy the plans follow.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any, NamedTuple, TypeAlias

from delaywheel_client.calls import topic_list
from delaywheel_client.errors import ConnectionFailed, DelaywheelError, error_from_reply
from delaywheel_client.protocol import Response
from delaywheel_client.retry import (
    CONFIRM,
    RESEND,
    BatchPlan,
    Retry,
    Step,
    confirmed_adds,
    needs_resend,
)
from delaywheel_client.routing import (
    ClusterBase,
    PartitionMap,
    group_by_owner,
    list_page,
    list_start,
    route,
    stats_by_node,
    with_id,
)


class Send(NamedTuple):
    """Send ``method`` to ``address``; the answer (or the ``DelaywheelError``) comes back."""

    address: str
    method: str
    params: Sequence[Any]


class SendEach(NamedTuple):
    """Send ``method`` to each of ``addresses`` (at once, when the I/O allows); a map of
    address to its answer (or its ``DelaywheelError``) comes back."""

    addresses: Sequence[str]
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

Op: TypeAlias = Send | SendEach | SendMany | Pause | str  # str: FETCH_MAP
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
    skipped (and the map fetched again: its partitions move); none reachable raises.
    A map older than ``MAP_MAX_AGE_S`` is fetched again first: the nodes are the map's."""
    wanted = topic_list(topics)
    deadline_s = time.monotonic() + max(float(timeout), 0.0)
    while True:
        pmap = yield from every_node_map(base)
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


# -- the methods that visit every node ---------------------------------------------------------


def every_node_map(base: ClusterBase[Any]) -> Generator[Op, Any, PartitionMap]:
    """The map for a call that visits its nodes, fetched again first when older than
    ``MAP_MAX_AGE_S``: no answer of theirs is ``moved``, so nothing else would tell a
    long-lived client of a node that joined or came back since (a moved hint taken
    since does not make the map new)."""
    if base._map_is_old():
        yield REFRESH
    pmap: PartitionMap = yield FETCH_MAP
    return pmap


def each_node_plan(base: ClusterBase[Any], method: str, params: Sequence[Any]) -> Plan:
    """``ping`` or ``stats`` of every node: "pong" once all answered; the stats by node."""
    pmap = yield from every_node_map(base)
    answers = yield SendEach(base._all_nodes(pmap), method, params)
    if method == "stats":
        return stats_by_node(answers)
    for answer in answers.values():
        if isinstance(answer, DelaywheelError):
            raise answer
    return "pong"


def kick_plan(base: ClusterBase[Any], method: str, params: Sequence[Any]) -> Plan:
    """``kick``: each node in turn until ``count`` dead tasks were made ready."""
    topic, count = params
    kicked = 0
    pmap = yield from every_node_map(base)
    for address in base._all_nodes(pmap):
        if kicked >= count:
            break
        answer = yield Send(address, "kick", (topic, count - kicked))
        if isinstance(answer, DelaywheelError):
            raise answer
        kicked += int(answer)
    return kicked


def pages_plan(base: ClusterBase[Any], method: str, params: Sequence[Any]) -> Plan:
    """``list``, ``schedule_list`` or ``topic_list``: one node's page, the nodes one after
    the other (the cursor is ``[address, that node's cursor]``)."""
    query = dict(params[0])
    pmap = yield from every_node_map(base)
    nodes = base._all_nodes(pmap)
    address, inner = list_start(nodes, query.pop("cursor", None))
    if inner is not None:
        query["cursor"] = inner
    page = yield Send(address, method, (query,))
    if isinstance(page, DelaywheelError):
        raise page
    return list_page(nodes, address, page, _PAGED[method])


# What each paged method's page holds its items under.
_PAGED = {"list": "tasks", "schedule_list": "schedules", "topic_list": "topics"}


def map_plan(base: ClusterBase[Any], method: str, params: Sequence[Any]) -> Plan:
    """``cluster``: the map fetched anew."""
    pmap: PartitionMap = yield from refresh_call(base)
    return pmap.answer()


FAN_OUT: dict[str, Callable[[ClusterBase[Any], str, Sequence[Any]], Plan]] = {
    "ping": each_node_plan,
    "stats": each_node_plan,
    "kick": kick_plan,
    "list": pages_plan,
    "schedule_list": pages_plan,
    "topic_list": pages_plan,
    "cluster": map_plan,
}


def method_plan(base: ClusterBase[Any], method: str, params: Sequence[Any]) -> Plan:
    """One of the client's methods, as a cluster client sends it."""
    fan_out = FAN_OUT.get(method)
    if fan_out is not None:
        return fan_out(base, method, params)
    return call_plan(base, method, with_id(method, params), False)
