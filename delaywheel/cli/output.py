"""What commands print: JSON with the ``$bin`` wrapper for bytes, or readable text.

``to_json`` and ``from_json`` are inverses: bytes become ``{"$bin": "<base64>"}`` on
the way out, and a map whose only key is ``"$bin"`` becomes bytes on the way in
(``--json-body`` and ``import``).
"""

from __future__ import annotations

import base64
import json
import math
import re
import time
from collections.abc import Sequence
from typing import Any

from delaywheel.cli.durations import format_duration, format_relative, format_time

# -- JSON --------------------------------------------------------------------------


def to_json(value: Any) -> Any:
    """``value`` with bytes wrapped as ``{"$bin": base64}``, ready for ``json.dumps``."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$bin": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, dict):
        return {_json_key(k): to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def _json_key(key: Any) -> str:
    if isinstance(key, (bytes, bytearray)):
        return bytes(key).decode("utf-8", "backslashreplace")
    if isinstance(key, str):
        return key
    return json.dumps(to_json(key))


def from_json(value: Any) -> Any:
    """The inverse of ``to_json``: a map whose only key is ``"$bin"`` becomes bytes."""
    if isinstance(value, dict):
        if len(value) == 1 and "$bin" in value:
            encoded = value["$bin"]
            if not isinstance(encoded, str):
                raise ValueError(f'"$bin" must hold a base64 string, got {encoded!r}')
            try:
                return base64.b64decode(encoded, validate=True)
            except ValueError:
                raise ValueError(f'"$bin" holds bad base64: {encoded[:40]!r}') from None
        return {k: from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_json(v) for v in value]
    return value


def dumps(value: Any, indent: int | None = None) -> str:
    return json.dumps(to_json(value), ensure_ascii=False, indent=indent)


# -- readable text -----------------------------------------------------------------


def when_text(unix_s: Any, now_s: float | None = None) -> str:
    """A local ISO 8601 time, with ``(in 1h30m)`` when ``now_s`` is given; else as it is."""
    if not isinstance(unix_s, (int, float)) or not math.isfinite(unix_s):
        return str(unix_s)
    try:
        text = format_time(unix_s)
        return text if now_s is None else f"{text} ({format_relative(unix_s, now_s)})"
    except (OverflowError, OSError, ValueError):
        return str(unix_s)


def seconds_text(value: Any) -> str:
    if isinstance(value, (int, float)) and math.isfinite(value) and value >= 0:
        return format_duration(value)
    return str(value)


def plural(count: object, word: str, words: str | None = None) -> str:
    """``1 task``, ``2 tasks``; ``words`` where adding an s is wrong (``batches``)."""
    return f"{count} {word if count == 1 else words or word + 's'}"


def _body_text(body: Any) -> tuple[str, str]:
    """(label, text) for a task body."""
    if isinstance(body, str):
        return "body (str)", body
    if isinstance(body, (bytes, bytearray)):
        raw = bytes(body)
        try:
            return f"body (bin, {len(raw)} bytes)", raw.decode("utf-8")
        except UnicodeDecodeError:
            return f"body (bin, {len(raw)} bytes, base64)", base64.b64encode(raw).decode()
    return "body (json)", dumps(body, indent=2)


# A name shown as is; any other is quoted, so that a key such as "a, broker b"
# cannot pass for the fields after it.
_PLAIN_NAME = re.compile(r'[^\s,"]+')


def _name_text(value: Any) -> str:
    """A key, routing key, subject or broker name: as is, or quoted as JSON."""
    if isinstance(value, str) and value.isprintable() and _PLAIN_NAME.fullmatch(value):
        return value
    return json.dumps(to_json(value), ensure_ascii=False)


def _target_text(target: Any) -> str:
    """Where a due task goes, on one line: the kind, what it names, and the broker.

    HTTP headers are left out, since they may hold credentials (``Authorization``);
    ``--json`` shows the whole target.
    """
    if not isinstance(target, dict):
        return str(target)
    kind = target.get("type", "queue")
    if kind == "queue":
        return "queue"
    if kind == "http":
        return f"http {target.get('method', 'POST')} {target.get('url')}"
    if kind == "redis":
        mode, key = target.get("mode", "list"), _name_text(target.get("key"))
        return f"redis {mode} {key}, broker {_name_text(target.get('broker', 'store'))}"
    if kind == "amqp":
        exchange = target.get("exchange", "")
        on = f"exchange {_name_text(exchange)}" if exchange else "default exchange"
        routing_key = _name_text(target.get("routing_key"))
        return f"amqp routing key {routing_key}, {on}, broker {_name_text(target.get('broker'))}"
    if kind == "nats":
        subject = _name_text(target.get("subject"))
        return f"nats subject {subject}, broker {_name_text(target.get('broker'))}"
    rest = {key: value for key, value in target.items() if key != "type"}
    return f"{kind} {dumps(rest)}" if rest else str(kind)  # a kind newer than this CLI


# Fields task_text shows in rows of their own; the rest are listed as JSON after them.
_SHOWN = {"id", "topic", "state", "at", "deadline", "attempts", "max_attempts", "ttr"}
_SHOWN |= {"target", "created", "cycle", "slot", "body", "retain", "completed", "outcome"}


def task_text(task: dict[str, Any]) -> str:
    """A task as ``name: value`` rows, its body last."""
    now = time.time()
    rows: list[tuple[str, str]] = [
        ("id", str(task.get("id"))),
        ("topic", str(task.get("topic"))),
        ("state", str(task.get("state"))),
        ("due", when_text(task.get("at"), now)),
    ]
    if task.get("deadline") is not None:
        rows.append(("deadline", when_text(task["deadline"], now)))
    rows.append(("attempts", f"{task.get('attempts', 0)} of {task.get('max_attempts', '?')}"))
    if "ttr" in task:
        rows.append(("ttr", seconds_text(task["ttr"])))
    if "target" in task:
        rows.append(("target", _target_text(task["target"])))
    if "created" in task:
        rows.append(("created", when_text(task["created"], now)))
    wheel = wheel_text(task)
    if wheel is not None:
        rows.append(("wheel", wheel))
    if "retain" in task:
        rows.append(("retain", seconds_text(task["retain"])))
    if "completed" in task:  # and its result, in a row of its own below
        rows.append(("completed", when_text(task["completed"], now)))
        rows.append(("outcome", str(task.get("outcome"))))
    rows.extend((key, value_text(key, value)) for key, value in task.items() if key not in _SHOWN)
    width = max(len(key) for key, _ in rows) + 1
    lines = [f"{key + ':':<{width}} {value}" for key, value in rows]
    label, text = _body_text(task.get("body"))
    lines.append(f"{label}:")
    lines.append(text)
    return "\n".join(lines)


def wheel_text(task: dict[str, Any]) -> str | None:
    """``cycle C, slot S`` of a task in the wheel; None when it is not in it (ready, dead)."""
    cycle, slot = task.get("cycle"), task.get("slot")
    if cycle is None and slot is None:
        return None
    return f"cycle {'-' if cycle is None else cycle}, slot {'-' if slot is None else slot}"


def value_text(name: str, value: Any) -> str:
    """A scalar for people: yes/no, ``-`` for nothing (``never`` for a time), else JSON."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    is_time = name.endswith(("_since", "_at"))
    if value is None:
        return "never" if is_time else "-"
    if is_time and isinstance(value, (int, float)):
        return when_text(value, time.time())
    if isinstance(value, str):
        return value
    return dumps(value)


