"""The JSON Schemas of the HTTP API's bodies, built from the checks the server makes.

The field sets are the engine's and the schedules' own (``validate.TASK_FIELDS``,
``UPDATE_FIELDS``, ``spec.SCHEDULE_FIELDS``, ...), the limits theirs too, so that a field
the server learns appears here with no second list; the types are what those checks
accept. openapi.py puts them in the document; operations.py names them per operation.
"""

from __future__ import annotations

from typing import Any

from delaywheel.engine import validate
from delaywheel.engine.task import MAX_PRIORITY, STATES
from delaywheel.httpapi import problems
from delaywheel.httpapi.values import BODY_ENCODINGS
from delaywheel.schedules import spec

ANY: dict[str, Any] = {}  # any JSON value
NUMBER = {"type": "number"}
STRING = {"type": "string"}
TIME = {"type": "number", "description": "Unix seconds"}
ID = {
    "type": "string",
    "minLength": 1,
    "description": f"1 to {validate.MAX_ID_BYTES} bytes of UTF-8",
}
TOPIC = {
    "type": "string",
    "minLength": 1,
    "description": f"1 to {validate.MAX_TOPIC_BYTES} bytes of UTF-8",
}
BODY_ENCODING = {
    "type": "string",
    "enum": list(BODY_ENCODINGS),
    "description": "base64: the body is bytes, base64'd; msgpack: the body's MessagePack, "
    "base64'd (a value JSON cannot hold). Absent: the body is its JSON value.",
}
TARGET = {
    "type": "object",
    "description": 'How the task is delivered: {"type": "queue"} (default), http, redis, '
    "amqp or nats (docs/protocol.md, Delivery targets)",
}

# Each task field's type as validate.py accepts it.
_TASK_FIELD_TYPES: dict[str, dict[str, Any]] = {
    "id": ID,
    "topic": TOPIC,
    "delay": {"type": "number", "minimum": 0, "description": "seconds from now"},
    "at": TIME,
    "body": {"description": "any JSON value (see body_encoding)"},
    "ttr": {"type": "number", "minimum": 0, "description": "seconds to ack a reservation"},
    "target": TARGET,
    "max_attempts": {"type": "integer", "minimum": 1},
    "priority": {
        "type": "integer",
        "minimum": 0,
        "maximum": MAX_PRIORITY,
        "description": "0 is the most urgent; default 1024",
    },
    "retain": {"type": "number", "minimum": 0, "description": "seconds kept done once completed"},
}


