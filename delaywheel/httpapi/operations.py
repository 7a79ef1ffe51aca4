"""Every HTTP operation, written once: its path, the protocol method it calls, its params.

This table is what the server routes by (site.py) and what /v1/openapi.json is made of
(openapi.py). An ``Operation`` says how a request becomes the protocol method's params
(``build``: path, query and JSON body in, ``(method, params)`` out, with no check of its
own beyond reading JSON: the protocol's checks run on the params as they run on a
connection's request) and how the method's result becomes the response (``answer``).
Its summary is the client method's docstring (delaywheel_client/commands.py), so the
document and the clients say the same.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from delaywheel_client.commands import DEFINITIONS
from delaywheel_client.methods import METHODS

from delaywheel.checks import show
from delaywheel.errors import RequestError
from delaywheel.httpapi import schemas
from delaywheel.httpapi.values import (
    BadInput,
    body_in,
    body_out,
    cursor_in,
    cursor_out,
    query_bool,
    query_number,
)
from delaywheel.net.connection import MAX_RESERVE_TIMEOUT_S


@dataclass(frozen=True)
class Inputs:
    """What a request carries: its path's params, query, JSON body and headers (by
    lower-cased name)."""

    path: Mapping[str, str]
    query: Mapping[str, str]
    body: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Param:
    """A path or query param, as the document shows it."""

    name: str
    where: str  # "path", "query" or "header"
    schema: dict[str, Any]
    description: str
    required: bool = False


@dataclass(frozen=True)
class Operation:
    op_id: str
    http: str  # the HTTP method
    path: str  # under /v1, with {name} params
    method: str  # the protocol method (POST /v1/tasks: add, or add_many for a list)
    build: Callable[[Inputs], tuple[str, list[Any]]]
    answer: Callable[[Any, Inputs], tuple[int, Any]]  # status, JSON (None: no body)
    response: dict[str, Any]  # the 2xx body's schema
    status: int = 200
    params: tuple[Param, ...] = ()
    body: dict[str, Any] | None = None  # the JSON body's schema; None: none read
    body_required: bool = True
    long_poll: bool = False  # held open while it waits: not counted as in flight
    also: tuple[str, ...] = ()  # other protocol methods it may call (add_many)
    extra_statuses: tuple[int, ...] = ()

    @property
    def summary(self) -> str:
        doc = DEFINITIONS[self.method].__doc__ or self.method
        return " ".join(doc.split())

    @property
    def mutating(self) -> bool:
        return not METHODS[self.method].read_only


# -- what a request holds -----------------------------------------------------------------


def _object(body: Any, what: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadInput(f"the body must be a JSON object ({what}), got {show(body)}")
    return body


def _query_map(
    inputs: Inputs, names: dict[str, Callable[[str, str | None], Any]]
) -> dict[str, Any]:
    """The query params that were given, read as numbers or booleans where the
    protocol takes those."""
    out = {}
    for name, read in names.items():
        text = inputs.query.get(name)
        if text is not None:
            out[name] = read(name, text)
    return out


def _text(name: str, text: str | None) -> Any:
    return text


def _id(inputs: Inputs) -> str:
    return inputs.path["id"]


def _optional(params: list[Any]) -> list[Any]:
    """Trailing params that were not given are left out: the protocol's defaults apply."""
    while params and params[-1] is None:
        params.pop()
    return params


# -- results --------------------------------------------------------------------------------


def _as_is(result: Any, inputs: Inputs) -> tuple[int, Any]:
    return 200, result


def _created(result: Any, inputs: Inputs) -> tuple[int, Any]:
    return 201, {"tasks": result} if isinstance(result, list) else result


def _created_schedule(result: Any, inputs: Inputs) -> tuple[int, Any]:
    return 201, body_out(result)


def _found(what: str) -> Callable[[Any, Inputs], tuple[int, Any]]:
    def answer(result: Any, inputs: Inputs) -> tuple[int, Any]:
        if result is None:
            raise RequestError("not_found", f"no {what} with id {show(_id(inputs))}")
        return 200, body_out(result)

    return answer


