"""Request validation: untrusted params in, checked values out.

Every failure raises ``RequestError`` with a protocol error code and a message
that names the field and the offending value, so a client can fix its call
without reading server logs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import msgpack  # type: ignore[import-untyped, unused-ignore]

from delaywheel.checks import bad, known_fields, number, show
from delaywheel.engine.task import DEFAULT_PRIORITY, MAX_PRIORITY, STATES, Completion, Task
from delaywheel.errors import RequestError

MAX_ID_BYTES = 200
MAX_TOPIC_BYTES = 200
MAX_LIST_LIMIT = 1000
DEFAULT_LIST_LIMIT = 100
DEFAULT_TTR_S = 60.0
DEFAULT_MAX_ATTEMPTS = 5
# The server's limits unless set (--max-body, --max-delay; config takes these).
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
DEFAULT_MAX_DELAY_S = 10 * 365 * 24 * 3600.0
DEFAULT_MAX_RESULT_BYTES = 64 * 1024  # --max-result: an ack's result, an HTTP answer kept

TASK_FIELDS = frozenset(
    {"id", "topic", "delay", "at", "body", "ttr", "target", "max_attempts", "priority", "retain"}
)
UPDATE_FIELDS = frozenset(
    {"delay", "at", "body", "topic", "ttr", "target", "max_attempts", "priority"}
)
LIST_FIELDS = frozenset({"topic", "state", "limit", "cursor"})


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_delay_s: float = DEFAULT_MAX_DELAY_S
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES


def params(method: str, values: list[Any], *names: str, optional: int = 0) -> list[Any]:
    """Check the arity of ``values``; missing optional trailing params come back as None."""
    least = len(names) - optional
    if not least <= len(values) <= len(names):
        wanted = ", ".join(names)
        raise bad(f"{method} takes [{wanted}], got {len(values)} params")
    return values + [None] * (len(names) - len(values))


def _fits(value: Any, max_bytes: int) -> bool:
    """A non-empty str of at most ``max_bytes`` UTF-8 bytes."""
    if type(value) is not str or not value:
        return False
    # A char is at most 4 bytes in UTF-8: short strings need no encoding.
    return len(value) * 4 <= max_bytes or len(value.encode()) <= max_bytes


def task_id(value: Any, field: str = "id") -> str:
    if not _fits(value, MAX_ID_BYTES):
        raise bad(f"{field} must be a str of 1 to {MAX_ID_BYTES} bytes, got {show(value)}")
    return value  # type: ignore[no-any-return]


def topic(value: Any) -> str:
    if not _fits(value, MAX_TOPIC_BYTES):
        raise bad(f"topic must be a str of 1 to {MAX_TOPIC_BYTES} bytes, got {show(value)}")
    return value  # type: ignore[no-any-return]


def max_attempts(value: Any) -> int:
    if type(value) is not int or value < 1:
        raise bad(f"max_attempts must be an int >= 1, got {show(value)}")
    return value


def priority(value: Any) -> int:
    if type(value) is not int or not 0 <= value <= MAX_PRIORITY:
        raise bad(f"priority must be an int from 0 to {MAX_PRIORITY}, got {show(value)}")
    return value


TARGET_TYPES = ("queue", "http", "redis", "amqp", "nats")


def target(value: Any) -> dict[str, Any]:
    """The shape every target shares: a map with a known ``type``. What each
    type holds is checked against the server's settings (``delivery.targets``)."""
    if type(value) is not dict or value.get("type") not in TARGET_TYPES:
        raise bad(
            f"target must be a map whose type is one of {', '.join(TARGET_TYPES)}, "
            f"got {show(value)}"
        )
    return value


# One Packer, reused: msgpack.packb builds a new one per call, which costs
# more than the packing (docs/performance.md, "Measurements behind the code").
# It resets itself after a failed pack. Used on the event loop's thread only.
_pack = msgpack.Packer(use_bin_type=True).pack


