"""One row of the operations table, and the parts rows share.

An ``Operation`` says how a request becomes the protocol method's params (``build``:
path, query and JSON body in, ``(method, params)`` out, with no check of its own beyond
reading JSON: the protocol's checks run on the params as they run on a connection's
request) and how the method's result becomes the response (``answer``). Its summary is
the client method's docstring (delaywheel_client/commands.py), so the document and the
clients say the same. The table itself is operations.py's; the rows are written by what
they serve (task_operations.py, schedule_operations.py, topic_operations.py).
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
    body_out,
    cursor_in,
    cursor_out,
    query_bool,
    query_number,
)


@dataclass(frozen=True)
class Inputs:
    """What a request carries: its path's params, query, JSON body and headers (by
    lower-cased name)."""

    path: Mapping[str, str]
    query: Mapping[str, str]
    body: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)


# What a row's two functions are: a request's inputs to ``(method, params)``, and the
# method's result (with the inputs) to ``(status, JSON)`` (None: no body).
Build = Callable[[Inputs], tuple[str, list[Any]]]
Answer = Callable[[Any, Inputs], tuple[int, Any]]
# A query value's reader: its name and text (None: not given) to the value.
QueryReader = Callable[[str, str | None], Any]


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
    build: Build
    answer: Answer  # status, JSON (None: no body)
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


def json_object(body: Any, what: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadInput(f"the body must be a JSON object ({what}), got {show(body)}")
    return body


def query_map(inputs: Inputs, names: dict[str, QueryReader]) -> dict[str, Any]:
    """The query params that were given, read as numbers or booleans where the
    protocol takes those."""
    out = {}
    for name, read in names.items():
        text = inputs.query.get(name)
        if text is not None:
            out[name] = read(name, text)
    return out


def query_text(name: str, text: str | None) -> Any:
    return text


def path_id(inputs: Inputs) -> str:
    return inputs.path["id"]


def optional_tail(params: list[Any]) -> list[Any]:
    """Trailing params that were not given are left out: the protocol's defaults apply."""
    while params and params[-1] is None:
        params.pop()
    return params


def by_id(method: str) -> Build:
    def build(inputs: Inputs) -> tuple[str, list[Any]]:
        return method, [path_id(inputs)]

    return build


def paged(method: str, inputs: Inputs, **more: QueryReader) -> tuple[str, list[Any]]:
    """A ``*_list`` call: ``paused``, ``limit``, ``cursor`` and ``more`` from the query."""
    query = query_map(inputs, {**more, "paused": query_bool, "limit": query_number})
    cursor = cursor_in(inputs.query.get("cursor"))
    if cursor is not None:
        query["cursor"] = cursor
    return method, [query]


# -- results --------------------------------------------------------------------------------


def as_is(result: Any, inputs: Inputs) -> tuple[int, Any]:
    return 200, result


def found(what: str) -> Answer:
    def answer(result: Any, inputs: Inputs) -> tuple[int, Any]:
        if result is None:
            raise RequestError("not_found", f"no {what} with id {show(path_id(inputs))}")
        return 200, body_out(result)

    return answer


def wrapped(name: str) -> Answer:
    def answer(result: Any, inputs: Inputs) -> tuple[int, Any]:
        return 200, {name: result}

    return answer


def shown(result: Any, inputs: Inputs) -> tuple[int, Any]:
    return 200, body_out(result)


def page(key: str) -> Answer:
    def answer(result: Any, inputs: Inputs) -> tuple[int, Any]:
        return 200, {
            key: [body_out(item) for item in result[key]],
            "next": cursor_out(result["next"]),
        }

    return answer


# -- the params more than one kind of operation takes, as the document shows them -----------

TOPIC = Param("topic", "path", schemas.TOPIC, "the topic", required=True)
LIMIT = Param(
    "limit", "query", {"type": "integer", "minimum": 1, "maximum": 1000}, "page size (default 100)"
)
CURSOR = Param("cursor", "query", schemas.STRING, "the previous page's next")
PAUSED = Param("paused", "query", {"type": "boolean"}, "only paused (true) or running (false) ones")