def _wrapped(name: str) -> Callable[[Any, Inputs], tuple[int, Any]]:
    def answer(result: Any, inputs: Inputs) -> tuple[int, Any]:
        return 200, {name: result}

    return answer


def _shown(result: Any, inputs: Inputs) -> tuple[int, Any]:
    return 200, body_out(result)


def _page(key: str) -> Callable[[Any, Inputs], tuple[int, Any]]:
    def answer(result: Any, inputs: Inputs) -> tuple[int, Any]:
        return 200, {
            key: [body_out(item) for item in result[key]],
            "next": cursor_out(result["next"]),
        }

    return answer


def _task_or_no_content(result: Any, inputs: Inputs) -> tuple[int, Any]:
    return (204, None) if result is None else (200, body_out(result))


# -- the builders ---------------------------------------------------------------------------


def _add(inputs: Inputs) -> tuple[str, list[Any]]:
    body = _object(inputs.body, 'a task, or {"tasks": [...]}')
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
    query = _query_map(inputs, {"topic": _text, "state": _text, "limit": query_number})
    cursor = cursor_in(inputs.query.get("cursor"))
    if cursor is not None:
        query["cursor"] = cursor
    return "list", [query]


def _by_id(method: str) -> Callable[[Inputs], tuple[str, list[Any]]]:
    def build(inputs: Inputs) -> tuple[str, list[Any]]:
        return method, [_id(inputs)]

    return build


def _ack(inputs: Inputs) -> tuple[str, list[Any]]:
    """``ack``, with the optional body ``{"result": value}`` as its result."""
    if inputs.body is None:
        return "ack", [_id(inputs)]
    body = _object(inputs.body, '{"result": value}')
    if set(body) != {"result"}:
        raise BadInput(f'ack takes {{"result": value}} alone, got keys {sorted(body)}')
    return "ack", [_id(inputs), body["result"]]


def _update(inputs: Inputs) -> tuple[str, list[Any]]:
    return "update", [_id(inputs), body_in(_object(inputs.body, "the changes"))]


def _release(inputs: Inputs) -> tuple[str, list[Any]]:
    return "release", _optional([_id(inputs), query_number("delay", inputs.query.get("delay"))])


def _wait(inputs: Inputs) -> tuple[str, list[Any]]:
    timeout = query_number("timeout", inputs.query.get("timeout"))
    return "wait", [_id(inputs), 0 if timeout is None else timeout]


def _reserve(inputs: Inputs) -> tuple[str, list[Any]]:
    timeout = query_number("timeout", inputs.query.get("timeout"))
    return "reserve", [inputs.path["topic"], 0 if timeout is None else timeout]


def _kick(inputs: Inputs) -> tuple[str, list[Any]]:
    return "kick", [inputs.path["topic"], query_number("count", inputs.query.get("count"))]


def _schedule_add(inputs: Inputs) -> tuple[str, list[Any]]:
    return "schedule_add", [body_in(_object(inputs.body, "a schedule"))]


def _schedule_list(inputs: Inputs) -> tuple[str, list[Any]]:
    return _paged("schedule_list", inputs, topic=_text)


def _paged(
    method: str, inputs: Inputs, **more: Callable[[str, str | None], Any]
) -> tuple[str, list[Any]]:
    """A ``*_list`` call: ``paused``, ``limit``, ``cursor`` and ``more`` from the query."""
    query = _query_map(inputs, {**more, "paused": query_bool, "limit": query_number})
    cursor = cursor_in(inputs.query.get("cursor"))
    if cursor is not None:
        query["cursor"] = cursor
    return method, [query]


def _topic_list(inputs: Inputs) -> tuple[str, list[Any]]:
    return _paged("topic_list", inputs)


def _topic_get(inputs: Inputs) -> tuple[str, list[Any]]:
    return "topic_get", [inputs.path["topic"]]


def _topic_set(inputs: Inputs) -> tuple[str, list[Any]]:
    return "topic_set", [inputs.path["topic"], _object(inputs.body, "the settings")]


def _schedule_update(inputs: Inputs) -> tuple[str, list[Any]]:
    changes = body_in(_object(inputs.body, "the changes"))
    version = query_number("expected_version", inputs.query.get("expected_version"))
    return "schedule_update", _optional([_id(inputs), changes, version])


