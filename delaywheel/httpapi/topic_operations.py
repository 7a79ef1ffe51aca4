"""The operations on topics' settings (list, get, set): rows of operations.py's table,
in its order."""

from __future__ import annotations

from typing import Any

from delaywheel.httpapi import schemas
from delaywheel.httpapi.operation import (
    CURSOR,
    LIMIT,
    PAUSED,
    TOPIC,
    Inputs,
    Operation,
    as_is,
    json_object,
    page,
    paged,
)


def _topic_list(inputs: Inputs) -> tuple[str, list[Any]]:
    return paged("topic_list", inputs)


def _topic_get(inputs: Inputs) -> tuple[str, list[Any]]:
    return "topic_get", [inputs.path["topic"]]


def _topic_set(inputs: Inputs) -> tuple[str, list[Any]]:
    return "topic_set", [inputs.path["topic"], json_object(inputs.body, "the settings")]


TOPIC_OPERATIONS: tuple[Operation, ...] = (
    Operation(
        "listTopics",
        "GET",
        "/topics",
        "topic_list",
        _topic_list,
        page("topics"),
        schemas.ref("TopicPage"),
        params=(
            PAUSED,
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
        as_is,
        schemas.ref("Topic"),
        params=(TOPIC,),
    ),
    Operation(
        "setTopic",
        "PATCH",
        "/topics/{topic}",
        "topic_set",
        _topic_set,
        as_is,
        schemas.ref("Topic"),
        params=(TOPIC,),
        body=schemas.ref("TopicSettings"),
    ),
)
