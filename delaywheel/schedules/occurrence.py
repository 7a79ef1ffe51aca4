"""A schedule's occurrence, and what a delivery and a task map say of it (docs/delivery.md).

An occurrence's id is ``s:{schedule_id}:{nominal UTC epoch seconds}``; the
format, its parser and the partition rule over it are written once, in
delaywheel_client/partitions.py, for the server and the clients. The id
alone gives the schedule and the nominal time; the local time needs the
schedule's zone, which the engine looks up in the schedule's record (UTC
once the schedule is deleted). Any task whose id has that form counts as an
occurrence: ``s:`` ids are the schedules' namespace.

Callers look only at ids starting with ``s:``, so a plain task pays one
``startswith`` and nothing more.
"""

from __future__ import annotations

from dataclasses import dataclass

from delaywheel_client.partitions import occurrence_id, parse_occurrence

from delaywheel.schedules.planner import local_iso
from delaywheel.schedules.spec import Spec

_UTC = Spec()  # a spec with no zone: local_iso renders UTC


@dataclass(frozen=True, slots=True)
class Occurrence:
    """One occurrence of a schedule: the schedule's id and the nominal time.

    Made two ways. Planned to fire (``state.plan_fire``), it knows when its
    task is due, ``fire_at_ms``. Read back from a task's id (``occurrence``),
    it knows the schedule's ``spec`` (None: the schedule is gone), whose zone
    ``nominal_local`` is in, and not when its task was due (the task does).
    """

    schedule_id: str
    nominal_ms: int
    fire_at_ms: int | None = None  # nominal plus its jitter; a catch-up fires now
    spec: Spec | None = None

    @property
    def id(self) -> str:
        """Its task's id."""
        return occurrence_id(self.schedule_id, self.nominal_ms)

    @property
    def nominal_utc(self) -> str:
        """ISO 8601 ending in Z: 2026-12-04T01:30:00Z."""
        return local_iso(self.nominal_ms, _UTC).removesuffix("+00:00") + "Z"

    @property
    def nominal_local(self) -> str:
        """ISO 8601 in the schedule's zone, with its offset (UTC without a spec)."""
        return local_iso(self.nominal_ms, _UTC if self.spec is None else self.spec)

    @property
    def nominal_s(self) -> float | int:
        """Unix seconds, an int when whole (as schedule_next's ``utc``)."""
        ms = self.nominal_ms
        return ms // 1000 if ms % 1000 == 0 else ms / 1000

    def late_by_s(self, now_s: float) -> float:
        """How long after its nominal time ``now_s`` is, in seconds (never below 0)."""
        return max(0.0, round(now_s - self.nominal_ms / 1000, 3))


def occurrence(task_id: str, spec: Spec | None) -> Occurrence | None:
    """The occurrence ``task_id`` names, its local time in ``spec``'s zone
    (None: the schedule is gone, so UTC); None when it is no occurrence."""
    parsed = parse_occurrence(task_id)
    return None if parsed is None else Occurrence(*parsed, spec=spec)