def _fields(names: frozenset[str], types: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {name: types.get(name, ANY) for name in sorted(names)}


NEW_TASK: dict[str, Any] = {
    "type": "object",
    "required": ["topic"],
    "properties": _fields(validate.TASK_FIELDS, _TASK_FIELD_TYPES)
    | {"body_encoding": BODY_ENCODING},
    "additionalProperties": False,
    "example": {"topic": "emails", "body": {"to": "a@example.com"}, "delay": 30},
}
NEW_TASKS: dict[str, Any] = {
    "type": "object",
    "required": ["tasks"],
    "properties": {"tasks": {"type": "array", "items": {"$ref": "#/components/schemas/NewTask"}}},
    "additionalProperties": False,
    "example": {"tasks": [{"topic": "emails", "body": "one"}, {"topic": "emails", "body": "two"}]},
}
CHANGES: dict[str, Any] = {
    "type": "object",
    "properties": _fields(validate.UPDATE_FIELDS, _TASK_FIELD_TYPES)
    | {"body_encoding": BODY_ENCODING},
    "additionalProperties": False,
    "example": {"delay": 60},
}
ADDED: dict[str, Any] = {
    "type": "object",
    "required": ["id", "at"],
    "properties": {
        "id": STRING,
        "at": TIME,
        "cycle": {"type": ["integer", "null"]},
        "slot": {"type": ["integer", "null"]},
    },
    "example": {"id": "k3vq7a2m1a", "at": 1767225600.0, "cycle": 0, "slot": 30},
}
ADDED_MANY: dict[str, Any] = {
    "type": "object",
    "required": ["tasks"],
    "properties": {"tasks": {"type": "array", "items": {"$ref": "#/components/schemas/Added"}}},
}
TASK: dict[str, Any] = {
    "type": "object",
    "required": ["id", "topic", "state"],
    "properties": _fields(validate.TASK_FIELDS, _TASK_FIELD_TYPES)
    | {
        "body_encoding": BODY_ENCODING,
        "state": {"type": "string", "enum": [*STATES, "gone"]},
        "attempts": {"type": "integer"},
        "created": TIME,
        "deadline": TIME,
        "last_error": STRING,
        "cycle": {"type": ["integer", "null"]},
        "slot": {"type": ["integer", "null"]},
        "completed": TIME,
        "outcome": {"type": "string", "description": "acked, HTTP 200, published"},
        "result": {"description": "what ack sent, or an HTTP target's answer (result_encoding)"},
        "result_encoding": BODY_ENCODING,
    },
    "example": {
        "id": "k3vq7a2m1a",
        "topic": "emails",
        "state": "reserved",
        "body": {"to": "a@example.com"},
        "attempts": 1,
        "deadline": 1767225660.0,
    },
}
ACK: dict[str, Any] = {
    "type": "object",
    "properties": {
        "result": {"description": "kept with a task that has retain (at most --max-result)"}
    },
    "additionalProperties": False,
    "example": {"result": {"rows": 1200}},
}
TASK_PAGE: dict[str, Any] = {
    "type": "object",
    "required": ["tasks", "next"],
    "properties": {
        "tasks": {"type": "array", "items": {"$ref": "#/components/schemas/Task"}},
        "next": {"type": ["string", "null"], "description": "the next page's cursor"},
    },
}
_SCHEDULE_FIELD_TYPES: dict[str, dict[str, Any]] = {
    **_TASK_FIELD_TYPES,
    "cron": STRING,
    "tz": STRING,
    "every": NUMBER,
}
SCHEDULE_IN: dict[str, Any] = {
    "type": "object",
    "required": ["id", "topic"],
    "properties": _fields(spec.SCHEDULE_FIELDS, _SCHEDULE_FIELD_TYPES)
    | {"body_encoding": BODY_ENCODING},
    "additionalProperties": False,
    "example": {"id": "nightly", "cron": "0 3 * * *", "tz": "Europe/Paris", "topic": "reports"},
}
SCHEDULE_CHANGES: dict[str, Any] = {
    "type": "object",
    "properties": _fields(spec.CHANGE_FIELDS, _SCHEDULE_FIELD_TYPES)
    | {"body_encoding": BODY_ENCODING},
    "additionalProperties": False,
    "example": {"cron": "0 4 * * *"},
}
SCHEDULE_SPEC: dict[str, Any] = {
    "type": "object",
    "properties": _fields(spec.SPEC_FIELDS, _SCHEDULE_FIELD_TYPES),
    "additionalProperties": False,
    "example": {"cron": "*/15 * * * *", "tz": "UTC"},
}
SCHEDULE: dict[str, Any] = {
    "type": "object",
    "required": ["id"],
    "properties": {"id": STRING, "version": {"type": "integer"}, "paused": {"type": "boolean"}},
}
SCHEDULE_PAGE: dict[str, Any] = {
    "type": "object",
    "required": ["schedules", "next"],
    "properties": {
        "schedules": {"type": "array", "items": {"$ref": "#/components/schemas/Schedule"}},
        "next": {"type": ["string", "null"]},
    },
}
TIMES: dict[str, Any] = {
    "type": "object",
    "required": ["times", "description"],
    "properties": {
        "times": {
            "type": "array",
            "items": {"type": "object", "properties": {"utc": TIME, "local": STRING}},
        },
        "description": STRING,
    },
}


TOPIC_SETTINGS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "paused_until": {"type": ["number", "null"], "description": "Unix s; null: not paused"},
        "rate": {"type": ["number", "null"], "exclusiveMinimum": 0, "description": "tasks/s"},
        "burst": {
            "type": ["integer", "null"],
            "minimum": 1,
            "maximum": 2**31 - 1,
            "description": "tasks at once after a quiet time; null: 20 ms of the rate, at least 1",
        },
        "concurrency": {"type": ["integer", "null"], "minimum": 1, "maximum": 2**31 - 1},
        "retain": {"type": ["number", "null"], "minimum": 0, "description": "seconds"},
        "dead_retain": {
            "type": ["number", "null"],
            "minimum": 0,
            "description": "seconds a dead task is kept; null: the server's --dead-retention",
        },
        "note": {"type": ["string", "null"]},
    },
    "additionalProperties": False,
    "example": {"rate": 50, "burst": 10, "concurrency": 8},
}
TOPIC_SHOWN: dict[str, Any] = {
    "type": "object",
    "required": ["topic", "paused"],
    "properties": {"topic": TOPIC, "paused": {"type": "boolean"}} | TOPIC_SETTINGS["properties"],
}
TOPIC_PAGE: dict[str, Any] = {
    "type": "object",
    "required": ["topics", "next"],
    "properties": {
        "topics": {"type": "array", "items": {"$ref": "#/components/schemas/Topic"}},
        "next": {"type": ["string", "null"]},
    },
}


def one_field(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    """``{name: ...}``: how a scalar result travels (a JSON document is an object)."""
    return {"type": "object", "required": [name], "properties": {name: schema}}


COMPONENTS: dict[str, dict[str, Any]] = {
    "NewTask": NEW_TASK,
    "NewTasks": NEW_TASKS,
    "Changes": CHANGES,
    "Added": ADDED,
    "AddedMany": ADDED_MANY,
    "Task": TASK,
    "TaskPage": TASK_PAGE,
    "NewSchedule": SCHEDULE_IN,
    "ScheduleChanges": SCHEDULE_CHANGES,
    "ScheduleSpec": SCHEDULE_SPEC,
    "Schedule": SCHEDULE,
    "SchedulePage": SCHEDULE_PAGE,
    "Times": TIMES,
    "TopicSettings": TOPIC_SETTINGS,
    "Topic": TOPIC_SHOWN,
    "TopicPage": TOPIC_PAGE,
    "Problem": problems.SCHEMA,
}


def ref(name: str) -> dict[str, str]:
    assert name in COMPONENTS, name
    return {"$ref": f"#/components/schemas/{name}"}
