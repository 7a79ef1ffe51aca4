"""How a cluster client retries, written once for ``ClusterClient`` and
``AsyncClusterClient``, without any I/O.

``Retry`` decides, error by error, whether a call is raised, sent again (after a wait
and a fresh map) or confirmed (a resent ``add`` answered ``exists``); ``BatchPlan``
keeps an ``add_many`` across owners; ``needs_resend`` says which pipelined calls go
again on their own. The calls that follow these rules are in plans.py, as generators
of what to do next that each client runs with its own I/O, so the logic exists once.
docs/protocol.md, "Several nodes: the clients", states the rules for users.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from delaywheel_client.errors import (
    ConnectionFailed,
    DelaywheelError,
    ServerClosed,
)
from delaywheel_client.methods import READ_ONLY_METHODS
from delaywheel_client.protocol import Response
from delaywheel_client.routing import (
    MOVED_AT_ONCE,
    PartitionMap,
    error_data,
    group_by_owner,
    retry_after_s,
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

    - ``moved``: follow the hint, refresh, resend: at once ``MOVED_AT_ONCE`` times in a
      row (a call that then gets through starts the count again), then after a backoff
      each time, until ``deadline_s``. A partition moving answers ``moved`` from both
      nodes for a moment (the old owner names the new one before it serves); a call
      raises ``Moved`` only when the nodes disagree past its deadline.
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
            if now_s >= self.deadline_s:
                return Step(RAISE)
            self.moved += 1
            if self.moved <= MOVED_AT_ONCE:
                return Step(RESEND, 0.0, error_data(exc))
            wait_s = min(retry_after_s(exc, self.moved - MOVED_AT_ONCE), self.deadline_s - now_s)
            return Step(RESEND, wait_s, error_data(exc))
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
