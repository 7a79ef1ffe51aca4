"""How the pages write values for people: durations, sizes, times absolute and
relative, settings, targets, and text that may wrap only at separators.

Pure functions, registered as Jinja filters by ``context``. Nothing here
reads the engine: the pages hand in what ``views`` read.

Text that can be long (ids, topics, errors, URLs, time zones) goes through
``breakable``: it is escaped and gets a ``<wbr>`` after each separator
(``/ . - _ : , ; = & ? @ | + ) ] }``; spaces break anyway), so a narrow column wraps between
"webhook/" and "s", never inside a word; a word longer than its column makes
the table scroll inside its box instead.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from typing import Any

from markupsafe import Markup, escape

from delaywheel.web.views import visible

# After these a line may break: they end a part of a path, name or sentence.
_SEPARATOR = re.compile(r"([/.\-_:,;=&?@|+)\]}]+)")
# Header names whose values are secrets (matched in lower case, anywhere in the name).
_SECRET_HEADER_WORDS = ("auth", "token", "secret", "key", "cookie", "password", "signature")


def breakable(value: Any) -> Markup:
    """``value`` escaped (hiding characters spelled out), with a ``<wbr>`` after each separator."""
    # Split before escaping: an entity (&amp;) must not get a <wbr> inside it.
    parts = _SEPARATOR.split(visible(str(value)))
    # split() with a group alternates word, separators, word...: a break after each run.
    return Markup("").join(
        escape(part) + (Markup("<wbr>") if n % 2 else Markup("")) for n, part in enumerate(parts)
    )


def duration(seconds: float | None) -> str:
    """``seconds`` as people read it: "250 ms", "1.5 s", "5 min", "3 h 20 min", "10 years"."""
    if seconds is None or seconds != seconds:
        return "none"
    if math.isinf(seconds):
        return "forever"
    s = abs(seconds)
    if s == 0:
        return "0 s"
    if s < 1:
        return f"{s * 1000:.3g} ms"
    if s < 60:
        return f"{s:.3g} s"
    if s < 3600:
        minutes, rest = divmod(round(s), 60)
        return f"{minutes} min" + (f" {rest} s" if rest else "")
    if s < 86400:
        hours, rest = divmod(round(s / 60), 60)
        return f"{hours} h" + (f" {rest} min" if rest else "")
    if s < 2 * 365 * 86400:
        days = s / 86400
        return f"{days:.3g} days"
    return f"{s / (365 * 86400):.3g} years"


def relative(at_s: float | None, now_s: float | None = None) -> str:
    """``at_s`` from now: "in 5 min", "3 s ago", "now"."""
    if at_s is None or at_s != at_s:
        return ""
    delta = at_s - (time.time() if now_s is None else now_s)
    if abs(delta) < 0.5:
        return "now"
    shown = duration(abs(delta) if abs(delta) >= 1 else round(abs(delta), 1))
    return f"in {shown}" if delta > 0 else f"{shown} ago"


def lateness(at_s: float | None, now_s: float | None = None) -> str:
    """How late a due task is: "3 s late" ("" when it is not due yet)."""
    if at_s is None:
        return ""
    late = (time.time() if now_s is None else now_s) - at_s
    return f"{duration(late)} late" if late >= 0.5 else ""


def iso(at_s: float | None) -> str:
    """``at_s`` for a ``<time datetime>``."""
    if at_s is None or at_s != at_s:
        return ""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at_s))


def size(n: int | float | None) -> str:
    """A byte count: "512 bytes", "1 KiB", "4 MiB"."""
    if n is None:
        return "none"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{int(n)} bytes"


def count(n: int, noun: str) -> str:
    """ "1 task", "3 tasks" (English plurals of our nouns: a trailing s)."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


# -- the server page ------------------------------------------------------------


@dataclass
class SettingRow:
    name: str  # the field's name, in words
    option: str  # the serve option that sets it
    value: str


# Fields whose serve option is not the field's name with dashes.
_OPTIONS = {"store_url": "--store", "brokers": "--broker", "max_message_bytes": "--max-message"}
_OPTIONS |= {"max_body_bytes": "--max-body", "max_result_bytes": "--max-result"}


# Fields no serve option sets (the protocol's limits, fixed in this version).
_NO_OPTION = frozenset({"max_delay_s"})


def option_of(field: str) -> str:
    """The ``serve`` option that sets the settings field ``field`` ("" for none)."""
    if field in _NO_OPTION:
        return ""
    if field in _OPTIONS:
        return _OPTIONS[field]
    name = field.removesuffix("_s")
    return "--" + name.replace("_", "-")


def setting_value(field: str, value: Any) -> str:
    """A setting's value in words: units, "none", "yes"/"no", lists joined."""
    if value is None or value == "" or value == [] or value == ():
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if field.endswith("_s") and isinstance(value, int | float):
        return duration(float(value))
    if field.endswith("_bytes") and isinstance(value, int):
        return size(value)
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def settings_rows(shown: dict[str, Any]) -> list[SettingRow]:
    """``logs.shown_settings``' map (secrets already ``***``) as the server page's rows."""
    return [
        SettingRow(
            field.removesuffix("_s").replace("_", " "), option_of(field), setting_value(field, v)
        )
        for field, v in shown.items()
    ]


# -- a task's target ------------------------------------------------------------


def secret_header(name: str) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in _SECRET_HEADER_WORDS)


def target_rows(target: dict[str, Any]) -> list[tuple[str, str]]:
    """A task's target as ``(label, value)`` rows: every field, headers one a
    row with the values of secret ones (``Authorization``, ``X-Api-Key``...) as ``***``."""
    rows: list[tuple[str, str]] = [("type", str(target.get("type", "queue")))]
    for key, value in target.items():
        if key == "type":
            continue
        if key == "headers" and isinstance(value, dict):
            if not value:
                rows.append(("headers", "none"))
            for name, header in value.items():
                shown = "***" if secret_header(str(name)) else str(header)
                rows.append((f"header {name}", shown))
        elif key == "timeout" and isinstance(value, int | float):
            rows.append(("timeout", duration(float(value))))
        elif key == "exchange" and value == "":
            rows.append(("exchange", "the default exchange"))
        else:
            rows.append((str(key), str(value)))
    return rows
