"""Durations and times as typed on the command line (delaywheel.cli.durations)."""

from __future__ import annotations

import math
import time
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delaywheel.cli.durations import (
    UNITS,
    format_duration,
    format_relative,
    format_time,
    parse_duration,
    parse_when,
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90.0),
        ("0", 0.0),
        ("1.5", 1.5),
        (".5", 0.5),
        ("1e3", 1000.0),
        ("90s", 90.0),
        ("30m", 1800.0),
        ("2h", 7200.0),
        ("5d", 432000.0),
        ("1w", 604800.0),
        ("250ms", 0.25),
        ("1h30m", 5400.0),
        ("1h 30m 15s", 5415.0),
        ("1.5h", 5400.0),
        ("2H", 7200.0),
        ("  45s  ", 45.0),
        ("1d2h3m4s5ms", 86400 + 7200 + 180 + 4.005),
    ],
)
def test_parse_duration_accepts(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "empty duration"),
        ("   ", "empty duration"),
        ("-5", "negative"),
        ("-5s", "negative"),
        ("5x", "bad duration '5x'"),
        ("h", "bad duration 'h'"),
        ("1h30", "bad duration '1h30'"),
        ("s5", "bad duration 's5'"),
        ("inf", "bad duration 'inf'"),
        ("nan", "bad duration 'nan'"),
        ("1e400", "too large"),
        ("1,5", "bad duration '1,5'"),
    ],
)
def test_parse_duration_refuses_with_the_text(text: str, needle: str) -> None:
    with pytest.raises(ValueError, match=needle) as info:
        parse_duration(text)
    assert repr(text) in str(info.value)


def test_parse_when_iso_utc_offset_and_naive() -> None:
    now = time.time()
    expected = datetime(2026, 12, 24, 9, 0, tzinfo=timezone.utc).timestamp()
    assert parse_when("2026-12-24T09:00:00Z", now) == expected
    assert parse_when("2026-12-24T09:00:00z", now) == expected
    assert parse_when("2026-12-24T09:00:00+00:00", now) == expected
    assert parse_when("2026-12-24T10:30:00+01:30", now) == expected
    assert parse_when("2026-12-24 09:00:00.250Z", now) == expected + 0.25
    # Naive means local time, whatever zone the test machine is in.
    assert parse_when("2026-12-24T09:00:00", now) == datetime(2026, 12, 24, 9, 0).timestamp()
    assert parse_when("2026-12-24", now) == datetime(2026, 12, 24).timestamp()


def test_parse_when_duration_from_now() -> None:
    assert parse_when("90s", 1000.0) == 1090.0
    assert parse_when("1h30m", 1000.0) == 1000.0 + 5400
    assert parse_when("0", 1000.0) == 1000.0
    assert parse_when("now", 1000.0) == 1000.0


@pytest.mark.parametrize("text", ["", "tomorrow", "2026-13-01T00:00:00Z", "-5s", "12:00 pm"])
def test_parse_when_refuses_with_the_text(text: str) -> None:
    with pytest.raises(ValueError, match="bad time") as info:
        parse_when(text, 0.0)
    assert repr(text) in str(info.value)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.25, "0.25s"),
        (1.5, "1.5s"),
        (90, "1m30s"),
        (5400, "1h30m"),
        (86400 * 2 + 3600 * 3 + 4 * 60 + 5.25, "2d3h4m5.25s"),
        (0.0004, "0s"),
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_format_duration_refuses_negative_and_non_finite() -> None:
    for bad in (-1.0, math.inf, math.nan):
        with pytest.raises(ValueError):
            format_duration(bad)


def test_format_relative_and_time() -> None:
    assert format_relative(1090.0, 1000.0) == "in 1m30s"
    assert format_relative(910.0, 1000.0) == "1m30s ago"
    assert format_relative(1000.2, 1000.0) == "now"
    moment = datetime(2026, 12, 24, 9, 0, tzinfo=timezone.utc)
    shown = format_time(moment.timestamp())
    assert datetime.fromisoformat(shown) == moment  # local, with its offset
    assert parse_when(shown, 0.0) == moment.timestamp()


@given(st.floats(min_value=0, max_value=1e10, allow_nan=False, allow_infinity=False))
def test_format_then_parse_round_trips_to_the_millisecond(seconds: float) -> None:
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds, abs=0.0005, rel=1e-12)


@given(
    st.lists(
        st.tuples(st.integers(min_value=0, max_value=10_000), st.sampled_from(sorted(UNITS))),
        min_size=1,
        max_size=6,
    ),
    st.sampled_from(["", " "]),
)
def test_parts_add_up(parts: list[tuple[int, str]], separator: str) -> None:
    text = separator.join(f"{count}{unit}" for count, unit in parts)
    expected = sum(count * UNITS[unit] for count, unit in parts)
    assert parse_duration(text) == pytest.approx(expected)
    assert parse_when(text, 1_000_000.0) == pytest.approx(1_000_000.0 + expected)


@given(
    st.datetimes(
        min_value=datetime(1971, 1, 2),
        max_value=datetime(2200, 1, 1),
        timezones=st.just(timezone.utc)
        | st.builds(
            lambda minutes: timezone(timedelta(minutes=minutes)),
            st.integers(min_value=-14 * 60, max_value=14 * 60),
        ),
    )
)
def test_iso_round_trip(moment: datetime) -> None:
    assert parse_when(moment.isoformat(), 0.0) == moment.timestamp()
