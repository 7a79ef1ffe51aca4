"""Cron expressions: the one module that knows cronsim.

cronsim parses the fields and walks *wall-clock* (naive) times; mapping a
wall-clock time to real instants in a zone is done here, because cronsim
gets it wrong in two cases we measured: a six-field (seconds) expression
gets no DST rule at all (a fixed 02:30:00 is skipped in the spring gap and
fires twice in the autumn fold), and a zone whose shift is half an hour
(Australia/Lord_Howe) loses real instants when cronsim steps hours on
aware times (``0 */2 * * *`` skips 02:00 on the fold day). Keeping
cronsim to naive times keeps it to the calendar, where it is right, and
keeps a swap of library to this file.

The DST rule is Debian cron's (docs/schedules.md):

- a *fixed-time* expression (neither the minute nor the hour field starts
  with ``*``) fires once per wall-clock match: a time in the spring gap at
  the first instant after the gap, a time in the autumn fold on its first
  pass only;
- any other expression (hourly or more often) fires at every real instant
  whose wall-clock time matches, so twice through a fold and never in a
  gap.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

from cronsim import CronSim, CronSimError

UTC = timezone.utc
# No zone's offset changes by more than this at once (the largest shift in
# tzdata is 2 h; Troll's): how far back in wall time a search must start.
_MAX_SHIFT = timedelta(hours=3)
_MAX_SHIFT_S = 3 * 3600
# cronsim gives up after this many years without a match; so do we.
HORIZON_YEARS = 50
_FIELD_NAMES = ("second", "minute", "hour", "day-of-month", "month", "day-of-week")


class CronError(ValueError):
    """A bad expression: ``position`` is the 1-based character where the bad field starts."""

    def __init__(self, message: str, position: int) -> None:
        super().__init__(message)
        self.position = position


@dataclass(frozen=True)
class Cron:
    """A parsed expression in a zone; ``next_after`` is its whole behaviour."""

    expr: str
    zone: ZoneInfo | None  # None: UTC, where wall time is real time
    fixed_time: bool  # the Debian rule's fixed-time case (see the module doc)
    has_seconds: bool

    def next_after(self, after_s: float) -> int | None:
        """The first occurrence strictly after ``after_s`` (Unix seconds), or None
        if there is none in the next 50 years."""
        return _next_after(self, math.floor(after_s))

    def _compute_next(self, after_s: int) -> int | None:
        after = datetime.fromtimestamp(after_s, UTC)
        if self.zone is None:
            found = _first_naive(self.expr, after.replace(tzinfo=None))
            return None if found is None else _utc_seconds(found)
        wall_after = _naive_of(int(after_s), self.zone)
        if self.fixed_time:
            # Wall order and real order agree once each wall time has one
            # instant (gap: the instant after it; fold: its first pass), and
            # wall_after's own instant is not after ``after_s``: the first
            # mapped instant past ``after_s`` is the answer.
            for wall in _walk_naive(self.expr, wall_after):
                instant = _fixed_instant(wall, self.zone)
                if instant > after_s:
                    return instant
            return None
        # Every real instant. Through a fold, wall time runs back: an instant
        # after ``after_s`` may read an earlier wall time (start that much
        # before), and a later wall time may come earlier in real time (keep
        # looking while a wall time could still map before the best found).
        offset_s = _offset_s(int(after_s), self.zone)
        drop_s = max(0, offset_s - _offset_s(int(after_s) + _MAX_SHIFT_S, self.zone))
        best: int | None = None
        best_wall = wall_after
        spread_s = 0
        for wall in _walk_naive(self.expr, wall_after - timedelta(seconds=drop_s)):
            if best is not None and wall > best_wall + timedelta(seconds=spread_s):
                break
            for instant in _real_instants(wall, self.zone):
                if instant > after_s and (best is None or instant < best):
                    best, best_wall = instant, wall
                    spread_s = _spread_s(best, self.zone)
        return best

    def iter_after(self, after_s: float) -> Iterator[int]:
        at: float = after_s
        while (found := self.next_after(at)) is not None:
            yield found
            at = found

    def explain(self) -> str:
        # cronsim's explain wants the six-field form and upper case, as its iterator does.
        parts = self.expr.upper().split()
        if len(parts) == 5:
            parts.insert(0, "0")
        from cronsim.explain import Expression

        text: str = Expression(parts).explain()
        return text


@functools.lru_cache(maxsize=65536)
def _next_after(cron: Cron, after_s: int) -> int | None:
    # Many schedules share an expression and come due together (every minute,
    # at midnight): one walk answers them all. A pure function of its inputs.
    return cron._compute_next(after_s)


@functools.lru_cache(maxsize=4096)
def parse(expr: str, zone: ZoneInfo | None) -> Cron:
    """Check ``expr`` (5 fields, or 6 with seconds first); CronError names the bad field.
    Cached: a Cron is immutable, and one expression serves many schedules."""
    parts = expr.split()
    if len(parts) not in (5, 6):
        raise CronError(f"needs 5 fields (or 6 with seconds first), got {len(parts)}", 1)
    offset = 0 if len(parts) == 6 else 1
    for index, part in enumerate(parts):
        # Each field alone, in a probe with the others wild, so the error
        # points at the field that is wrong.
        probe = ["*"] * 6
        probe[index + offset] = part
        try:
            CronSim(" ".join(probe), datetime(2000, 1, 1))
        except CronSimError:
            position = _position(expr, index)
            name = _FIELD_NAMES[index + offset]
            raise CronError(f"bad {name} field {part!r} at position {position}", position) from None
    try:
        CronSim(expr, datetime(2000, 1, 1))
    except CronSimError as error:
        # Fields fine alone, wrong together ("0 0 30 2 *": no 30 February):
        # cronsim names the field, and so do we.
        name = str(error).removeprefix("Bad ")
        index = _FIELD_NAMES.index(name) - offset if name in _FIELD_NAMES else 0
        position = _position(expr, max(index, 0))
        raise CronError(
            f"bad {name} field {parts[max(index, 0)]!r} at position {position}: no date matches it",
            position,
        ) from None
    minute, hour = parts[len(parts) - 5], parts[len(parts) - 4]
    fixed = not minute.startswith("*") and not hour.startswith("*")
    return Cron(expr, zone, fixed, len(parts) == 6)


def _position(expr: str, index: int) -> int:
    """The 1-based position of field ``index`` in ``expr``."""
    at = 0
    for number in range(index + 1):
        while expr[at].isspace():
            at += 1
        if number == index:
            return at + 1
        while at < len(expr) and not expr[at].isspace():
            at += 1
    return 1  # unreachable: parse counted the fields


def _walk_naive(expr: str, start: datetime) -> Iterator[datetime]:
    """Wall-clock matches strictly after ``start`` (naive), for 50 years
    (cronsim stops there)."""
    return iter(CronSim(expr, start))


def _offset_s(instant_s: int, zone: ZoneInfo) -> int:
    offset = datetime.fromtimestamp(instant_s, zone).utcoffset()
    return 0 if offset is None else int(offset.total_seconds())


def _spread_s(instant_s: int, zone: ZoneInfo) -> int:
    """How far the zone's offset moves within 3 h either side of ``instant_s``:
    how much later a wall time may be and still map to an earlier instant."""
    offsets = [_offset_s(instant_s + step, zone) for step in (-_MAX_SHIFT_S, 0, _MAX_SHIFT_S)]
    return max(offsets) - min(offsets)


def _first_naive(expr: str, start: datetime) -> datetime | None:
    return next(_walk_naive(expr, start), None)


def _utc_seconds(naive_utc: datetime) -> int:
    return int(naive_utc.replace(tzinfo=UTC).timestamp())


def _naive_of(instant_s: int, zone: ZoneInfo) -> datetime:
    return datetime.fromtimestamp(instant_s, zone).replace(tzinfo=None)


def _real_instants(wall: datetime, zone: ZoneInfo) -> list[int]:
    """The instants whose wall-clock time in ``zone`` is ``wall``: none in a
    gap, two in a fold, one otherwise."""
    found = []
    for fold in (0, 1):
        instant = int(wall.replace(tzinfo=zone, fold=fold).timestamp())
        if _naive_of(instant, zone) == wall and instant not in found:
            found.append(instant)
    return found


def _fixed_instant(wall: datetime, zone: ZoneInfo) -> int:
    """The Debian rule for a fixed time: its first pass, or in a gap the first
    instant after the gap."""
    real = _real_instants(wall, zone)
    if real:
        return real[0]
    # In a gap, fold=1 reads the wall time with the offset from before the
    # jump, which lands past it; the jump itself is the latest instant whose
    # wall time is before ``wall``, plus the missing span. Search it by the
    # minute (transitions are on whole minutes in tzdata).
    probe = int(wall.replace(tzinfo=zone, fold=0).timestamp())
    low = probe - int(_MAX_SHIFT.total_seconds())
    # The first instant at or after ``low`` whose wall time is past ``wall``.
    high = probe + int(_MAX_SHIFT.total_seconds())
    while high - low > 1:
        middle = (low + high) // 2
        if _naive_of(middle, zone) > wall:
            high = middle
        else:
            low = middle
    return high
