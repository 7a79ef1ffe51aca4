"""Cron occurrences and the DST rule (delaywheel/schedules/cron.py, docs/schedules.md).

Two kinds of evidence: frozen fixtures for the DST nights the issue lists
(written out by hand from the rule, not from the code), and hypothesis
against a brute-force reference that walks every real minute and applies
Debian cron's rule on its own (a fixed time fires at the first real minute
whose wall time reaches it for the first time; anything hourly or finer
fires at every real minute whose wall time matches).
"""

from __future__ import annotations

import itertools
from datetime import date, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from delaywheel.schedules.cron import CronError, parse

UTC = timezone.utc
ZONES = ["UTC", "America/New_York", "Europe/London", "Australia/Lord_Howe", "Asia/Kolkata"]


def _zone(name: str) -> ZoneInfo | None:
    return None if name == "UTC" else ZoneInfo(name)


def _on_local_date(expr: str, tz: str, day: str) -> list[str]:
    """Every occurrence whose local date is ``day``, as local ISO times (time and offset)."""
    zone = ZoneInfo(tz)
    cron = parse(expr, zone)
    start = datetime.fromisoformat(day).replace(tzinfo=zone) - timedelta(hours=4)
    out = []
    for instant in cron.iter_after(start.timestamp()):
        local = datetime.fromtimestamp(instant, zone)
        if local.date() > date.fromisoformat(day):
            return out
        if local.date() == date.fromisoformat(day):
            out.append(local.isoformat()[11:])
    return out


# (zone, date, expression) -> the local times that day, by the Debian rule.
# New York springs 02:00 -> 03:00 and falls 02:00 EDT -> 01:00 EST;
# London springs 01:00 -> 02:00 and falls 02:00 BST -> 01:00 GMT.
FIXED_FIXTURES = [
    ("America/New_York", "2025-03-09", "30 2 * * *", ["03:00:00-04:00"]),
    ("America/New_York", "2025-03-09", "30 1 * * *", ["01:30:00-05:00"]),
    ("America/New_York", "2025-03-09", "30 1 * * 0", ["01:30:00-05:00"]),
    ("America/New_York", "2025-11-02", "30 2 * * *", ["02:30:00-05:00"]),
    ("America/New_York", "2025-11-02", "30 1 * * *", ["01:30:00-04:00"]),
    ("America/New_York", "2025-11-02", "30 1 * * 0", ["01:30:00-04:00"]),
    ("America/New_York", "2026-03-08", "30 2 * * *", ["03:00:00-04:00"]),
    ("America/New_York", "2026-03-08", "30 1 * * *", ["01:30:00-05:00"]),
    ("America/New_York", "2026-11-01", "30 2 * * *", ["02:30:00-05:00"]),
    ("America/New_York", "2026-11-01", "30 1 * * *", ["01:30:00-04:00"]),
    ("Europe/London", "2025-03-30", "30 2 * * *", ["02:30:00+01:00"]),
    ("Europe/London", "2025-03-30", "30 1 * * *", ["02:00:00+01:00"]),
    ("Europe/London", "2025-03-30", "30 1 * * 0", ["02:00:00+01:00"]),
    ("Europe/London", "2025-10-26", "30 2 * * *", ["02:30:00+00:00"]),
    ("Europe/London", "2025-10-26", "30 1 * * *", ["01:30:00+01:00"]),
    ("Europe/London", "2026-03-29", "30 2 * * *", ["02:30:00+01:00"]),
    ("Europe/London", "2026-03-29", "30 1 * * *", ["02:00:00+01:00"]),
    ("Europe/London", "2026-10-25", "30 2 * * *", ["02:30:00+00:00"]),
    ("Europe/London", "2026-10-25", "30 1 * * *", ["01:30:00+01:00"]),
    # Six fields (seconds first) keep the same rule: cronsim alone skips the
    # gap and doubles the fold here.
    ("America/New_York", "2025-03-09", "0 30 2 * * *", ["03:00:00-04:00"]),
    ("America/New_York", "2025-11-02", "0 30 1 * * *", ["01:30:00-04:00"]),
    # Lord Howe shifts by 30 minutes: springs 02:00 -> 02:30, falls 02:00 -> 01:30.
    ("Australia/Lord_Howe", "2025-10-05", "15 2 * * *", ["02:30:00+11:00"]),
    ("Australia/Lord_Howe", "2025-04-06", "45 1 * * *", ["01:45:00+11:00"]),
]