def _schedule_pause(inputs: Inputs) -> tuple[str, list[Any]]:
    return "schedule_pause", _optional([_id(inputs), inputs.query.get("note")])


def _schedule_backfill(inputs: Inputs) -> tuple[str, list[Any]]:
    start = query_number("start", inputs.query.get("start"))
    end = query_number("end", inputs.query.get("end"))
    return "schedule_backfill", [_id(inputs), start, end]


def _schedule_next(inputs: Inputs) -> tuple[str, list[Any]]:
    return "schedule_next", _optional([_id(inputs), query_number("n", inputs.query.get("n"))])


def _schedule_preview(inputs: Inputs) -> tuple[str, list[Any]]:
    spec = _object(inputs.body, "a schedule's spec")
    return "schedule_next", _optional([spec, query_number("n", inputs.query.get("n"))])


def _none(method: str) -> Callable[[Inputs], tuple[str, list[Any]]]:
    def build(inputs: Inputs) -> tuple[str, list[Any]]:
        return method, []

    return build


# -- the params, as the document shows them ---------------------------------------------------

TASK_ID = Param("id", "path", schemas.ID, "the task's id", required=True)
SCHEDULE_ID = Param("id", "path", schemas.ID, "the schedule's id", required=True)
TOPIC = Param("topic", "path", schemas.TOPIC, "the topic", required=True)
LIMIT = Param(
    "limit", "query", {"type": "integer", "minimum": 1, "maximum": 1000}, "page size (default 100)"
)
CURSOR = Param("cursor", "query", schemas.STRING, "the previous page's next")
IDEMPOTENCY_KEY = Param(
    "Idempotency-Key",
    "header",
    schemas.ID,
    "the task's id when the body has none: a retry of the same add answers 409",
)

