"""What a delivery and a task map say of a schedule's occurrence (docs/delivery.md).

An occurrence's id is ``s:{schedule_id}:{nominal UTC epoch seconds}``
(``planner.occurrence_id``), so the id alone gives the schedule and the
nominal time; the local time needs the schedule's zone, which the engine
looks up in the schedule's record (UTC once the schedule is deleted). Any
task whose id has that form counts as an occurrence, as it does for the
partition rule (client/delaywheel_client/partitions.py): ``s:`` ids are the
schedules' namespace.

Callers look only at ids starting with ``s:``, so a plain task pays one
``startswith`` and nothing more.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from delaywheel.schedules.planner import local_iso
from delaywheel.schedules.spec import Spec

# As partitions.py's: the schedule id runs to the last ":", then the seconds.
_OCCURRENCE = re.compile(r"s:(.*):([0-9]{1,12})(?:\.([0-9]{1,3}))?", re.DOTALL)
# 9998-12-31T23:59:59Z: near year 9999 a datetime in a zone east of UTC
# overflows, so an id naming a later time (a caller's own "s:x:99999999999")
# is no occurrence.
_MAX_NOMINAL_MS = 253_370_764_799_999
_UTC = Spec()  # a spec with no zone: local_iso renders UTC


@dataclass(frozen=True, slots=True)
class Occurrence:
    schedule_id: str
    nominal_ms: int
    nominal_utc: str  # ISO 8601 ending in Z: 2026-12-04T01:30:00Z
    nominal_local: str  # ISO 8601 in the schedule's zone, with its offset

    @property
    def nominal_s(self) -> float | int:
        """Unix seconds, an int when whole (as schedule_next's ``utc``)."""
        ms = self.nominal_ms
        return ms // 1000 if ms % 1000 == 0 else ms / 1000

    def late_by_s(self, now_s: float) -> float:
        """How long after its nominal time ``now_s`` is, in seconds (never below 0)."""
        return max(0.0, round(now_s - self.nominal_ms / 1000, 3))


def parse(task_id: str) -> tuple[str, int] | None:
    """``(schedule_id, nominal_ms)`` of an occurrence's id, or None for any other id."""
    found = _OCCURRENCE.fullmatch(task_id)
    if found is None or not found.group(1):
        return None
    seconds, fraction = found.group(2), found.group(3) or ""
    nominal_ms = int(seconds) * 1000 + int(fraction.ljust(3, "0") or 0)
    if nominal_ms > _MAX_NOMINAL_MS:
        return None
    return found.group(1), nominal_ms


def occurrence(task_id: str, spec: Spec | None) -> Occurrence | None:
    """The occurrence ``task_id`` names, its local time in ``spec``'s zone
    (None: the schedule is gone, so UTC); None when it is no occurrence."""
    parsed = parse(task_id)
    return None if parsed is None else make(*parsed, spec)


def make(schedule_id: str, nominal_ms: int, spec: Spec | None) -> Occurrence:
    utc = local_iso(nominal_ms, _UTC)
    return Occurrence(
        schedule_id,
        nominal_ms,
        utc.removesuffix("+00:00") + "Z",
        utc if spec is None else local_iso(nominal_ms, spec),
    )