@pytest.mark.parametrize(("tz", "day", "expr", "expected"), FIXED_FIXTURES)
def test_fixed_times_on_dst_nights(tz: str, day: str, expr: str, expected: list[str]) -> None:
    assert _on_local_date(expr, tz, day) == expected


SPRING = [("America/New_York", d) for d in ("2025-03-09", "2026-03-08")] + [
    ("Europe/London", d) for d in ("2025-03-30", "2026-03-29")
]
AUTUMN = [("America/New_York", d) for d in ("2025-11-02", "2026-11-01")] + [
    ("Europe/London", d) for d in ("2025-10-26", "2026-10-25")
]


# The real hours of each night, in order, with the offset in force: the
# spring night skips one wall-clock hour, the autumn night has one twice.
NIGHT_HOURS = {
    ("America/New_York", "spring"): [(0, "-05:00"), (1, "-05:00")]
    + [(h, "-04:00") for h in range(3, 24)],
    ("Europe/London", "spring"): [(0, "+00:00")] + [(h, "+01:00") for h in range(2, 24)],
    ("America/New_York", "autumn"): [(0, "-04:00"), (1, "-04:00"), (1, "-05:00")]
    + [(h, "-05:00") for h in range(2, 24)],
    ("Europe/London", "autumn"): [(0, "+01:00"), (1, "+01:00"), (1, "+00:00")]
    + [(h, "+00:00") for h in range(2, 24)],
}


def _every_real(tz: str, season: str, minutes: list[int]) -> list[str]:
    return [f"{h:02d}:{m:02d}:00{offset}" for h, offset in NIGHT_HOURS[tz, season] for m in minutes]


@pytest.mark.parametrize(("tz", "day"), SPRING)
def test_hourly_and_finer_run_every_real_instant_in_spring(tz: str, day: str) -> None:
    # The day has 23 real hours: one hour's wall times never happen.
    hourly = _on_local_date("0 * * * *", tz, day)
    quarters = _on_local_date("*/15 * * * *", tz, day)
    assert hourly == _every_real(tz, "spring", [0]) and len(hourly) == 23
    assert quarters == _every_real(tz, "spring", [0, 15, 30, 45]) and len(quarters) == 92
    missing = "02" if tz == "America/New_York" else "01"
    assert len(_on_local_date("0 */2 * * *", tz, day)) == (11 if missing == "02" else 12)


@pytest.mark.parametrize(("tz", "day"), AUTUMN)
def test_hourly_and_finer_run_every_real_instant_in_autumn(tz: str, day: str) -> None:
    # 25 real hours: the repeated hour runs twice, once in each offset.
    hourly = _on_local_date("0 * * * *", tz, day)
    quarters = _on_local_date("*/15 * * * *", tz, day)
    assert hourly == _every_real(tz, "autumn", [0]) and len(hourly) == 25
    assert quarters == _every_real(tz, "autumn", [0, 15, 30, 45]) and len(quarters) == 100
    assert len(_on_local_date("0 */2 * * *", tz, day)) == 12


def test_lord_howe_half_hour_fold_keeps_every_real_instant() -> None:
    # 2025-04-06: 02:00 LHDT (+11) becomes 01:30 LHST (+10:30). cronsim on aware
    # times loses 02:00 +10:30 for "0 */2 * * *"; the real instants are all here.
    assert _on_local_date("0 */2 * * *", "Australia/Lord_Howe", "2025-04-06")[:3] == [
        "00:00:00+11:00",
        "02:00:00+10:30",
        "04:00:00+10:30",
    ]
    quarters = _on_local_date("*/15 * * * *", "Australia/Lord_Howe", "2025-04-06")
    assert quarters[5:11] == [
        "01:15:00+11:00",
        "01:30:00+11:00",
        "01:45:00+11:00",
        "01:30:00+10:30",
        "01:45:00+10:30",
        "02:00:00+10:30",
    ]
    assert len(quarters) == 24 * 4 + 2


