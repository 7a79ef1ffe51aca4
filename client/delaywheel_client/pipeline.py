"""Pipelines: calls queued, then sent in one write and answered together.

``QueuedCalls`` holds what the blocking and the asyncio pipelines share: one
queuing method per protocol method (the client's names, params and docstrings;
tests/test_method_surface.py checks them) and the turning of replies into
results. ``Client.pipeline()`` and ``AsyncClient.pipeline()`` add the sending.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from delaywheel_client.calls import (
    Topics,
    list_query,
    reply_timeout_s,
    schedule_query,
    task_fields,
    topic_list,
)
from delaywheel_client.errors import DelaywheelError, error_from_reply
from delaywheel_client.protocol import Response


class QueuedCalls:
    """The queuing half of a pipeline: every method queues a call and returns None. Its
    docstring is the client method's: what it says is returned is the call's result in
    ``execute()``'s list."""

    def __init__(self, timeout_s: float) -> None:
        self._base_timeout_s = timeout_s
        self._timeout_s = timeout_s  # the longest reply wait any queued call needs
        self._calls: list[tuple[str, Sequence[Any]]] = []
        self.results: list[Any] = []

    def __len__(self) -> int:
        return len(self._calls)

    def _take(self) -> tuple[list[tuple[str, Sequence[Any]]], float]:
        """The queued calls and their reply timeout; the queue starts afresh."""
        calls, self._calls = self._calls, []
        timeout_s, self._timeout_s = self._timeout_s, self._base_timeout_s
        return calls, timeout_s

    def _collect(self, replies: Iterable[Response], raise_on_error: bool) -> list[Any]:
        results: list[Any] = []
        first_error: DelaywheelError | None = None
        for reply in replies:
            if reply.error is None:
                results.append(reply.result)
            else:
                error = error_from_reply(reply.error)
                if first_error is None:
                    first_error = error
                results.append(error)
        self.results = results
        if raise_on_error and first_error is not None:
            raise first_error
        return results

    def _settled(self, results: list[Any], raise_on_error: bool) -> list[Any]:
        """Results already made (a cluster pipeline's: values, or the ``DelaywheelError``
        of each call that failed) kept as ``results``; the first error raised if asked."""
        self.results = results
        errors = [result for result in results if isinstance(result, DelaywheelError)]
        if raise_on_error and errors:
            raise errors[0]
        return results

    def _queue(self, method: str, params: Sequence[Any]) -> None:
        self._calls.append((method, params))

    def call(self, method: str, *params: Any) -> None:
        """Any method by name, with the protocol's params: ``call("get", "task-1")``."""
        wait_s = reply_timeout_s(method, params, self._base_timeout_s)
        self._timeout_s = max(self._timeout_s, wait_s)
        self._queue(method, params)

    def ping(self) -> None:
        """``"pong"``."""
        self._queue("ping", ())

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
    ) -> None:
        """Add a task; returns ``{"id", "at", "cycle", "slot"}``. Keys left None are not sent
        (the server's defaults apply: due now, ttr 60 s, 5 attempts, the ready queue)."""
        fields = task_fields(topic, body, delay, at, id, ttr, max_attempts, target)
        self._calls.append(("add", (fields,)))

    def add_many(self, tasks: Iterable[Mapping[str, Any]]) -> None:
        """Add task maps all or nothing; returns ``add``'s result for each, in order."""
        self._queue("add_many", ([dict(t) for t in tasks],))

    def update(self, id: str, **changes: Any) -> None:
        """Change ``delay``/``at``, ``body``, ``topic``, ``ttr``, ``target`` or
        ``max_attempts``; returns the updated task."""
        self._queue("update", (id, changes))

    def delete(self, id: str) -> None:
        """True if the task existed."""
        self._queue("delete", (id,))

    def get(self, id: str) -> None:
        """The task, or None."""
        self._queue("get", (id,))

    def reserve(self, topics: Topics, timeout: float = 0) -> None:
        """The oldest ready task of ``topics``, now reserved, or None after ``timeout`` s."""
        self._timeout_s = max(self._timeout_s, timeout + self._base_timeout_s)
        self._queue("reserve", (topic_list(topics), timeout))

    def ack(self, id: str) -> None:
        """The reserved task is done and removed."""
        self._queue("ack", (id,))

    def release(self, id: str, delay: float = 0) -> None:
        """Put a reserved task back, due after ``delay`` seconds."""
        self._queue("release", (id, delay))

    def touch(self, id: str) -> None:
        """Extend a reservation by its ttr; returns the new deadline (Unix s)."""
        self._queue("touch", (id,))

    def kick(self, topic: str, count: int) -> None:
        """Make up to ``count`` dead tasks of ``topic`` ready again; returns how many."""
        self._queue("kick", (topic, count))

    def kick_task(self, task_id: str) -> None:
        """Make one dead task ready again (due now, if it has a target); True."""
        self._queue("kick_task", (task_id,))

    def stats(self) -> None:
        """Counts by state and topic, wheel settings, store URL, uptime, version, ..."""
        self._queue("stats", ())

    def cluster(self) -> None:
        """The keyspace's partition map: ``{"node", "partitions", "lease_s", "owners":
        [{"partition", "node", "address", "epoch"}, ...]}`` (docs/ha.md)."""
        self._queue("cluster", ())

    def schedule_next(self, schedule: str | Mapping[str, Any], n: int | None = None) -> None:
        """The next ``n`` (1-1000, default 5) times of a schedule id or unsaved spec map
        (``cron``, ``tz`` or ``every``, ``anchor``): ``{"times", "description"}``."""
        self._queue("schedule_next", (schedule,) if n is None else (schedule, n))

    def schedule_add(self, schedule: Mapping[str, Any]) -> None:
        """Save a recurring schedule (``id``, ``cron``+``tz`` or ``every``, the task template,
        policies; docs/schedules.md): the schedule map with its state."""
        self._queue("schedule_add", (dict(schedule),))

    def schedule_update(
        self, schedule_id: str, changes: Mapping[str, Any], expected_version: int | None = None
    ) -> None:
        """Change a schedule (null removes a field); a stale ``expected_version`` raises
        ``Conflict``. The next occurrence is the first after max(now, last_fired)."""
        self._queue(
            "schedule_update",
            (schedule_id, dict(changes))
            if expected_version is None
            else (schedule_id, dict(changes), expected_version),
        )

    def schedule_pause(self, schedule_id: str, note: str | None = None) -> None:
        """Pause a schedule (its pending occurrence goes in the same write), with a note."""
        self._queue("schedule_pause", (schedule_id,) if note is None else (schedule_id, note))

    def schedule_resume(self, schedule_id: str) -> None:
        """Resume a paused schedule from now (what passed while paused is not fired)."""
        self._queue("schedule_resume", (schedule_id,))

    def schedule_delete(self, schedule_id: str) -> None:
        """Delete a schedule; True if it existed (occurrences already put stay tasks)."""
        self._queue("schedule_delete", (schedule_id,))

    def schedule_get(self, schedule_id: str) -> None:
        """A schedule's map with ``version``, ``paused``, ``note``, ``next``, ``last_fired``,
        ``counts``; None if there is none."""
        self._queue("schedule_get", (schedule_id,))

    def schedule_list(
        self,
        *,
        topic: str | None = None,
        paused: bool | None = None,
        limit: int | None = None,
        cursor: Any = None,
    ) -> None:
        """One page: ``{"schedules": [...], "next": cursor or None}`` (limit <= 1000)."""
        self._queue("schedule_list", (schedule_query(topic, paused, limit, cursor),))

    def schedule_trigger(self, schedule_id: str) -> None:
        """One extra occurrence now: ``{"id": its task id}``."""
        self._queue("schedule_trigger", (schedule_id,))

    def schedule_backfill(self, schedule_id: str, start: float, end: float) -> None:
        """Fire the occurrences in [start, min(end, now)] under their own ids (Unix s):
        ``{"ids": [...put], "existing": n}``."""
        self._queue("schedule_backfill", (schedule_id, start, end))

    def list(
        self,
        *,
        topic: str | None = None,
        state: str | None = None,
        limit: int | None = None,
        cursor: Any = None,
    ) -> None:
        """One page: ``{"tasks": [...], "next": cursor or None}`` (limit <= 1000)."""
        self._queue("list", (list_query(topic, state, limit, cursor),))
