"""How each call's params are built: shared by the method definitions (commands.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

Task: TypeAlias = dict[str, Any]
TaskList: TypeAlias = list[dict[str, Any]]
Topics: TypeAlias = str | Sequence[str]


def reply_wait_s(method: str, params: Sequence[Any]) -> float:
    """How much longer than ``timeout_s`` a reply to ``call(method, *params)`` may take:
    the wait of a blocking reserve or wait."""
    if method in ("reserve", "wait") and len(params) > 1:
        wait_s = params[1]
        if type(wait_s) in (int, float) and wait_s > 0:
            return float(wait_s)
    return 0.0


def task_fields(
    topic: str,
    body: Any,
    delay: float | None,
    at: float | None,
    id: str | None,
    ttr: float | None,
    max_attempts: int | None,
    target: Mapping[str, Any] | None,
    priority: int | None = None,
    retain: float | None = None,
) -> dict[str, Any]:
    """The task map for ``add``: only the keys that were given."""
    task: dict[str, Any] = {"topic": topic}
    if id is not None:
        task["id"] = id
    if body is not None:
        task["body"] = body
    if delay is not None:
        task["delay"] = delay
    if at is not None:
        task["at"] = at
    if ttr is not None:
        task["ttr"] = ttr
    if max_attempts is not None:
        task["max_attempts"] = max_attempts
    if target is not None:
        task["target"] = dict(target)
    if priority is not None:
        task["priority"] = priority
    if retain is not None:
        task["retain"] = retain
    return task


def list_query(topic: str | None, state: str | None, limit: int | None, cursor: Any) -> Task:
    query: dict[str, Any] = {}
    if topic is not None:
        query["topic"] = topic
    if state is not None:
        query["state"] = state
    if limit is not None:
        query["limit"] = limit
    if cursor is not None:
        query["cursor"] = cursor
    return query


def schedule_query(topic: str | None, paused: bool | None, limit: int | None, cursor: Any) -> Task:
    """``schedule_list``'s query map, with only the fields given."""
    given = {"topic": topic, "paused": paused, "limit": limit, "cursor": cursor}
    return {name: value for name, value in given.items() if value is not None}


def topic_list(topics: Topics) -> str | list[str]:
    return topics if isinstance(topics, str) else list(topics)