OPERATIONS: tuple[Operation, ...] = (
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
        _page("tasks"),
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
        _by_id("get"),
        _found("task"),
        schemas.ref("Task"),
        params=(TASK_ID,),
    ),
    Operation(
        "updateTask",
        "PATCH",
        "/tasks/{id}",
        "update",
        _update,
        _shown,
        schemas.ref("Task"),
        params=(TASK_ID,),
        body=schemas.ref("Changes"),
    ),
    Operation(
        "deleteTask",
        "DELETE",
        "/tasks/{id}",
        "delete",
        _by_id("delete"),
        _wrapped("deleted"),
        schemas.one_field("deleted", {"type": "boolean"}),
        params=(TASK_ID,),
    ),
    Operation(
        "ackTask",
        "POST",
        "/tasks/{id}/ack",
        "ack",
        _ack,
        _wrapped("acked"),
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
        _wrapped("released"),
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
        _by_id("touch"),
        _wrapped("deadline"),
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
        _by_id("kick_task"),
        _wrapped("kicked"),
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
        _wrapped("kicked"),
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
    Operation(
        "addSchedule",
        "POST",
        "/schedules",
        "schedule_add",
        _schedule_add,
        _created_schedule,
        schemas.ref("Schedule"),
        status=201,
        body=schemas.ref("NewSchedule"),
        extra_statuses=(409,),
    ),
    Operation(
        "listSchedules",
        "GET",
        "/schedules",
        "schedule_list",
        _schedule_list,
        _page("schedules"),
        schemas.ref("SchedulePage"),
        params=(
            Param("topic", "query", schemas.TOPIC, "only this topic's schedules"),
            Param(
                "paused", "query", {"type": "boolean"}, "only paused (true) or running (false) ones"
            ),
            LIMIT,
            CURSOR,
        ),
    ),
    Operation(
        "getSchedule",
        "GET",
        "/schedules/{id}",
        "schedule_get",
        _by_id("schedule_get"),
        _found("schedule"),
        schemas.ref("Schedule"),
        params=(SCHEDULE_ID,),
    ),
    Operation(
        "updateSchedule",
        "PATCH",
        "/schedules/{id}",
        "schedule_update",
        _schedule_update,
        _shown,
        schemas.ref("Schedule"),
        params=(
            SCHEDULE_ID,
            Param(
                "expected_version",
                "query",
                {"type": "integer"},
                "409 unless the schedule's version is this",
            ),
        ),
        body=schemas.ref("ScheduleChanges"),
    ),
    Operation(
        "deleteSchedule",
        "DELETE",
        "/schedules/{id}",
        "schedule_delete",
        _by_id("schedule_delete"),
        _wrapped("deleted"),
        schemas.one_field("deleted", {"type": "boolean"}),
        params=(SCHEDULE_ID,),
    ),
    Operation(
        "pauseSchedule",
        "POST",
        "/schedules/{id}/pause",
        "schedule_pause",
        _schedule_pause,
        _shown,
        schemas.ref("Schedule"),
        params=(SCHEDULE_ID, Param("note", "query", schemas.STRING, "why, for people")),
    ),
    Operation(
        "resumeSchedule",
        "POST",
        "/schedules/{id}/resume",
        "schedule_resume",
        _by_id("schedule_resume"),
        _shown,
        schemas.ref("Schedule"),
        params=(SCHEDULE_ID,),
    ),
    Operation(
        "triggerSchedule",
        "POST",
        "/schedules/{id}/trigger",
        "schedule_trigger",
        _by_id("schedule_trigger"),
        _as_is,
        schemas.one_field("id", schemas.STRING),
        params=(SCHEDULE_ID,),
    ),
    Operation(
        "backfillSchedule",
        "POST",
        "/schedules/{id}/backfill",
        "schedule_backfill",
        _schedule_backfill,
        _as_is,
        {
            "type": "object",
            "required": ["ids", "existing"],
            "properties": {
                "ids": {"type": "array", "items": schemas.STRING},
                "existing": {"type": "integer"},
            },
        },
        params=(
            SCHEDULE_ID,
            Param("start", "query", schemas.TIME, "from (Unix s)", required=True),
            Param("end", "query", schemas.TIME, "to (Unix s; at most now)", required=True),
        ),
    ),
    Operation(
        "nextOfSchedule",
        "GET",
        "/schedules/{id}/next",
        "schedule_next",
        _schedule_next,
        _as_is,
        schemas.ref("Times"),
        params=(
            SCHEDULE_ID,
            Param(
                "n",
                "query",
                {"type": "integer", "minimum": 1, "maximum": 1000},
                "how many (default 5)",
            ),
        ),
    ),
    Operation(
        "previewSchedule",
        "POST",
        "/schedules/preview",
        "schedule_next",
        _schedule_preview,
        _as_is,
        schemas.ref("Times"),
        params=(
            Param(
                "n",
                "query",
                {"type": "integer", "minimum": 1, "maximum": 1000},
                "how many (default 5)",
            ),
        ),
        body=schemas.ref("ScheduleSpec"),
    ),
    Operation(
        "listTopics",
        "GET",
        "/topics",
        "topic_list",
        _topic_list,
        _page("topics"),
        schemas.ref("TopicPage"),
        params=(
            Param(
                "paused", "query", {"type": "boolean"}, "only paused (true) or running (false) ones"
            ),
            LIMIT,
            CURSOR,
        ),
    ),
    Operation(
        "getTopic",
        "GET",
        "/topics/{topic}",
        "topic_get",
        _topic_get,
        _as_is,
        schemas.ref("Topic"),
        params=(TOPIC,),
    ),
    Operation(
        "setTopic",
        "PATCH",
        "/topics/{topic}",
        "topic_set",
        _topic_set,
        _as_is,
        schemas.ref("Topic"),
        params=(TOPIC,),
        body=schemas.ref("TopicSettings"),
    ),
    Operation("stats", "GET", "/stats", "stats", _none("stats"), _as_is, {"type": "object"}),
    Operation(
        "cluster", "GET", "/cluster", "cluster", _none("cluster"), _as_is, {"type": "object"}
    ),
    Operation(
        "ping",
        "GET",
        "/ping",
        "ping",
        _none("ping"),
        _wrapped("ping"),
        schemas.one_field("ping", {"const": "pong"}),
    ),
)

# Methods no operation stands for: auth is the Authorization header.
NOT_OPERATIONS = frozenset({"auth"})