def table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    """Columns padded to their widest cell, two spaces apart, the header first."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    )


# The LAST ERROR column's width: a table line stays readable; --json and `get`
# show the whole error.
LAST_ERROR_CHARS = 60


def task_table(tasks: list[dict[str, Any]]) -> str:
    """id, topic, state, priority, due and attempts; and the last error, when a
    task has one (a dead task's, or one waiting to be tried again)."""
    header: tuple[str, ...] = ("ID", "TOPIC", "STATE", "PRI", "DUE", "ATTEMPTS")
    rows: list[tuple[str, ...]] = [
        (
            str(t.get("id")),
            str(t.get("topic")),
            str(t.get("state")),
            str(t.get("priority", "-")),
            when_text(t.get("at")),
            f"{t.get('attempts', 0)}/{t.get('max_attempts', '?')}",
        )
        for t in tasks
    ]
    if any(t.get("last_error") for t in tasks):
        header += ("LAST ERROR",)
        rows = [(*row, _short(t.get("last_error"))) for row, t in zip(rows, tasks, strict=True)]
    return table(header, rows)


def _short(error: Any) -> str:
    text = " ".join(str(error or "").split())  # one line
    return text if len(text) <= LAST_ERROR_CHARS else text[: LAST_ERROR_CHARS - 1] + "…"


def stats_text(stats: Any, indent: int = 0) -> str:
    """Server statistics as indented ``name: value`` lines, one level a nested map."""
    if not isinstance(stats, dict):
        return " " * indent + str(to_json(stats))
    lines = []
    pad = " " * indent
    for key, value in stats.items():
        name = _json_key(key)
        if isinstance(value, dict):
            if value:
                lines.append(f"{pad}{name}:")
                lines.append(stats_text(value, indent + 2))
            else:
                lines.append(f"{pad}{name}: none")
        elif name in ("uptime", "uptime_s") and isinstance(value, (int, float)):
            lines.append(f"{pad}{name}: {seconds_text(value)}")
        elif name in ("tick", "tick_s") and isinstance(value, (int, float)):
            lines.append(f"{pad}{name}: {value * 1000:g} ms")
        else:
            lines.append(f"{pad}{name}: {value_text(name, value)}")
    return "\n".join(lines)
