"""Schedules as ``delaywheel schedule get`` and ``list`` print them for people.

``--json`` prints the server's maps as they are; these are the text forms: a
schedule as ``name: value`` rows (``schedule_text``) and a page of them as a
table (``schedule_table``).
"""

from __future__ import annotations

import time
from typing import Any

from delaywheel.cli.output import _body_text, _target_text, seconds_text, when_text

# What a schedule map holds besides its fields: the state the server adds.
_COUNTS = ("fired", "skipped", "missed")


def spec_text(schedule: dict[str, Any]) -> str:
    """``cron '30 1 * * *' Europe/London`` or ``every 15m from 1970-01-01T...``."""
    if schedule.get("cron") is not None:
        return f"cron '{schedule['cron']}' {schedule.get('tz') or 'UTC'}"
    every = seconds_text(schedule.get("every"))
    anchor = schedule.get("anchor") or 0
    return f"every {every}" if anchor == 0 else f"every {every} from {when_text(anchor)}"


def counts_text(counts: Any) -> str:
    if not isinstance(counts, dict):
        return str(counts)
    return ", ".join(f"{name} {counts.get(name, 0)}" for name in _COUNTS)


def _policies_text(schedule: dict[str, Any]) -> str:
    window = seconds_text(schedule.get("catchup_window"))
    return (
        f"catchup {schedule.get('catchup')} (window {window}), "
        f"overlap {schedule.get('overlap')}, jitter {seconds_text(schedule.get('jitter', 0))}"
    )


def _paused_text(schedule: dict[str, Any]) -> str:
    if not schedule.get("paused"):
        return "no"
    note = schedule.get("note")
    return "yes" if note is None else f"yes: {note}"


def schedule_text(schedule: dict[str, Any]) -> str:
    """A schedule as ``name: value`` rows, its template's body last."""
    now = time.time()
    last_fired = schedule.get("last_fired")
    rows: list[tuple[str, str]] = [
        ("id", str(schedule.get("id"))),
        ("spec", spec_text(schedule)),
        ("topic", str(schedule.get("topic"))),
        ("next", "none" if schedule.get("next") is None else when_text(schedule["next"], now)),
        ("last fired", "never" if last_fired is None else when_text(last_fired, now)),
        ("counts", counts_text(schedule.get("counts"))),
        ("paused", _paused_text(schedule)),
        ("version", str(schedule.get("version"))),
        ("policies", _policies_text(schedule)),
    ]
    for name in ("start_at", "end_at"):
        if schedule.get(name) is not None:
            rows.append((name.replace("_", " "), when_text(schedule[name], now)))
    if schedule.get("max_runs") is not None:
        rows.append(("max runs", str(schedule["max_runs"])))
    if schedule.get("ttr") is not None:
        rows.append(("ttr", seconds_text(schedule["ttr"])))
    if schedule.get("max_attempts") is not None:
        rows.append(("max attempts", str(schedule["max_attempts"])))
    if schedule.get("target") is not None:
        rows.append(("target", _target_text(schedule["target"])))
    width = max(len(name) for name, _ in rows) + 1
    lines = [f"{name + ':':<{width}} {value}" for name, value in rows]
    if "body" in schedule:
        label, text = _body_text(schedule["body"])
        lines.extend([f"{label}:", text])
    return "\n".join(lines)


def schedule_table(schedules: list[dict[str, Any]]) -> str:
    header = ("ID", "SPEC", "TOPIC", "NEXT", "FIRED", "PAUSED")
    rows = [
        (
            str(s.get("id")),
            spec_text(s),
            str(s.get("topic")),
            "-" if s.get("next") is None else when_text(s["next"]),
            str((s.get("counts") or {}).get("fired", 0)),
            "yes" if s.get("paused") else "no",
        )
        for s in schedules
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    )
