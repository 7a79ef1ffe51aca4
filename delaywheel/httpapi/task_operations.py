"""The operations on tasks (add, list, get, update, delete, ack, release, touch, wait,
kick) and on a topic's tasks (reserve, kick): rows of operations.py's table, in its order."""

from __future__ import annotations

from typing import Any

from delaywheel.httpapi import schemas
from delaywheel.httpapi.operation import (
    CURSOR,
    LIMIT,
    TOPIC,
    Inputs,
    Operation,
    Param,
    by_id,
    found,
    json_object,
    optional_tail,
    page,
    path_id,
    query_map,
    query_text,
    shown,
    wrapped,
)
from delaywheel.httpapi.values import BadInput, body_in, body_out, cursor_in, query_number
from delaywheel.net.blocked import MAX_RESERVE_TIMEOUT_S

# -- the builders ---------------------------------------------------------------------------


def _add(inputs: Inputs) -> tuple[str, list[Any]]:
    body = json_object(inputs.body, 'a task, or {"tasks": [...]}')
    if "tasks" in body:
        tasks = body["tasks"]
        if set(body) != {"tasks"} or not isinstance(tasks, list):
            raise BadInput(
                f'add many takes {{"tasks": [task, ...]}} alone, got keys {sorted(body)}'
            )
        return "add_many", [
            [body_in(t, f"task {i}: ") if isinstance(t, dict) else t for i, t in enumerate(tasks)]
        ]
    task = body_in(body)
    key = inputs.headers.get("idempotency-key")
    if key is not None and "id" not in task:
        task["id"] = key  # the protocol's id check applies to it
    return "add", [task]


def _list(inputs: Inputs) -> tuple[str, list[Any]]:
    query = query_map(inputs, {"topic": query_text, "state": query_text, "limit": query_number})
    cursor = cursor_in(inputs.query.get("cursor"))
    if cursor is not None:
        query["cursor"] = cursor
    return "list", [query]


def _ack(inputs: Inputs) -> tuple[str, list[Any]]:
    """``ack``, with the optional body ``{"result": value}`` as its result."""
    if inputs.body is None:
        return "ack", [path_id(inputs)]
    body = json_object(inputs.body, '{"result": value}')
    if set(body) != {"result"}:
        raise BadInput(f'ack takes {{"result": value}} alone, got keys {sorted(body)}')
    return "ack", [path_id(inputs), body["result"]]


def _update(inputs: Inputs) -> tuple[str, list[Any]]:
    return "update", [path_id(inputs), body_in(json_object(inputs.body, "the changes"))]


def _release(inputs: Inputs) -> tuple[str, list[Any]]:
    return "release", optional_tail(
        [path_id(inputs), query_number("delay", inputs.query.get("delay"))]
    )


def _wait(inputs: Inputs) -> tuple[str, list[Any]]:
    timeout = query_number("timeout", inputs.query.get("timeout"))
    return "wait", [path_id(inputs), 0 if timeout is None else timeout]


def _reserve(inputs: Inputs) -> tuple[str, list[Any]]:
    timeout = query_number("timeout", inputs.query.get("timeout"))
    return "reserve", [inputs.path["topic"], 0 if timeout is None else timeout]


def _kick(inputs: Inputs) -> tuple[str, list[Any]]:
    return "kick", [inputs.path["topic"], query_number("count", inputs.query.get("count"))]


# -- results --------------------------------------------------------------------------------


def _created(result: Any, inputs: Inputs) -> tuple[int, Any]:
    return 201, {"tasks": result} if isinstance(result, list) else result


def _task_or_no_content(result: Any, inputs: Inputs) -> tuple[int, Any]:
    return (204, None) if result is None else (200, body_out(result))


# -- the operations -------------------------------------------------------------------------

TASK_ID = Param("id", "path", schemas.ID, "the task's id", required=True)
IDEMPOTENCY_KEY = Param(
    "Idempotency-Key",
    "header",
    schemas.ID,
    "the task's id when the body has none: a retry of the same add answers 409",
)

