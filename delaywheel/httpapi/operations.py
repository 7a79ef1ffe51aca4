"""Every HTTP operation, written once: its path, the protocol method it calls, its params.

This table is what the server routes by (site.py, in this order: the first that fits
wins) and what /v1/openapi.json is made of (openapi.py). A row is an ``Operation``
(operation.py); the rows are written by what they serve: tasks (task_operations.py),
schedules (schedule_operations.py), topics' settings (topic_operations.py) and, here,
the server's own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from delaywheel.httpapi import schemas
from delaywheel.httpapi.operation import Inputs, Operation, as_is, wrapped
from delaywheel.httpapi.schedule_operations import SCHEDULE_OPERATIONS
from delaywheel.httpapi.task_operations import TASK_OPERATIONS
from delaywheel.httpapi.topic_operations import TOPIC_OPERATIONS


def _none(method: str) -> Callable[[Inputs], tuple[str, list[Any]]]:
    def build(inputs: Inputs) -> tuple[str, list[Any]]:
        return method, []

    return build


_SERVER_OPERATIONS: tuple[Operation, ...] = (
    Operation("stats", "GET", "/stats", "stats", _none("stats"), as_is, {"type": "object"}),
    Operation("cluster", "GET", "/cluster", "cluster", _none("cluster"), as_is, {"type": "object"}),
    Operation(
        "ping",
        "GET",
        "/ping",
        "ping",
        _none("ping"),
        wrapped("ping"),
        schemas.one_field("ping", {"const": "pong"}),
    ),
)

OPERATIONS: tuple[Operation, ...] = (
    *TASK_OPERATIONS,
    *SCHEDULE_OPERATIONS,
    *TOPIC_OPERATIONS,
    *_SERVER_OPERATIONS,
)

# Methods no operation stands for: auth is the Authorization header.
NOT_OPERATIONS = frozenset({"auth"})
