"""The engine's side of recurring schedules (docs/schedules.md).

``ScheduleTable`` holds every schedule this node serves (all of them on a
single-node store; a shared keyspace's served partitions), answers the
``schedule_*`` methods and fires them. A schedule is a durable record in the
store beside the tasks, under the key ``s:{id}:00`` (``record_key``): the
partition rule hashes ``id`` for that key as for every occurrence
``s:{id}:{seconds}``, so the schedule and its occurrences share a partition,
and no occurrence id is ever ``00`` (``occurrence_id`` writes ``0``).

The pending occurrence is the record's ``next``: durable before it is due.
When it comes due (the wall clock checked first, ``plan_fire``), one
journal batch, hence one store write in one partition (fenced on a shared
keyspace), puts each occurrence that fires as an ordinary task (if absent:
the id is the occurrence's) and the schedule's new state (``next``, counts,
``last_fired``). A crash before the write leaves the old ``next``, which a
restart fires the same way under the same ids; after it, the new one. So no
occurrence is lost or doubled, however often the server restarts, and a
stale owner's write is refused by the fenced flush.

Replies to the schedule methods wait for that batch to be durable, as
every mutating method's do (net/connection.py).
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Any

from delaywheel_client.partitions import (
    is_record_key,
    occurrence_id,
    parse_occurrence,
    record_key,
)

from delaywheel.checks import bad, known_fields, number, show
from delaywheel.errors import RequestError
from delaywheel.schedules.occurrence import Occurrence
from delaywheel.schedules.planner import after_edit, after_resume, backfill, jitter_ms, render_next
from delaywheel.schedules.spec import Schedule, apply_changes, check_preview, check_schedule
from delaywheel.schedules.state import (
    COUNT_NAMES,
    ScheduleState,
    first_fire_ms,
    plan_fire,
    read_record,
    to_record,
)
from delaywheel.tallies import SCHEDULE_LATENESS_BOUNDS_S, Histogram

log = logging.getLogger("delaywheel.schedules")

DEFAULT_NEXT_N = 5
DEFAULT_LIST_LIMIT = 100
MAX_LIST_LIMIT = 1000
LIST_FIELDS = frozenset({"topic", "paused", "limit", "cursor"})
# How late the pending occurrence may fire and still be on time rather than a
# catch-up (plan_catchup): what `skip` drops is downtime, not a busy loop or a
# burst of schedules due at one instant that takes seconds to put.
ON_TIME_MS = 10_000
# Why an occurrence is skipped (state.plan_fire): the previous one still in flight.
SKIP_REASONS = ("overlap",)


@dataclass
class Hooks:
    """What the table needs of the engine: the task side, without importing it."""

    # Check a template as ``add`` would (raises bad_request naming the field).
    check_template: Callable[[dict[str, Any], str, float], None]
    # Put an occurrence's task if no task has its id; True when put.
    put_occurrence: Callable[[str, dict[str, Any], float, float], bool]
    # Whether an occurrence's task is still in flight (not acked, dead or deleted).
    in_flight: Callable[[str], bool]
    # Raise moved/tryagain unless this node serves the schedule id's partition.
    check_served: Callable[[str], None]


class ScheduleTable:
    def __init__(self, journal: Any, hooks: Hooks, tick_s: float) -> None:
        self._journal = journal
        self._hooks = hooks
        self.tick_s = tick_s
        self.states: dict[str, ScheduleState] = {}
        # (fire at, id) of each armed schedule; an entry whose time is not
        # ``_armed[id]`` any more is stale and skipped when it comes up.
        self._timers: list[tuple[int, str]] = []
        self._armed: dict[str, int] = {}
        # The ids of the paused ones, kept with ``states`` (``_keep``, ``_forget``)
        # so that stats and metrics count them without a walk over every schedule.
        self._paused: set[str] = set()
        # buffer_one: the occurrence each schedule holds now (its pending one,
        # due, waiting for the previous to end); in memory only, so an edit
        # that moves ``next`` or a restart ends the hold.
        self._holding: dict[str, int] = {}
        # For metrics: occurrences fired, skipped by reason, missed, since start,
        # and how late each fired occurrence was put (docs/metrics.md).
        self.fired = 0
        self.skipped: dict[str, int] = dict.fromkeys(SKIP_REASONS, 0)
        self.missed = 0
        self.lateness = Histogram(SCHEDULE_LATENESS_BOUNDS_S)

    # -- requests --------------------------------------------------------------

    def add(self, value: Any, now_s: float) -> dict[str, Any]:
        now_ms = round(now_s * 1000)
        schedule = check_schedule(value, self.tick_s, now_ms)
        self._hooks.check_served(schedule.id)
        self._check_template(schedule, now_s)
        if schedule.id in self.states:
            raise RequestError("exists", f"a schedule with id {schedule.id!r} already exists")
        state = ScheduleState(schedule=schedule, next_ms=schedule.first_after(now_ms))
        self._write(state, None)
        return state.to_map()

    def update(
        self, schedule_id: Any, changes: Any, expected_version: Any, now_s: float
    ) -> dict[str, Any]:
        state = self._find(schedule_id)
        if expected_version is not None and (
            type(expected_version) is not int or expected_version < 1
        ):
            raise bad(f"expected_version must be an int >= 1, got {show(expected_version)}")
        if expected_version is not None and expected_version != state.version:
            raise RequestError(
                "conflict",
                f"schedule {state.schedule.id!r} is at version {state.version},"
                f" not expected_version {expected_version}",
                {"version": state.version},
            )
        now_ms = round(now_s * 1000)
        merged = apply_changes(state.schedule.to_map(), changes)
        schedule = check_schedule(merged, self.tick_s, now_ms)
        self._check_template(schedule, now_s)
        next_ms = None if state.paused else after_edit(schedule, now_ms, state.last_fired_ms)
        new = replace(state, schedule=schedule, version=state.version + 1, next_ms=next_ms)
        self._write(new, state)
        return new.to_map()

    def pause(self, schedule_id: Any, note: Any) -> dict[str, Any]:
        state = self._find(schedule_id)
        if note is not None and type(note) is not str:
            raise bad(f"note must be a str, got {show(note)}")
        new = replace(state, paused=True, note=note, next_ms=None, version=state.version + 1)
        self._write(new, state)
        return new.to_map()

    def resume(self, schedule_id: Any, now_s: float) -> dict[str, Any]:
        state = self._find(schedule_id)
        if not state.paused:
            return state.to_map()
        next_ms = after_resume(state.schedule, round(now_s * 1000))
        if self._ended(state):
            next_ms = None
        new = replace(state, paused=False, note=None, next_ms=next_ms, version=state.version + 1)
        self._write(new, state)
        return new.to_map()

    def delete(self, schedule_id: Any) -> bool:
        checked = self._checked_id(schedule_id)
        state = self.states.get(checked)
        if state is None:
            return False
        self._remove(state)
        return True

    def get(self, schedule_id: Any) -> dict[str, Any] | None:
        state = self.states.get(self._checked_id(schedule_id))
        return None if state is None else state.to_map()

    def page(self, query: Any) -> dict[str, Any]:
        fields = known_fields("query", {} if query is None else query, LIST_FIELDS)
        topic, paused = fields.get("topic"), fields.get("paused")
        if topic is not None and type(topic) is not str:
            raise bad(f"topic must be a str, got {show(topic)}")
        if paused is not None and type(paused) is not bool:
            raise bad(f"paused must be true or false, got {show(paused)}")
        limit = fields.get("limit", DEFAULT_LIST_LIMIT)
        if type(limit) is not int or not 1 <= limit <= MAX_LIST_LIMIT:
            raise bad(f"limit must be an int from 1 to {MAX_LIST_LIMIT}, got {show(limit)}")
        cursor = fields.get("cursor")
        if cursor is not None and type(cursor) is not str:
            raise bad(
                f"cursor must be a value returned as next by schedule_list, got {show(cursor)}"
            )
        found: list[ScheduleState] = []
        # In id order, so a cursor (the last id returned) pages through once each.
        for schedule_id in sorted(self.states):
            if cursor is not None and schedule_id <= cursor:
                continue
            state = self.states[schedule_id]
            if topic is not None and state.schedule.template.get("topic") != topic:
                continue
            if paused is not None and state.paused != paused:
                continue
            if len(found) == limit:
                return {"schedules": [s.to_map() for s in found], "next": found[-1].schedule.id}
            found.append(state)
        return {"schedules": [s.to_map() for s in found], "next": None}

    def next(self, target: Any, n: Any, now_s: float) -> dict[str, Any]:
        """The next ``n`` occurrences from now of ``target``: a saved schedule's
        id, or a spec map (``cron`` and ``tz``, or ``every`` and ``anchor``)."""
        count = DEFAULT_NEXT_N if n is None else n
        now_ms = round(now_s * 1000)
        if type(target) is str:
            state = self._find(target)
            # From its pending occurrence: a paused or ended one has none.
            after = now_ms if state.next_ms is None else min(now_ms, state.next_ms - 1)
            reply = render_next(state.schedule, after, count)
            if state.next_ms is None:
                reply["times"] = []
            return reply
        if type(target) is not dict:
            raise bad(f"schedule_next takes a schedule id or a spec map, got {show(target)}")
        return render_next(check_preview(target, self.tick_s), now_ms, count)

    def trigger(self, schedule_id: Any, now_s: float) -> dict[str, Any]:
        """One extra occurrence now, under the id of now (not counted, nor
        against max_runs: the schedule's own occurrences go on as planned)."""
        state = self._find(schedule_id)
        now_ms = round(now_s * 1000)
        task_id = occurrence_id(state.schedule.id, now_ms)
        self._hooks.put_occurrence(task_id, state.schedule.template, now_s, now_s)
        return {"id": task_id}

    def backfill(self, schedule_id: Any, start: Any, end: Any, now_s: float) -> dict[str, Any]:
        state = self._find(schedule_id)
        start_ms = round(number("start", start) * 1000)
        end_ms = round(number("end", end) * 1000)
        nominals = backfill(state.schedule, start_ms, end_ms, round(now_s * 1000))
        put = []
        for nominal in nominals:
            task_id = occurrence_id(state.schedule.id, nominal)
            if self._hooks.put_occurrence(task_id, state.schedule.template, now_s, now_s):
                put.append(task_id)
        return {"ids": put, "existing": len(nominals) - len(put)}

    # -- time --------------------------------------------------------------------

    def next_fire_s(self) -> float | None:
        timers = self._timers
        while timers and self._armed.get(timers[0][1]) != timers[0][0]:
            heapq.heappop(timers)
        return timers[0][0] / 1000 if timers else None

    def advance(self, now_s: float, budget: int = 1000) -> int:
        """Fire the schedules due by the wall clock ``now_s``; how many it looked at."""
        now_ms = round(now_s * 1000)
        timers, armed = self._timers, self._armed
        looked = 0
        while timers and timers[0][0] <= now_ms and looked < budget:
            at_ms, schedule_id = heapq.heappop(timers)
            if armed.get(schedule_id) != at_ms:
                continue
            del armed[schedule_id]
            looked += 1
            state = self.states.get(schedule_id)
            if state is not None:
                self._fire(state, now_ms)
        return looked

    def _fire(self, state: ScheduleState, now_ms: int) -> None:
        previous = state.last_fired_ms
        in_flight = previous is not None and self._hooks.in_flight(
            occurrence_id(state.schedule.id, previous)
        )
        schedule_id = state.schedule.id
        holding = self._holding.pop(schedule_id, None) == state.next_ms
        step = plan_fire(state, now_ms, in_flight, ON_TIME_MS, holding)
        if step is None:  # early by the wall clock (stepped back): wait for it
            if holding and state.next_ms is not None:
                self._holding[schedule_id] = state.next_ms
            self._arm(state)
            return
        now_s = now_ms / 1000
        for occurrence in step.fire:
            fire_at_ms = occurrence.fire_at_ms
            assert fire_at_ms is not None  # plan_fire's occurrences know it
            self._hooks.put_occurrence(
                occurrence.id, state.schedule.template, fire_at_ms / 1000, now_s
            )
            # Late from its own firing time (nominal plus jitter): a tick's wait,
            # or the downtime a catch-up one stood through.
            due_ms = occurrence.nominal_ms + jitter_ms(state.schedule, occurrence.nominal_ms)
            self.lateness.observe(max(0, now_ms - due_ms) / 1000)
        self.fired += len(step.fire)
        for reason, n in step.skipped.items():
            self.skipped[reason] = self.skipped.get(reason, 0) + n
        self.missed += step.state.counts["missed"] - state.counts["missed"]
        if step.state != state:
            self._write(step.state, state)
        if step.held:
            # buffer_one: look again each tick until the previous one ends.
            assert step.state.next_ms is not None
            self._holding[schedule_id] = step.state.next_ms
            self._arm(step.state, now_ms + max(1, round(self.tick_s * 1000)))
        else:
            self._arm(step.state)

    def _arm(self, state: ScheduleState, at_ms: int | None = None) -> None:
        schedule_id = state.schedule.id
        if at_ms is None:
            at_ms = None if state.paused else first_fire_ms(state)
        if at_ms is None:
            self._armed.pop(schedule_id, None)
            return
        self._armed[schedule_id] = at_ms
        heapq.heappush(self._timers, (at_ms, schedule_id))

    # -- the store -----------------------------------------------------------------

    def _keep(self, state: ScheduleState) -> None:
        schedule_id = state.schedule.id
        self.states[schedule_id] = state
        if state.paused:
            self._paused.add(schedule_id)
        else:
            self._paused.discard(schedule_id)

    def _forget(self, schedule_id: str) -> None:
        self.states.pop(schedule_id, None)
        self._paused.discard(schedule_id)
        self._holding.pop(schedule_id, None)
        self._armed.pop(schedule_id, None)

    def _write(self, state: ScheduleState, before: ScheduleState | None) -> None:
        schedule_id = state.schedule.id
        self._keep(state)
        self._arm(state)
        self._journal.record_other(
            record_key(schedule_id), to_record(state), lambda: self._undo(schedule_id, before)
        )

    def _remove(self, state: ScheduleState) -> None:
        schedule_id = state.schedule.id
        self._forget(schedule_id)
        self._journal.record_other(
            record_key(schedule_id), None, lambda: self._undo(schedule_id, state)
        )

    def _undo(self, schedule_id: str, before: ScheduleState | None) -> None:
        """A write failed: put back the state it replaced (None: there was none)."""
        if before is None:
            self._forget(schedule_id)
        else:
            self._keep(before)
            self._arm(before)

    def load_record(self, key: str, record: bytes) -> None:
        try:
            state = read_record(record)
        except ValueError as exc:
            log.error("skipping corrupt schedule record %r: %s", key, exc)
            return
        self._keep(state)
        self._arm(state)  # one overdue fires (catch-up) at the first advance

    def drop(self, leaving: Callable[[str], bool]) -> int:
        """Forget the schedules of a partition handed back or lost (no write)."""
        gone = [schedule_id for schedule_id in self.states if leaving(record_key(schedule_id))]
        for schedule_id in gone:
            self._forget(schedule_id)
        return len(gone)

    async def split(
        self, batches: AsyncIterator[list[tuple[str, bytes]]]
    ) -> AsyncIterator[list[tuple[str, bytes]]]:
        """The store's records with the schedules' taken out (and loaded here)."""
        async for batch in batches:
            if any(is_record_key(key) for key, _ in batch):
                tasks = []
                for key, record in batch:
                    if is_record_key(key):
                        self.load_record(key, record)
                    else:
                        tasks.append((key, record))
                batch = tasks
            yield batch

    # -- reading -------------------------------------------------------------------

    def occurrence(self, task_id: str) -> Occurrence | None:
        """What ``task_id`` is as an occurrence, with its local time in its
        schedule's zone (UTC for one whose schedule this node does not hold:
        deleted); None when it is no occurrence's id."""
        parsed = parse_occurrence(task_id)
        if parsed is None:
            return None
        state = self.states.get(parsed[0])
        return Occurrence(*parsed, spec=None if state is None else state.schedule.spec)

    def stats(self) -> dict[str, int]:
        return {"count": len(self.states), "paused": len(self._paused)}

    def counts(self) -> dict[str, int]:
        """The schedules' stored counts, summed (for metrics)."""
        totals = dict.fromkeys(COUNT_NAMES, 0)
        for state in self.states.values():
            for name in COUNT_NAMES:
                totals[name] += state.counts[name]
        return totals

    def _checked_id(self, schedule_id: Any) -> str:
        if type(schedule_id) is not str or not schedule_id:
            raise bad(f"id must be a schedule id (a non-empty str), got {show(schedule_id)}")
        self._hooks.check_served(schedule_id)
        return schedule_id

    def _find(self, schedule_id: Any) -> ScheduleState:
        state = self.states.get(self._checked_id(schedule_id))
        if state is None:
            raise RequestError("not_found", f"no schedule {show(schedule_id)}")
        return state

    def _check_template(self, schedule: Schedule, now_s: float) -> None:
        if "topic" not in schedule.template:
            raise bad("schedule has no topic (the template's topic: what add takes)")
        self._hooks.check_template(schedule.template, occurrence_id(schedule.id, 0), now_s)

    @staticmethod
    def _ended(state: ScheduleState) -> bool:
        runs = state.schedule.max_runs
        return runs is not None and state.counts["fired"] >= runs