def packed_body(value: Any, limits: Limits) -> bytes:
    # _packed("body", ...), written out: once per add, a call less
    try:
        packed: bytes = _pack(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise bad(f"body cannot be packed: {exc}") from None
    if len(packed) > limits.max_body_bytes:
        raise RequestError(
            "too_large",
            f"body is {len(packed)} bytes packed, over the {limits.max_body_bytes}-byte limit",
        )
    return packed


def packed_result(value: Any, limits: Limits) -> bytes | None:
    """An ``ack``'s result, packed (None: none sent), at most ``--max-result``."""
    if value is None:
        return None
    return _packed("result", value, limits.max_result_bytes, " (--max-result)")


def _packed(field: str, value: Any, max_bytes: int, setting: str) -> bytes:
    try:
        packed: bytes = _pack(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise bad(f"{field} cannot be packed: {exc}") from None
    if len(packed) > max_bytes:
        raise RequestError(
            "too_large",
            f"{field} is {len(packed)} bytes packed, over the {max_bytes}-byte limit{setting}",
        )
    return packed


def packed_answer(value: Any) -> bytes | None:
    """A receiver's answer kept as a task's result (cut to ``--max-result``
    by its sender), packed."""
    return None if value is None else _pack(value)  # bytes, str and ints: always packable


def due_time(fields: dict[str, Any], now_s: float, limits: Limits) -> float | None:
    """The absolute due time from ``delay`` or ``at``; None when neither is given."""
    has_delay, has_at = "delay" in fields, "at" in fields
    if has_delay and has_at:
        delay, at = show(fields["delay"]), show(fields["at"])
        raise bad(f"give delay or at, not both (delay={delay}, at={at})")
    if has_delay:
        return now_s + number("delay", fields["delay"], high=limits.max_delay_s)
    if has_at:
        at_s = number("at", fields["at"], low=-math.inf)
        if at_s - now_s > limits.max_delay_s:
            raise bad(
                f"at {at_s!r} is {at_s - now_s:.0f} s away, over the maximum delay of "
                f"{limits.max_delay_s:.0f} s"
            )
        return at_s
    return None


# The id of a new task whose id the server is to make (``TaskTable.create``):
# an id given is never empty.
SERVER_MADE_ID = ""


def new_task(value: Any, now_s: float, limits: Limits) -> Task:
    """A task to add, its fields checked: in state ``new`` and in no place yet,
    its id ``SERVER_MADE_ID`` when none was given, and its target as sent
    (None: the ready queue), which the engine replaces with the checked one
    (``delivery.targets``). Its own retain, when given, is its completion's."""
    fields = known_fields("task", value, TASK_FIELDS)
    if "topic" not in fields:
        raise bad("task has no topic")
    at_s = due_time(fields, now_s, limits)
    # Checked in this order, so that of several bad fields the same one is named.
    # A default is not checked again. The Task is built here, the one object an
    # add makes (a checked copy first cost 2,800 instructions an add), and
    # positionally: a class called with keywords packs them into a dict for
    # __init__, 4,000 more (docs/performance.md, "Measurements behind the code").
    return Task(
        task_id(fields["id"]) if "id" in fields else SERVER_MADE_ID,
        topic(fields["topic"]),
        now_s if at_s is None else at_s,
        packed_body(fields.get("body"), limits),
        number("ttr", fields["ttr"], high=limits.max_delay_s) if "ttr" in fields else DEFAULT_TTR_S,
        max_attempts(fields["max_attempts"]) if "max_attempts" in fields else DEFAULT_MAX_ATTEMPTS,
        now_s,  # created_s
        target(fields["target"]) if "target" in fields else None,
        (
            Completion(number("retain", fields["retain"], high=limits.max_delay_s))
            if "retain" in fields
            else None
        ),
        priority(fields["priority"]) if "priority" in fields else DEFAULT_PRIORITY,
    )


@dataclass
class Changes:
    at_s: float | None = None
    topic: str | None = None
    body_packed: bytes | None = None
    ttr_s: float | None = None
    max_attempts: int | None = None
    target: dict[str, Any] | None = None  # as sent; checked by the engine
    priority: int | None = None


def changes(value: Any, now_s: float, limits: Limits) -> Changes:
    fields = known_fields("changes", value, UPDATE_FIELDS)
    return Changes(
        at_s=due_time(fields, now_s, limits),
        topic=topic(fields["topic"]) if "topic" in fields else None,
        body_packed=packed_body(fields["body"], limits) if "body" in fields else None,
        ttr_s=number("ttr", fields["ttr"], high=limits.max_delay_s) if "ttr" in fields else None,
        max_attempts=max_attempts(fields["max_attempts"]) if "max_attempts" in fields else None,
        target=target(fields["target"]) if "target" in fields else None,
        priority=priority(fields["priority"]) if "priority" in fields else None,
    )


@dataclass
class ListQuery:
    topic: str | None
    state: str | None
    limit: int
    cursor: int | str  # a str: a page of the far tier's (engine/horizon.py)


def list_query(value: Any) -> ListQuery:
    fields = known_fields("query", {} if value is None else value, LIST_FIELDS)
    state = fields.get("state")
    if state is not None and state not in STATES:
        raise bad(f"state must be one of {', '.join(STATES)}, got {show(state)}")
    limit = fields.get("limit", DEFAULT_LIST_LIMIT)
    if type(limit) is not int or not 1 <= limit <= MAX_LIST_LIMIT:
        raise bad(f"limit must be an int from 1 to {MAX_LIST_LIMIT}, got {show(limit)}")
    cursor = fields.get("cursor")
    if cursor is None:
        cursor = 0
    elif type(cursor) is str and cursor.startswith("f"):
        pass  # a page of the far tier: engine/horizon.py reads it
    elif type(cursor) is not int or cursor < 0:
        raise bad(f"cursor must be a value returned as next by list, got {show(cursor)}")
    found_topic = fields.get("topic")
    return ListQuery(
        topic=None if found_topic is None else topic(found_topic),
        state=state,
        limit=limit,
        cursor=cursor,
    )


def topics(value: Any) -> list[str]:
    if type(value) is str:
        return [topic(value)]
    if type(value) is not list or not value:
        raise bad(f"topics must be a topic or a non-empty list of topics, got {show(value)}")
    return [topic(item) for item in value]
