"""Durations and points in time as people type them on a command line.

``parse_duration`` reads seconds: a plain number (``"90"``, ``"1.5"``) or one or more
number-and-unit parts (``"90s"``, ``"30m"``, ``"2h"``, ``"5d"``, ``"1h30m"``, ``"1.5h"``).
Units: ``ms``, ``s``, ``m``, ``h``, ``d``, ``w`` (case does not matter; spaces between
parts are allowed). Negative, empty, non-finite and unit-less compound values are refused
with a ``ValueError`` that quotes the text.

``parse_when`` reads an absolute time as Unix seconds: an ISO 8601 time
(``"2026-12-24T09:00:00Z"``, ``"2026-12-24T09:00:00+01:00"``, or naive, which is local
time; a bare date is local midnight), a duration counted from ``now_s``, or ``"now"``.

``format_duration`` writes seconds back in the unit form, so that
``parse_duration(format_duration(x))`` equals ``x`` to the millisecond.
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timezone

UNITS: dict[str, float] = {
    "ms": 0.001,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
    "w": 7 * 86400.0,
}

_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_PART = re.compile(rf"\s*({_NUMBER})\s*(ms|s|m|h|d|w)\s*")
_PLAIN = re.compile(rf"\+?{_NUMBER}(?:e[+-]?\d+)?")


def parse_duration(text: str) -> float:
    """Seconds in ``text``: ``"90"``, ``"1.5"``, ``"90s"``, ``"30m"``, ``"2h"``, ``"1h30m"``."""
    if not isinstance(text, str):
        raise ValueError(f"duration must be text, got {text!r}")
    stripped = text.strip().lower()
    if not stripped:
        raise ValueError(f"empty duration {text!r}: give seconds or e.g. 90s, 30m, 2h, 5d")
    if stripped.startswith("-"):
        raise ValueError(f"negative duration {text!r}: durations count forward from now")
    if _PLAIN.fullmatch(stripped):
        return _finite(float(stripped), text)
    total = 0.0
    pos = 0
    while pos < len(stripped):
        match = _PART.match(stripped, pos)
        if match is None:
            raise ValueError(
                f"bad duration {text!r}: expected seconds or number+unit parts such as "
                f"90s, 30m, 2h, 5d, 1h30m (units: {', '.join(UNITS)})"
            )
        total += float(match.group(1)) * UNITS[match.group(2)]
        pos = match.end()
    return _finite(total, text)


def _finite(seconds: float, text: str) -> float:
    if not math.isfinite(seconds):
        raise ValueError(f"duration {text!r} is too large")
    return seconds


def parse_when(text: str, now_s: float) -> float:
    """Unix seconds for ``text``: an ISO 8601 time, or a duration from ``now_s``."""
    if not isinstance(text, str):
        raise ValueError(f"time must be text, got {text!r}")
    stripped = text.strip()
    if stripped.lower() == "now":
        return now_s
    try:
        return now_s + parse_duration(text)
    except ValueError:
        pass
    iso = stripped[:-1] + "+00:00" if stripped[-1:] in ("Z", "z") else stripped
    try:
        moment = datetime.fromisoformat(iso)
    except ValueError:
        raise ValueError(
            f"bad time {text!r}: expected an ISO 8601 time such as 2026-12-24T09:00:00Z "
            f"(naive times are local) or a duration from now such as 90s, 30m, 2h"
        ) from None
    # A naive datetime's timestamp() is taken in local time, which is what we document.
    return moment.timestamp()


def format_duration(seconds: float) -> str:
    """``seconds`` as ``"1h30m"``, ``"2d3h4m5.25s"`` or ``"0s"``: ``parse_duration`` reads it."""
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"cannot format duration {seconds!r}")
    millis = round(seconds * 1000)
    parts = []
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000)):
        count, millis = divmod(millis, size)
        if count:
            parts.append(f"{count}{unit}")
    if millis or not parts:
        whole, frac = divmod(millis, 1000)
        parts.append(f"{whole}.{frac:03d}".rstrip("0").rstrip(".") + "s")
    return "".join(parts)


def format_time(unix_s: float) -> str:
    """Unix seconds as a local ISO 8601 time with its UTC offset, to the second."""
    return datetime.fromtimestamp(unix_s, timezone.utc).astimezone().isoformat(timespec="seconds")


def format_relative(unix_s: float, now_s: float) -> str:
    """``"in 1h30m"`` or ``"5s ago"``."""
    delta = unix_s - now_s
    if abs(delta) < 0.5:
        return "now"
    text = format_duration(round(abs(delta)))
    return f"in {text}" if delta > 0 else f"{text} ago"
