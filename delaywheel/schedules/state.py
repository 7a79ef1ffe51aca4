"""A schedule's state, its store record, and the fire step as a pure decision.

``ScheduleState`` is what the store keeps for a schedule: the checked map
(``Schedule``) and ``version``, ``paused`` and ``note``, ``next`` (the
pending occurrence's nominal time), ``last_fired`` and the counts.
``to_record``/``read_record`` are its record (MessagePack, versioned like
the task record), and ``to_map`` is the map the methods return.

``plan_fire`` is the decision the engine journals when the pending
occurrence comes due (or at load, after downtime): which occurrences fire,
which are counted skipped or missed, and the new ``next``. The engine turns
it into one write (mark k fired, put k+1 if absent, compare-and-set
``(version, next)``); because the decision is a function of the state and
``now`` alone, a retry, a replay or a second server decides the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import msgpack  # type: ignore[import-untyped, unused-ignore]

from delaywheel.schedules.occurrence import Occurrence
from delaywheel.schedules.planner import Catchup, jitter_ms, plan_catchup
from delaywheel.schedules.spec import Schedule, check_schedule

RECORD_KIND = "schedule"
RECORD_VERSION = 1
COUNT_NAMES = ("fired", "skipped", "missed")


@dataclass(frozen=True)
class ScheduleState:
    schedule: Schedule
    version: int = 1
    paused: bool = False
    note: str | None = None
    next_ms: int | None = None  # None: paused, or ended (end_at, max_runs)
    last_fired_ms: int | None = None
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNT_NAMES, 0))

    def to_map(self) -> dict[str, Any]:
        """The schedule map as the methods return it: the schedule and its state."""
        out = self.schedule.to_map()
        out.update(
            version=self.version,
            paused=self.paused,
            note=self.note,
            next=None if self.next_ms is None else self.next_ms / 1000,
            last_fired=None if self.last_fired_ms is None else self.last_fired_ms / 1000,
            counts=dict(self.counts),
        )
        return out


def to_record(state: ScheduleState) -> bytes:
    """The store record: the schedule map as given back (rechecked on load, so a
    record is never trusted past the checks) and the state."""
    body = state.schedule.to_map()
    record = [
        RECORD_KIND,
        RECORD_VERSION,
        {key: value for key, value in body.items() if value is not None},
        state.version,
        state.paused,
        state.note,
        state.next_ms,
        state.last_fired_ms,
        [state.counts[name] for name in COUNT_NAMES],
    ]
    packed: bytes = msgpack.packb(record, use_bin_type=True)
    return packed


def read_record(record: bytes) -> ScheduleState:
    """A record back. ValueError names what is wrong with one this code did not write."""
    try:
        fields = msgpack.unpackb(record, raw=False)
    except Exception as error:
        raise ValueError(f"schedule record is not MessagePack: {error}") from None
    if type(fields) is not list or len(fields) != 9 or fields[0] != RECORD_KIND:
        raise ValueError("not a schedule record")
    _, version, body, sversion, paused, note, next_ms, last_fired_ms, counts = fields
    if version != RECORD_VERSION:
        raise ValueError(f"schedule record version {version!r}: this server reads 1")
    try:
        # Without the tick and 50-year rules, which are for adding: a schedule
        # stays loadable after the tick is raised or after it has ended.
        schedule = check_schedule(body, 0.0, None)
    except Exception as error:
        raise ValueError(f"schedule record {body.get('id')!r}: {error}") from None
    return ScheduleState(
        schedule=schedule,
        version=sversion,
        paused=bool(paused),
        note=note,
        next_ms=next_ms,
        last_fired_ms=last_fired_ms,
        counts=dict(zip(COUNT_NAMES, counts, strict=True)),
    )


@dataclass(frozen=True)
class FireStep:
    """One journal write's worth: what fires, and the state to CAS in."""

    fire: list[Occurrence]
    state: ScheduleState  # the new state; ``expected`` is what it replaces
    expected: tuple[int, int | None]  # (version, next) the write compares
    held: bool = False  # buffer_one: the pending occurrence waits for the previous one
    skipped: dict[str, int] = field(default_factory=dict)  # by reason


def first_fire_ms(state: ScheduleState) -> int | None:
    """When the pending occurrence's task is due: its nominal time plus jitter."""
    if state.next_ms is None:
        return None
    return state.next_ms + jitter_ms(state.schedule, state.next_ms)


def plan_fire(
    state: ScheduleState,
    now_ms: int,
    previous_in_flight: bool,
    on_time_ms: int = 0,
    holding: bool = False,
) -> FireStep | None:
    """The pending occurrence (and any it stood for during downtime) at ``now_ms``.

    None when nothing is due: paused, ended, or the wall clock is before the
    pending occurrence's firing time (a clock stepped back never fires early;
    the engine re-arms). Otherwise the catch-up policy picks what fires of
    everything due, the overlap policy decides what the previous occurrence
    still in flight allows, and ``max_runs`` ends the schedule. The pending
    occurrence alone due, at most ``on_time_ms`` late, is on time, not a
    catch-up (``plan_catchup``). ``holding``: the pending occurrence is the
    one ``buffer_one`` has held since it came due while up (the engine
    knows; a restart forgets it), so waiting made it late, not downtime: it
    stays held (or is skipped for a newer one), never counted missed.
    """
    due_ms = first_fire_ms(state)
    if state.paused or due_ms is None or now_ms < due_ms:
        return None
    schedule = state.schedule
    pending = state.next_ms
    assert pending is not None
    if holding:
        following = schedule.first_after(pending)
        if following is None or following > now_ms:
            newer = Catchup([], 0, schedule.first_after(now_ms))
        else:
            newer = plan_catchup(schedule, following, now_ms, on_time_ms)
        catchup = Catchup([pending, *newer.fire], newer.missed, newer.next_ms)
    else:
        catchup = plan_catchup(schedule, pending, now_ms, on_time_ms)
    fire = list(catchup.fire)
    counts = dict(state.counts)
    counts["missed"] += catchup.missed
    skipped: dict[str, int] = {}
    held = False
    next_ms = catchup.next_ms
    if previous_in_flight and fire:
        if schedule.overlap == "skip":
            skipped["overlap"] = len(fire)
            fire = []
        elif schedule.overlap == "buffer_one":
            # One waits (the newest); older ones in the same step are skipped.
            if len(fire) > 1:
                skipped["overlap"] = len(fire) - 1
            held, next_ms, fire = True, fire[-1], []
    if schedule.max_runs is not None:
        room = max(0, schedule.max_runs - counts["fired"])
        fire = fire[:room]
        if counts["fired"] + len(fire) >= schedule.max_runs:
            next_ms = None
    counts["fired"] += len(fire)
    counts["skipped"] += sum(skipped.values())
    occurrences = [
        Occurrence(
            schedule.id,
            nominal,
            # On time: its own jittered time. Late (a catch-up): now.
            max(now_ms, nominal + jitter_ms(schedule, nominal)) if nominal == pending else now_ms,
            schedule.spec,
        )
        for nominal in fire
    ]
    new_state = replace(
        state,
        next_ms=next_ms,
        last_fired_ms=fire[-1] if fire else state.last_fired_ms,
        counts=counts,
    )
    return FireStep(occurrences, new_state, (state.version, state.next_ms), held, skipped)
