"""The schedule map: its fields, their checks and defaults (docs/schedules.md).

``check_schedule`` turns an untrusted map into a ``Schedule``; every refusal
is ``bad_request`` naming the field. The task template (topic, body, ttr,
max_attempts, target, priority) is carried as given: the engine checks it exactly as
it checks ``add``, since those checks live above this layer.

Instants are integer milliseconds since the Unix epoch (``_ms``) inside, so
``anchor + k·every`` is exact; the map speaks seconds, as the protocol does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from delaywheel.checks import bad, known_fields, number, show
from delaywheel.schedules.cron import Cron, CronError, parse

SPEC_FIELDS = frozenset({"cron", "every", "tz", "anchor"})
POLICY_FIELDS = frozenset(
    {"start_at", "end_at", "max_runs", "jitter", "catchup", "catchup_window", "overlap"}
)
TEMPLATE_FIELDS = frozenset({"topic", "body", "ttr", "max_attempts", "target", "priority"})
SCHEDULE_FIELDS = frozenset({"id"}) | SPEC_FIELDS | POLICY_FIELDS | TEMPLATE_FIELDS
# What schedule_update may change: everything but the id.
CHANGE_FIELDS = SCHEDULE_FIELDS - {"id"}

CATCHUP_POLICIES = ("latest", "skip", "all")
OVERLAP_POLICIES = ("skip", "buffer_one", "allow")
DEFAULT_CATCHUP = "latest"
DEFAULT_CATCHUP_WINDOW_S = 24 * 3600.0
DEFAULT_OVERLAP = "skip"
HORIZON_S = 50 * 365.25 * 24 * 3600  # "no occurrence in the next 50 years"
MAX_ID_BYTES = 180  # leaves room in a task id (200 bytes) for "s:" and ":{nominal}"
# The areas of IANA's canonical names; anything else ("EST", "CET",
# "Local", "+05:00", "Etc/GMT+5" with its inverted sign) is ambiguous.
_IANA_AREAS = frozenset(
    {
        "Africa",
        "America",
        "Antarctica",
        "Arctic",
        "Asia",
        "Atlantic",
        "Australia",
        "Europe",
        "Indian",
        "Pacific",
    }
)


@dataclass(frozen=True)
class Spec:
    """When a schedule fires: a cron expression in a zone, or every ``every_ms``
    from ``anchor_ms``. Exactly one of ``cron`` and ``every_ms`` is set."""

    cron: Cron | None = None
    tz: str = "UTC"
    every_ms: int | None = None
    anchor_ms: int = 0

    def next_after_ms(self, after_ms: int) -> int | None:
        """The first nominal instant strictly after ``after_ms``, ignoring bounds."""
        if self.cron is not None:
            # Cron instants are whole seconds: strictly after the second holding after_ms.
            found = self.cron.next_after(after_ms // 1000)
            return None if found is None else found * 1000
        assert self.every_ms is not None
        steps = (after_ms - self.anchor_ms) // self.every_ms + 1
        return self.anchor_ms + steps * self.every_ms


@dataclass(frozen=True)
class Schedule:
    id: str
    spec: Spec
    start_at_ms: int | None = None
    end_at_ms: int | None = None
    max_runs: int | None = None
    jitter_ms: int = 0
    catchup: str = DEFAULT_CATCHUP
    catchup_window_ms: int = int(DEFAULT_CATCHUP_WINDOW_S * 1000)
    overlap: str = DEFAULT_OVERLAP
    template: dict[str, Any] = field(default_factory=dict)

    def first_after(self, after_ms: int) -> int | None:
        """The first occurrence strictly after ``after_ms`` within start_at and
        end_at (max_runs is the engine's count, not a time bound)."""
        if self.start_at_ms is not None and after_ms < self.start_at_ms:
            after_ms = self.start_at_ms - 1
        found = self.spec.next_after_ms(after_ms)
        if found is None or (self.end_at_ms is not None and found > self.end_at_ms):
            return None
        return found

    def to_map(self) -> dict[str, Any]:
        """The schedule map as sent back (without state: the engine adds it)."""
        out: dict[str, Any] = {"id": self.id}
        out.update(spec_map(self.spec))
        out["start_at"] = _seconds(self.start_at_ms)
        out["end_at"] = _seconds(self.end_at_ms)
        out["max_runs"] = self.max_runs
        out["jitter"] = self.jitter_ms / 1000
        out["catchup"] = self.catchup
        out["catchup_window"] = self.catchup_window_ms / 1000
        out["overlap"] = self.overlap
        out.update(self.template)
        return out


def spec_map(spec: Spec) -> dict[str, Any]:
    if spec.cron is not None:
        return {"cron": spec.cron.expr, "tz": spec.tz}
    assert spec.every_ms is not None
    return {"every": spec.every_ms / 1000, "anchor": spec.anchor_ms / 1000}


def _seconds(value_ms: int | None) -> float | None:
    return None if value_ms is None else value_ms / 1000


def _ms(field_name: str, value: Any, *, low: float = 0.0) -> int:
    return round(number(field_name, value, low=low) * 1000)


def check_zone(value: Any) -> ZoneInfo | None:
    """An IANA zone name or ``UTC`` (None: UTC). Local time, offsets and
    abbreviations are refused: they do not say which rules apply."""
    if value == "UTC":
        return None
    area = value.split("/", 1)[0] if type(value) is str else ""
    if area not in _IANA_AREAS or "/" not in value:
        raise bad(
            f"tz must be an IANA zone name such as 'Europe/London', or 'UTC', got {show(value)}"
            " (local time, offsets and abbreviations are ambiguous)"
        )
    try:
        return ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise bad(f"tz {show(value)} is not a zone tzdata knows") from None


def check_spec(value: dict[str, Any], tick_s: float) -> Spec:
    """The ``cron``/``tz`` or ``every``/``anchor`` of a map (other fields ignored)."""
    has_cron, has_every = "cron" in value, "every" in value
    if has_cron == has_every:
        raise bad("a schedule needs exactly one of cron (an expression) and every (seconds)")
    if has_cron:
        if "anchor" in value:
            raise bad("anchor is for every, not for cron")
        expr, tz = value["cron"], value.get("tz", "UTC")
        if type(expr) is not str:
            raise bad(f"cron must be a str, got {show(expr)}")
        zone = check_zone(tz)
        try:
            cron = parse(expr, zone)
        except CronError as error:
            raise bad(f"cron {show(expr)}: {error}") from None
        return Spec(cron=cron, tz=tz)
    if "tz" in value:
        raise bad("tz is for cron, not for every (every counts elapsed time)")
    every_ms = _ms("every", value["every"], low=0.001)
    if every_ms < tick_s * 1000:
        raise bad(f"every must be at least the tick ({tick_s:g} s), got {show(value['every'])}")
    anchor = value.get("anchor", 0)
    anchor_ms = round(number("anchor", anchor, low=-math.inf) * 1000)
    return Spec(every_ms=every_ms, anchor_ms=anchor_ms)


def _choice(value: dict[str, Any], name: str, choices: tuple[str, ...], default: str) -> str:
    chosen = value.get(name, default)
    if chosen not in choices:
        raise bad(f"{name} must be one of {', '.join(choices)}, got {show(chosen)}")
    return str(chosen)


def check_schedule(value: Any, tick_s: float, now_ms: int | None) -> Schedule:
    """A whole schedule map, checked; refused if it never fires in 50 years from
    ``now_ms`` (None: not asked, as for a stored schedule read back)."""
    fields = known_fields("schedule", value, SCHEDULE_FIELDS)
    schedule_id = fields.get("id")
    if type(schedule_id) is not str or not 0 < len(schedule_id.encode()) <= MAX_ID_BYTES:
        raise bad(f"id must be a str of 1 to {MAX_ID_BYTES} bytes, got {show(schedule_id)}")
    spec = check_spec(fields, tick_s)
    start_at_ms = (
        _ms("start_at", fields["start_at"]) if fields.get("start_at") is not None else None
    )
    end_at_ms = _ms("end_at", fields["end_at"]) if fields.get("end_at") is not None else None
    if start_at_ms is not None and end_at_ms is not None and end_at_ms < start_at_ms:
        raise bad(f"end_at must not be before start_at, got {show(fields['end_at'])}")
    max_runs = fields.get("max_runs")
    if max_runs is not None and (type(max_runs) is not int or max_runs < 1):
        raise bad(f"max_runs must be an int >= 1, got {show(max_runs)}")
    schedule = Schedule(
        id=schedule_id,
        spec=spec,
        start_at_ms=start_at_ms,
        end_at_ms=end_at_ms,
        max_runs=max_runs,
        jitter_ms=_ms("jitter", fields.get("jitter", 0)),
        catchup=_choice(fields, "catchup", CATCHUP_POLICIES, DEFAULT_CATCHUP),
        catchup_window_ms=_ms("catchup_window", fields.get("catchup_window", 24 * 3600.0)),
        overlap=_choice(fields, "overlap", OVERLAP_POLICIES, DEFAULT_OVERLAP),
        template={key: fields[key] for key in TEMPLATE_FIELDS if key in fields},
    )
    if now_ms is None:
        return schedule
    first = schedule.first_after(now_ms)
    if first is None or first - now_ms > HORIZON_S * 1000:
        if end_at_ms is not None and _unbounded(schedule).first_after(now_ms) is not None:
            raise bad(f"end_at {show(fields['end_at'])} leaves no occurrence after now")
        # Name the field to change: a spec that fires is pushed past 50 years by start_at.
        fires = Schedule(id=schedule.id, spec=spec).first_after(now_ms)
        if start_at_ms is not None and fires is not None and fires - now_ms <= HORIZON_S * 1000:
            raise bad(
                f"start_at {show(fields['start_at'])} leaves no occurrence in the next 50 years"
            )
        name = "cron" if spec.cron is not None else "every"
        raise bad(f"{name} {show(fields[name])} has no occurrence in the next 50 years")
    return schedule


def check_preview(value: Any, tick_s: float) -> Schedule:
    """An unsaved spec for schedule_next: ``cron`` (and ``tz``) or ``every`` (and
    ``anchor``), no template; a schedule with no id, bounds or policies."""
    fields = known_fields("spec", value, SPEC_FIELDS)
    return Schedule(id="", spec=check_spec(fields, tick_s))


def _unbounded(schedule: Schedule) -> Schedule:
    return Schedule(id=schedule.id, spec=schedule.spec, start_at_ms=schedule.start_at_ms)


def apply_changes(current: dict[str, Any], changes: Any) -> dict[str, Any]:
    """The map an update makes: ``current`` (a schedule map) with ``changes``
    over it; a null removes an optional field. Switching kinds (cron to every)
    drops the other kind's fields."""
    changes = known_fields("changes", changes, CHANGE_FIELDS)
    merged = {key: value for key, value in current.items() if key in SCHEDULE_FIELDS}
    if "cron" in changes:
        merged.pop("every", None)
        merged.pop("anchor", None)
    if "every" in changes:
        merged.pop("cron", None)
        merged.pop("tz", None)
    merged.update(changes)
    return {key: value for key, value in merged.items() if value is not None}