@pytest.mark.parametrize(
    ("expr", "position", "field"),
    [
        ("61 * * * *", 1, "minute"),
        ("0 25 * * *", 3, "hour"),
        ("0 0 32 * *", 5, "day-of-month"),
        ("0 0 * 13 *", 7, "month"),
        ("0 0 * * MONDAY", 9, "day-of-week"),
        ("70 0 0 * * *", 1, "second"),
        ("0  0 30 2 *", 6, "day-of-month"),
    ],
)
def test_a_bad_field_is_named_with_its_position(expr: str, position: int, field: str) -> None:
    with pytest.raises(CronError) as raised:
        parse(expr, None)
    assert raised.value.position == position
    assert f"bad {field} field" in str(raised.value)


@pytest.mark.parametrize("expr", ["* * * *", "1 2 3 4 5 6 7", ""])
def test_a_wrong_field_count_is_refused(expr: str) -> None:
    with pytest.raises(CronError, match="needs 5 fields"):
        parse(expr, None)


# --- the brute-force reference -------------------------------------------


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
    zone = _zone(tz) or UTC
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


def _ours(expr: str, tz: str, start_s: int, end_s: int) -> list[int]:
    found = []
    for instant in parse(expr, _zone(tz)).iter_after(start_s):
        if instant > end_s:
            break
        found.append(instant)
    return found


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expr=EXPRESSIONS, tz=st.sampled_from(ZONES), start_s=INSTANTS)
def test_occurrences_match_the_per_minute_reference(expr: str, tz: str, start_s: int) -> None:
    ours = _ours(expr, tz, start_s, start_s + WINDOW_S)
    assert ours == reference(expr, tz, start_s, start_s + WINDOW_S)
    assert ours == sorted(set(ours))  # strictly increasing, so unique


@pytest.mark.slow
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expr=EXPRESSIONS, tz=st.sampled_from(ZONES), start_s=INSTANTS)
def test_occurrences_match_the_reference_at_length(expr: str, tz: str, start_s: int) -> None:
    assert _ours(expr, tz, start_s, start_s + WINDOW_S) == reference(
        expr, tz, start_s, start_s + WINDOW_S
    )


@settings(max_examples=60, deadline=None)
@given(expr=EXPRESSIONS, tz=st.sampled_from(ZONES), start_s=INSTANTS)
def test_a_zero_seconds_field_changes_nothing(expr: str, tz: str, start_s: int) -> None:
    five, six = parse(expr, _zone(tz)), parse("0 " + expr, _zone(tz))
    assert six.has_seconds and not five.has_seconds
    assert five.next_after(start_s) == six.next_after(start_s)


@settings(max_examples=40, deadline=None)
@given(
    hour=st.integers(0, 23),
    minute=st.integers(0, 59),
    tz=st.sampled_from(ZONES),
    start_s=st.sampled_from(TRANSITIONS).map(lambda t: t - 20 * 86_400),
)
def test_a_daily_fixed_time_fires_once_per_local_date(
    hour: int, minute: int, tz: str, start_s: int
) -> None:
    zone = _zone(tz) or UTC
    cron = parse(f"{minute} {hour} * * *", _zone(tz))
    dates = []
    for instant in cron.iter_after(start_s):
        dates.append(datetime.fromtimestamp(instant, zone).date())
        if len(dates) == 40:
            break
    # One per local date, no date skipped (the transition is inside the 40 days).
    assert dates == [dates[0] + timedelta(days=k) for k in range(40)]


def test_seconds_fire_every_real_second() -> None:
    cron = parse("*/20 * * * * *", ZoneInfo("Europe/London"))
    start = int(datetime(2025, 10, 26, 0, 59, 30, tzinfo=UTC).timestamp())  # 01:59:30 BST
    got = list(itertools.islice(cron.iter_after(start), 6))
    assert [t - start for t in got] == [10, 30, 50, 70, 90, 110]


def test_explain_is_plain_english() -> None:
    assert parse("30 1 * * *", None).explain() == "At 01:30 every day"
    assert "second" in parse("*/10 * * * * *", None).explain()
