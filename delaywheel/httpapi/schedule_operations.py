"""The operations on recurring schedules (add, list, get, update, delete, pause, resume,
trigger, backfill, next, preview): rows of operations.py's table, in its order."""

from __future__ import annotations

from typing import Any

from delaywheel.httpapi import schemas
from delaywheel.httpapi.operation import (
    CURSOR,
    LIMIT,
    PAUSED,
    Inputs,
    Operation,
    Param,
    as_is,
    by_id,
    found,
    json_object,
    optional_tail,
    page,
    paged,
    path_id,
    query_text,
    shown,
    wrapped,
)
from delaywheel.httpapi.values import body_in, body_out, query_number

# -- the builders ---------------------------------------------------------------------------


def _schedule_add(inputs: Inputs) -> tuple[str, list[Any]]:
    return "schedule_add", [body_in(json_object(inputs.body, "a schedule"))]


def _schedule_list(inputs: Inputs) -> tuple[str, list[Any]]:
    return paged("schedule_list", inputs, topic=query_text)


def _schedule_update(inputs: Inputs) -> tuple[str, list[Any]]:
    changes = body_in(json_object(inputs.body, "the changes"))
    version = query_number("expected_version", inputs.query.get("expected_version"))
    return "schedule_update", optional_tail([path_id(inputs), changes, version])


def _schedule_pause(inputs: Inputs) -> tuple[str, list[Any]]:
    return "schedule_pause", optional_tail([path_id(inputs), inputs.query.get("note")])


def _schedule_backfill(inputs: Inputs) -> tuple[str, list[Any]]:
    start = query_number("start", inputs.query.get("start"))
    end = query_number("end", inputs.query.get("end"))
    return "schedule_backfill", [path_id(inputs), start, end]


def _schedule_next(inputs: Inputs) -> tuple[str, list[Any]]:
    return "schedule_next", optional_tail(
        [path_id(inputs), query_number("n", inputs.query.get("n"))]
    )


def _schedule_preview(inputs: Inputs) -> tuple[str, list[Any]]:
    spec = json_object(inputs.body, "a schedule's spec")
    return "schedule_next", optional_tail([spec, query_number("n", inputs.query.get("n"))])


# -- results --------------------------------------------------------------------------------


def _created_schedule(result: Any, inputs: Inputs) -> tuple[int, Any]:
    return 201, body_out(result)


# -- the operations -------------------------------------------------------------------------

SCHEDULE_ID = Param("id", "path", schemas.ID, "the schedule's id", required=True)

SCHEDULE_OPERATIONS: tuple[Operation, ...] = (
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
        page("schedules"),
        schemas.ref("SchedulePage"),
        params=(
            Param("topic", "query", schemas.TOPIC, "only this topic's schedules"),
            PAUSED,
            LIMIT,
            CURSOR,
        ),
    ),
    Operation(
        "getSchedule",
        "GET",
        "/schedules/{id}",
        "schedule_get",
        by_id("schedule_get"),
        found("schedule"),
        schemas.ref("Schedule"),
        params=(SCHEDULE_ID,),
    ),
    Operation(
        "updateSchedule",
        "PATCH",
        "/schedules/{id}",
        "schedule_update",
        _schedule_update,
        shown,
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
        by_id("schedule_delete"),
        wrapped("deleted"),
        schemas.one_field("deleted", {"type": "boolean"}),
        params=(SCHEDULE_ID,),
    ),
    Operation(
        "pauseSchedule",
        "POST",
        "/schedules/{id}/pause",
        "schedule_pause",
        _schedule_pause,
        shown,
        schemas.ref("Schedule"),
        params=(SCHEDULE_ID, Param("note", "query", schemas.STRING, "why, for people")),
    ),
    Operation(
        "resumeSchedule",
        "POST",
        "/schedules/{id}/resume",
        "schedule_resume",
        by_id("schedule_resume"),
        shown,
        schemas.ref("Schedule"),
        params=(SCHEDULE_ID,),
    ),
    Operation(
        "triggerSchedule",
        "POST",
        "/schedules/{id}/trigger",
        "schedule_trigger",
        by_id("schedule_trigger"),
        as_is,
        schemas.one_field("id", schemas.STRING),
        params=(SCHEDULE_ID,),
    ),
    Operation(
        "backfillSchedule",
        "POST",
        "/schedules/{id}/backfill",
        "schedule_backfill",
        _schedule_backfill,
        as_is,
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
        as_is,
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
        as_is,
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
)
