"""The occurrence and catch-up planner: pure functions of a schedule and ``now``.

Nothing here reads a clock or a store: the engine passes ``now_ms`` (its
wall clock, checked before firing) and the schedule's state, and journals
what comes back. So every server, every retry and every replay after a
crash computes the same occurrences, the same ids and the same jitter
(docs/schedules.md has the rules).
"""

from __future__ import annotations

import hashlib
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from delaywheel_client.partitions import occurrence_id

from delaywheel.checks import bad
from delaywheel.schedules.spec import HORIZON_S, Schedule, Spec

UTC = timezone.utc
CATCHUP_CAP = 100  # catchup=all fires at most this many (a burst bound, as K8s's 100)
MAX_NEXT = 1000  # schedule_next's n
MAX_BACKFILL = 1000
# Counting what a long downtime missed walks the occurrences; past this many
# (a minutely cron down for 70 days) the count saturates rather than stall a load.
MISSED_COUNT_LIMIT = 100_000


def occurrences(schedule: Schedule, after_ms: int, n: int) -> list[int]:
    """Up to ``n`` nominal instants strictly after ``after_ms``, in order."""
    found: list[int] = []
    at = after_ms
    while len(found) < n and (nxt := schedule.first_after(at)) is not None:
        found.append(nxt)
        at = nxt
    return found


def between(schedule: Schedule, low_ms: int, high_ms: int, limit: int) -> tuple[list[int], int]:
    """The newest ``limit`` occurrences in ``[low_ms, high_ms]`` in order, and how
    many older ones there were (saturating at MISSED_COUNT_LIMIT)."""
    if high_ms < low_ms:
        return [], 0
    spec = schedule.spec
    first = schedule.first_after(low_ms - 1)
    if first is None or first > high_ms:
        return [], 0
    if spec.every_ms is not None:
        # Arithmetic: no walk however long the gap.
        bound = high_ms if schedule.end_at_ms is None else min(high_ms, schedule.end_at_ms)
        end = spec.anchor_ms + (bound - spec.anchor_ms) // spec.every_ms * spec.every_ms
        total = (end - first) // spec.every_ms + 1
        kept = min(total, limit)
        start = first + (total - kept) * spec.every_ms
        return [start + k * spec.every_ms for k in range(kept)], total - kept
    newest: deque[int] = deque(maxlen=limit)
    older = 0
    at: int | None = first
    while at is not None and at <= high_ms:
        if len(newest) == limit:
            older += 1
            if older + limit >= MISSED_COUNT_LIMIT:
                # Saturated: jump to the tail (cron instants a minute or more apart
                # at this density; the newest `limit` are found backwards).
                return _tail(schedule, at, high_ms, limit), older
        newest.append(at)
        at = schedule.first_after(at)
    return list(newest), older


def _tail(schedule: Schedule, low_ms: int, high_ms: int, limit: int) -> list[int]:
    """The newest ``limit`` occurrences in ``(low_ms, high_ms]``, searching back
    from ``high_ms`` a widening window at a time."""
    span_ms = 3600_000
    while True:
        start = max(low_ms, high_ms - span_ms)
        found = []
        at = schedule.first_after(start)
        while at is not None and at <= high_ms:
            found.append(at)
            at = schedule.first_after(at)
        if len(found) >= limit or start == low_ms:
            return found[-limit:]
        span_ms *= 4


@dataclass(frozen=True)
class Catchup:
    """What to do with the occurrences from ``pending`` through ``now``."""

    fire: list[int]  # nominal instants to fire now, oldest first
    missed: int  # dropped, counted in the schedule's missed
    next_ms: int | None  # the next occurrence after now (None: the schedule has ended)


def plan_catchup(schedule: Schedule, pending_ms: int, now_ms: int, on_time_ms: int = 0) -> Catchup:
    """After downtime or a forward clock jump: the due occurrences are those in
    ``[pending_ms, now_ms]``; the policy says which fire and which are missed.
    Only occurrences within ``catchup_window`` of now may fire (``skip`` fires none).

    The on-time case is not downtime: the pending occurrence alone is due, at
    most ``on_time_ms`` after its firing time (nominal plus jitter). It fires
    under every policy, ``skip`` too (which would otherwise drop every one)."""
    next_ms = schedule.first_after(now_ms)
    window_low = now_ms - schedule.catchup_window_ms
    if schedule.catchup == "skip":
        _, count = between(schedule, pending_ms, now_ms, 0)
        late_ms = now_ms - pending_ms - jitter_ms(schedule, pending_ms)
        if count == 1 and late_ms <= on_time_ms:
            return Catchup([pending_ms], 0, next_ms)
        return Catchup([], count, next_ms)
    limit = 1 if schedule.catchup == "latest" else CATCHUP_CAP
    due, older = between(schedule, pending_ms, now_ms, limit)
    fire = [nominal for nominal in due if nominal >= window_low]
    return Catchup(fire, older + len(due) - len(fire), next_ms)


