"""Pipelines: calls queued, then sent in one write and answered together.

``QueuedCalls`` holds what the blocking and the asyncio pipelines share: one
queuing method per protocol method (the client's names, params and docstrings;
tests/test_method_surface.py checks them) and the turning of replies into
results. ``Client.pipeline()`` and ``AsyncClient.pipeline()`` add the sending.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from delaywheel_client.calls import Topics, list_query, reply_timeout_s, task_fields, topic_list
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

    def schedule_next(self, schedule: str | Mapping[str, Any], n: int | None = None) -> None:
        """The next ``n`` (1-1000, default 5) times of a schedule id or unsaved spec map
        (``cron``, ``tz`` or ``every``, ``anchor``): ``{"times", "description"}``."""
        self._queue("schedule_next", (schedule,) if n is None else (schedule, n))

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
