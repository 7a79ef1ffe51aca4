"""A brute-force reference for cron occurrences, and hypothesis strategies over it.

``reference`` walks every real minute and applies Debian cron's rule on its
own (a fixed time fires at the first real minute whose wall time reaches it
for the first time; anything hourly or finer fires at every real minute whose
wall time matches), for tests/test_schedule_cron.py and
tests/test_schedule_planner.py to check delaywheel/schedules/ against.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

from hypothesis import strategies as st

UTC = timezone.utc
ZONES = ["UTC", "America/New_York", "Europe/London", "Australia/Lord_Howe", "Asia/Kolkata"]


def zone_of(name: str) -> ZoneInfo | None:
    return None if name == "UTC" else ZoneInfo(name)


def _field_values(text: str, low: int, high: int) -> set[int]:
    values: set[int] = set()
    for term in text.split(","):
        step = 1
        if "/" in term:
            term, step_text = term.split("/")
            step = int(step_text)
        if term == "*":
            first, last = low, high
        elif "-" in term:
            first, last = (int(x) for x in term.split("-"))
        else:
            first = int(term)
            last = high if step > 1 else first
        values.update(range(first, last + 1, step))
    return values


def _matcher(expr: str):  # type: ignore[no-untyped-def]
    minute, hour, dom, month, dow = expr.split()
    minutes, hours = _field_values(minute, 0, 59), _field_values(hour, 0, 23)
    doms, months = _field_values(dom, 1, 31), _field_values(month, 1, 12)
    dows = {d % 7 for d in _field_values(dow, 0, 7)}
    either = not dom.startswith("*") and not dow.startswith("*")

    def matches(wall: datetime) -> bool:
        if wall.minute not in minutes or wall.hour not in hours or wall.month not in months:
            return False
        day_ok, dow_ok = wall.day in doms, (wall.weekday() + 1) % 7 in dows
        return (day_ok or dow_ok) if either else (day_ok and dow_ok)

    return matches


def reference(expr: str, tz: str, start_s: int, end_s: int) -> list[int]:
    """Occurrences in (start_s, end_s], minute by real minute, by the Debian rule."""
    zone = zone_of(tz) or UTC
    matches = _matcher(expr)
    minute, hour = expr.split()[:2]
    fixed = not minute.startswith("*") and not hour.startswith("*")
    begin = (start_s // 60 - 4 * 60) * 60  # early enough to know which walls were seen
    highest = datetime.fromtimestamp(begin, zone).replace(tzinfo=None)
    fired = []
    for t in range(begin + 60, end_s + 1, 60):
        wall = datetime.fromtimestamp(t, zone).replace(tzinfo=None)
        if fixed:
            # Fires at t if a matching wall time is reached for the first time
            # now: one it jumped over in a gap counts, one seen before a fold does not.
            hit = False
            probe = highest + timedelta(minutes=1)
            while probe <= wall:
                hit = hit or matches(probe)
                probe += timedelta(minutes=1)
            highest = max(highest, wall)
        else:
            hit = matches(wall)
        if hit and t > start_s:
            fired.append(t)
    return fired


def _transitions() -> list[int]:
    """Every UTC instant in 2024-2027 where a test zone's offset changes (hourly scan)."""
    found = []
    for name in ZONES[1:]:
        zone = ZoneInfo(name)
        t = int(datetime(2024, 1, 1, tzinfo=UTC).timestamp())
        end = int(datetime(2028, 1, 1, tzinfo=UTC).timestamp())
        last = datetime.fromtimestamp(t, zone).utcoffset()
        while t < end:
            t += 1800
            offset = datetime.fromtimestamp(t, zone).utcoffset()
            if offset != last:
                found.append(t)
                last = offset
    return found


TRANSITIONS = _transitions()
START_2024 = int(datetime(2024, 1, 1, tzinfo=UTC).timestamp())
END_2027 = int(datetime(2027, 12, 31, tzinfo=UTC).timestamp())


def _field(low: int, high: int) -> st.SearchStrategy[str]:
    number = st.integers(low, high)
    return st.one_of(
        st.just("*"),
        st.integers(2, max(2, (high - low) // 2)).map(lambda n: f"*/{n}"),
        number.map(str),
        st.tuples(number, number).map(lambda p: f"{min(p)},{max(p)}"),
        st.tuples(number, number).map(lambda p: f"{min(p)}-{max(p)}"),
    )


EXPRESSIONS = st.tuples(
    _field(0, 59),
    _field(0, 23),
    st.sampled_from(["*", "*", "*", "1-20", "15"]),
    st.just("*"),
    st.sampled_from(["*", "*", "0", "1-5", "6,0"]),
).map(" ".join)
# Instants anywhere in 2024-2027, or within a day of an offset change.
INSTANTS = st.one_of(
    st.integers(START_2024, END_2027),
    st.tuples(st.sampled_from(TRANSITIONS), st.integers(-86_400, 3600)).map(sum),
)
WINDOW_S = 2 * 86_400