def after_edit(schedule: Schedule, now_ms: int, last_fired_ms: int | None) -> int | None:
    """The pending occurrence after an update: the first after max(now, last_fired),
    so an edit never fires retroactively nor repeats a fired occurrence."""
    floor = now_ms if last_fired_ms is None else max(now_ms, last_fired_ms)
    return schedule.first_after(floor)


def after_resume(schedule: Schedule, now_ms: int) -> int | None:
    """Resume starts from now: what passed while paused is not fired (backfill is explicit)."""
    return schedule.first_after(now_ms)


def backfill(schedule: Schedule, start_ms: int, end_ms: int, now_ms: int) -> list[int]:
    """The occurrences in ``[start_ms, min(end_ms, now_ms)]``, to fire now under their
    own ids (an id already fired is the engine's no-op). Refused past MAX_BACKFILL."""
    if end_ms < start_ms:
        raise bad(f"backfill end {end_ms / 1000:g} is before start {start_ms / 1000:g}")
    found, older = between(schedule, start_ms, min(end_ms, now_ms), MAX_BACKFILL)
    if older:
        raise bad(
            f"backfill covers {older + len(found)} occurrences, more than {MAX_BACKFILL}:"
            " split the range"
        )
    return found


def jitter_ms(schedule: Schedule, nominal_ms: int) -> int:
    """The firing delay of an occurrence: ``hash(id, occurrence)`` mod the smaller
    of ``jitter`` and the gap to the next occurrence, so it is the same on every
    server and never reaches the next occurrence."""
    if schedule.jitter_ms <= 0:
        return 0
    following = schedule.spec.next_after_ms(nominal_ms)
    bound = (
        schedule.jitter_ms if following is None else min(schedule.jitter_ms, following - nominal_ms)
    )
    if bound <= 1:
        return 0
    digest = hashlib.blake2b(occurrence_id(schedule.id, nominal_ms).encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big") % bound


def local_iso(instant_ms: int, spec: Spec) -> str:
    """ISO 8601 with the offset in force, in the schedule's zone (UTC for every)."""
    zone: Any = UTC if spec.cron is None or spec.cron.zone is None else spec.cron.zone
    moment = datetime.fromtimestamp(instant_ms / 1000, zone)
    return moment.isoformat(timespec="milliseconds" if instant_ms % 1000 else "seconds")


def describe(spec: Spec) -> str:
    """Plain English for schedule_next: cronsim's explanation and the zone, or the interval."""
    if spec.cron is not None:
        return f"{spec.cron.explain()} ({spec.tz}; DST by Debian cron's rule)"
    assert spec.every_ms is not None
    anchor = datetime.fromtimestamp(spec.anchor_ms / 1000, UTC).isoformat()
    return f"Every {_duration(spec.every_ms)}, counted from {anchor} (elapsed time; no DST)"


def _duration(value_ms: int) -> str:
    for unit_ms, name in ((86_400_000, "day"), (3_600_000, "hour"), (60_000, "minute")):
        if value_ms % unit_ms == 0:
            count = value_ms // unit_ms
            return f"{name}" if count == 1 else f"{count} {name}s"
    if value_ms % 1000 == 0:
        return "second" if value_ms == 1000 else f"{value_ms // 1000} seconds"
    return f"{value_ms / 1000:g} seconds"


def render_next(schedule: Schedule, now_ms: int, n: int) -> dict[str, Any]:
    """schedule_next's reply: the next ``n`` times from now and the description. Only
    those in the next 50 years, as a schedule's own (``check_schedule``): an ``every``
    of years would otherwise run past what a date can hold (year 9999)."""
    if type(n) is not int or not 1 <= n <= MAX_NEXT:
        raise bad(f"n must be an int from 1 to {MAX_NEXT}, got {n!r}")
    horizon_ms = now_ms + HORIZON_S * 1000
    times = [
        {
            "utc": instant / 1000 if instant % 1000 else instant // 1000,
            "local": local_iso(instant, schedule.spec),
        }
        for instant in occurrences(schedule, now_ms, n)
        if instant <= horizon_ms
    ]
    return {"times": times, "description": describe(schedule.spec)}
