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
from cronreference import (
    EXPRESSIONS,
    INSTANTS,
    TRANSITIONS,
    WINDOW_S,
    ZONES,
    reference,
    zone_of,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from delaywheel.schedules.cron import CronError, parse

UTC = timezone.utc


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


# --- against the brute-force reference (tests/cronreference.py) ---------------


def _ours(expr: str, tz: str, start_s: int, end_s: int) -> list[int]:
    found = []
    for instant in parse(expr, zone_of(tz)).iter_after(start_s):
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
    five, six = parse(expr, zone_of(tz)), parse("0 " + expr, zone_of(tz))
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
    zone = zone_of(tz) or UTC
    cron = parse(f"{minute} {hour} * * *", zone_of(tz))
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