TASK_OPERATIONS: tuple[Operation, ...] = (
    Operation(
        "addTask",
        "POST",
        "/tasks",
        "add",
        _add,
        _created,
        {"oneOf": [schemas.ref("Added"), schemas.ref("AddedMany")]},
        status=201,
        params=(IDEMPOTENCY_KEY,),
        body={"oneOf": [schemas.ref("NewTask"), schemas.ref("NewTasks")]},
        also=("add_many",),
        extra_statuses=(409,),
    ),
    Operation(
        "listTasks",
        "GET",
        "/tasks",
        "list",
        _list,
        page("tasks"),
        schemas.ref("TaskPage"),
        params=(
            Param("topic", "query", schemas.TOPIC, "only this topic's tasks"),
            Param(
                "state", "query", schemas.TASK["properties"]["state"], "only tasks in this state"
            ),
            LIMIT,
            CURSOR,
        ),
    ),
    Operation(
        "getTask",
        "GET",
        "/tasks/{id}",
        "get",
        by_id("get"),
        found("task"),
        schemas.ref("Task"),
        params=(TASK_ID,),
    ),
    Operation(
        "updateTask",
        "PATCH",
        "/tasks/{id}",
        "update",
        _update,
        shown,
        schemas.ref("Task"),
        params=(TASK_ID,),
        body=schemas.ref("Changes"),
    ),
    Operation(
        "deleteTask",
        "DELETE",
        "/tasks/{id}",
        "delete",
        by_id("delete"),
        wrapped("deleted"),
        schemas.one_field("deleted", {"type": "boolean"}),
        params=(TASK_ID,),
    ),
    Operation(
        "ackTask",
        "POST",
        "/tasks/{id}/ack",
        "ack",
        _ack,
        wrapped("acked"),
        schemas.one_field("acked", {"type": "boolean"}),
        params=(TASK_ID,),
        body=schemas.ACK,
        body_required=False,
    ),
    Operation(
        "releaseTask",
        "POST",
        "/tasks/{id}/release",
        "release",
        _release,
        wrapped("released"),
        schemas.one_field("released", {"type": "boolean"}),
        params=(
            TASK_ID,
            Param(
                "delay",
                "query",
                {"type": "number", "minimum": 0},
                "seconds until it is due again (default 0)",
            ),
        ),
    ),
    Operation(
        "touchTask",
        "POST",
        "/tasks/{id}/touch",
        "touch",
        by_id("touch"),
        wrapped("deadline"),
        schemas.one_field("deadline", schemas.TIME),
        params=(TASK_ID,),
    ),
    Operation(
        "waitTask",
        "GET",
        "/tasks/{id}/wait",
        "wait",
        _wait,
        _task_or_no_content,
        schemas.ref("Task"),
        params=(
            TASK_ID,
            Param(
                "timeout",
                "query",
                {"type": "number", "minimum": 0, "maximum": MAX_RESERVE_TIMEOUT_S},
                "seconds to wait for the task to be done, dead or gone (default 0); "
                "still running then: 204",
            ),
        ),
        long_poll=True,
        extra_statuses=(204,),
    ),
    Operation(
        "kickTask",
        "POST",
        "/tasks/{id}/kick",
        "kick_task",
        by_id("kick_task"),
        wrapped("kicked"),
        schemas.one_field("kicked", {"type": "boolean"}),
        params=(TASK_ID,),
    ),
    Operation(
        "reserve",
        "POST",
        "/topics/{topic}/reserve",
        "reserve",
        _reserve,
        _task_or_no_content,
        schemas.ref("Task"),
        params=(
            TOPIC,
            Param(
                "timeout",
                "query",
                {"type": "number", "minimum": 0, "maximum": MAX_RESERVE_TIMEOUT_S},
                "seconds to wait for a task (default 0); none came: 204",
            ),
        ),
        long_poll=True,
        extra_statuses=(204,),
    ),
    Operation(
        "kickTopic",
        "POST",
        "/topics/{topic}/kick",
        "kick",
        _kick,
        wrapped("kicked"),
        schemas.one_field("kicked", {"type": "integer"}),
        params=(
            TOPIC,
            Param(
                "count",
                "query",
                {"type": "integer", "minimum": 1},
                "at most this many",
                required=True,
            ),
        ),
    ),
)
