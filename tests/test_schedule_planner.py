"""The schedule map's checks and the planner (delaywheel/schedules/spec.py, planner.py).

Pure functions of a schedule and ``now``: no clock is read, so each test
passes the instant it means.
"""

from __future__ import annotations

import itertools
from datetime import datetime, timezone
from typing import Any

import pytest
from cronreference import EXPRESSIONS, INSTANTS, WINDOW_S, ZONES, reference
from delaywheel_client.partitions import occurrence_id
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from delaywheel.errors import RequestError
from delaywheel.schedules import planner
from delaywheel.schedules.spec import apply_changes, check_preview, check_schedule

UTC = timezone.utc
TICK_S = 0.01
# 2026-01-05 00:00:00 UTC, a Monday.
NOW_MS = int(datetime(2026, 1, 5, tzinfo=UTC).timestamp()) * 1000
MINUTE_MS = 60_000


def schedule(**fields: Any) -> planner.Schedule:
    fields.setdefault("id", "report")
    fields.setdefault("topic", "reports")
    return check_schedule(fields, TICK_S, NOW_MS)


def refused(value: Any, *words: str) -> str:
    with pytest.raises(RequestError) as raised:
        check_schedule(value, TICK_S, NOW_MS)
    assert raised.value.code == "bad_request"
    for word in words:
        assert word in raised.value.message, raised.value.message
    return raised.value.message


# --- the schedule map ----------------------------------------------------


def test_defaults_and_the_map_sent_back() -> None:
    made = schedule(cron="30 1 * * *", tz="Europe/London", body=b"x")
    assert made.to_map() == {
        "id": "report",
        "cron": "30 1 * * *",
        "tz": "Europe/London",
        "start_at": None,
        "end_at": None,
        "max_runs": None,
        "jitter": 0.0,
        "catchup": "latest",
        "catchup_window": 86400.0,
        "overlap": "skip",
        "topic": "reports",
        "body": b"x",
    }
    assert schedule(every=90).to_map()["anchor"] == 0.0
    assert schedule(cron="* * * * *").spec.tz == "UTC"


@pytest.mark.parametrize(
    "tz", ["Local", "localtime", "EST", "CET", "+05:00", "UTC+5", "Etc/GMT+5", "GMT", "", 5]
)
def test_ambiguous_zones_are_refused(tz: Any) -> None:
    refused({"id": "a", "cron": "* * * * *", "tz": tz}, "tz must be an IANA zone name")


def test_an_unknown_zone_is_named() -> None:
    refused({"id": "a", "cron": "* * * * *", "tz": "Europe/Atlantis"}, "'Europe/Atlantis'")


def test_a_bad_expression_gives_the_field_and_position() -> None:
    refused({"id": "a", "cron": "0 25 * * *"}, "cron '0 25 * * *'", "hour", "position 3")


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ({"id": "a"}, ["exactly one of cron"]),
        ({"id": "a", "cron": "* * * * *", "every": 60}, ["exactly one of cron"]),
        ({"id": "a", "every": 0.001}, ["every must be at least the tick (0.01 s)"]),
        ({"id": "a", "every": -5}, ["every must be a number"]),
        ({"id": "a", "every": 60, "tz": "UTC"}, ["tz is for cron"]),
        ({"id": "a", "cron": "* * * * *", "anchor": 5}, ["anchor is for every"]),
        ({"id": "a", "every": 60, "colour": "red"}, ["unknown field 'colour'"]),
        ({"id": "", "every": 60}, ["id must be a str"]),
        ({"id": "a", "every": 60, "catchup": "most"}, ["catchup must be one of latest"]),
        ({"id": "a", "every": 60, "overlap": "replace"}, ["overlap must be one of skip"]),
        ({"id": "a", "every": 60, "max_runs": 0}, ["max_runs must be an int >= 1"]),
        ({"id": "a", "every": 60, "jitter": -1}, ["jitter must be a number"]),
        ({"id": "a", "every": 60, "start_at": 10, "end_at": 5}, ["end_at must not be before"]),
        ({"id": "a", "cron": 5}, ["cron must be a str"]),
        ([], ["schedule must be a map"]),
    ],
)
def test_bad_maps_name_the_field(value: Any, words: list[str]) -> None:
    refused(value, *words)


def test_no_occurrence_in_50_years_is_refused() -> None:
    past = NOW_MS / 1000 - 3600
    refused({"id": "a", "every": 60, "end_at": past}, "end_at", "leaves no occurrence")
    far = NOW_MS / 1000 + 60 * 365 * 86400
    refused({"id": "a", "every": 60, "start_at": far}, "start_at", "next 50 years")
    refused({"id": "a", "cron": "0 0 1 1 *", "start_at": far}, "start_at", "next 50 years")


def test_a_preview_needs_no_template() -> None:
    preview = check_preview({"cron": "30 1 * * *", "tz": "Europe/London"}, TICK_S)
    reply = planner.render_next(preview, NOW_MS, 2)
    assert [t["local"] for t in reply["times"]] == [
        "2026-01-05T01:30:00+00:00",
        "2026-01-06T01:30:00+00:00",
    ]
    assert reply["times"][0]["utc"] == NOW_MS // 1000 + 5400
    assert reply["description"].startswith("At 01:30 every day (Europe/London")
    with pytest.raises(RequestError, match="unknown field 'topic'"):
        check_preview({"every": 60, "topic": "t"}, TICK_S)


def test_next_across_a_spring_gap_shows_the_shift() -> None:
    preview = check_preview({"cron": "30 2 * * *", "tz": "America/New_York"}, TICK_S)
    at = int(datetime(2025, 3, 8, 12, tzinfo=UTC).timestamp()) * 1000
    local = [t["local"] for t in planner.render_next(preview, at, 2)["times"]]
    assert local == ["2025-03-09T03:00:00-04:00", "2025-03-10T02:30:00-04:00"]


@pytest.mark.parametrize("n", [0, 1001, 2.5, "5"])
def test_next_takes_1_to_1000(n: Any) -> None:
    with pytest.raises(RequestError, match="n must be an int from 1 to 1000"):
        planner.render_next(schedule(every=60), NOW_MS, n)


@pytest.mark.parametrize(("every", "listed"), [(3.5e80, 0), (1e12, 0), (1e9, 2)])
def test_next_lists_only_the_next_50_years(every: float, listed: int) -> None:
    # Before: an every of years answered times past year 9999, an internal error.
    preview = check_preview({"every": every}, TICK_S)
    times = planner.render_next(preview, NOW_MS, 1000)["times"]
    assert len(times) == listed  # 1e9: 2033 and 2065, not 2096
    assert all(t["utc"] * 1000 - NOW_MS <= 50 * 365.25 * 86400_000 for t in times)


def test_every_is_described() -> None:
    text = planner.render_next(schedule(every=900), NOW_MS, 1)["description"]
    assert text.startswith("Every 15 minutes, counted from 1970-01-01T00:00:00+00:00")


def test_changes_replace_fields_and_switch_kinds() -> None:
    current = schedule(cron="30 1 * * *", tz="Europe/London", jitter=5).to_map()
    merged = apply_changes(current, {"every": 60, "jitter": None})
    assert "cron" not in merged and "tz" not in merged and "jitter" not in merged
    assert check_schedule(merged, TICK_S, NOW_MS).spec.every_ms == 60_000
    with pytest.raises(RequestError, match="unknown field 'id'"):
        apply_changes(current, {"id": "other"})


# --- occurrences ---------------------------------------------------------


def test_occurrence_ids_use_the_nominal_utc_second() -> None:
    assert occurrence_id("daily", 1_767_571_200_000) == "s:daily:1767571200"
    assert occurrence_id("fast", 1_767_571_200_250) == "s:fast:1767571200.25"


@settings(max_examples=100, deadline=None)
@given(
    every_ms=st.integers(10, 10 * 86_400_000),
    anchor_ms=st.integers(-(10**12), 2 * 10**12),
    after_ms=st.integers(1_704_067_200_000, 1_830_297_600_000),
)
def test_every_lands_on_anchor_plus_k_every(every_ms: int, anchor_ms: int, after_ms: int) -> None:
    made = check_schedule(
        {"id": "e", "every": every_ms / 1000, "anchor": anchor_ms / 1000}, TICK_S, after_ms
    )
    times = planner.occurrences(made, after_ms, 5)
    assert times[0] > after_ms >= times[0] - every_ms
    for t in times:
        assert (t - made.spec.anchor_ms) % made.spec.every_ms == 0
    assert all(b - a == made.spec.every_ms for a, b in itertools.pairwise(times))
    ids = [occurrence_id("e", t) for t in times]
    assert len(set(ids)) == len(ids)


def test_start_end_bound_the_occurrences() -> None:
    start = NOW_MS / 1000 + 3600
    made = schedule(every=600, start_at=start, end_at=start + 1800)
    assert planner.occurrences(made, NOW_MS, 10) == [
        int(start * 1000) + k * 600_000 for k in range(4)
    ]


# --- catch-up ------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "missed_n", "fired"),
    [
        ("skip", 5, 0),
        ("latest", 5, 1),
        ("all", 5, 5),
        ("skip", 250, 0),
        ("latest", 250, 1),
        ("all", 250, 100),
    ],
)
def test_catchup_fires_0_1_or_min_n_100(policy: str, missed_n: int, fired: int) -> None:
    made = schedule(every=60, catchup=policy)
    pending = NOW_MS
    now = pending + (missed_n - 1) * MINUTE_MS + 30_000  # N due, the next 30 s away
    plan = planner.plan_catchup(made, pending, now)
    assert len(plan.fire) == fired
    assert plan.missed == missed_n - fired
    assert plan.next_ms == pending + missed_n * MINUTE_MS
    if fired:
        # The newest ones, oldest first.
        assert plan.fire[-1] == pending + (missed_n - 1) * MINUTE_MS
        assert plan.fire == sorted(plan.fire)


@pytest.mark.parametrize(
    ("late_ms", "fired", "missed"),
    [(0, 1, 0), (10_000, 1, 0), (10_001, 0, 1), (MINUTE_MS, 0, 2)],
)
def test_skip_fires_the_pending_one_on_time(late_ms: int, fired: int, missed: int) -> None:
    """On time (alone due, at most on_time_ms late, its jitter not counted) is
    not downtime: skip fires it. Later, or with a second one due, it is missed."""
    made = schedule(every=60, catchup="skip", jitter=20)
    pending = NOW_MS
    fire_at = pending + planner.jitter_ms(made, pending)
    plan = planner.plan_catchup(made, pending, fire_at + late_ms, on_time_ms=10_000)
    assert (plan.fire, plan.missed) == ([pending] * fired, missed)


def test_latest_outside_the_window_fires_nothing() -> None:
    made = schedule(cron="0 3 * * *", catchup="latest", catchup_window=3600)
    pending = NOW_MS + 3 * 3600_000  # 03:00
    plan = planner.plan_catchup(made, pending, pending + 2 * 3600_000)
    assert plan.fire == [] and plan.missed == 1
    plan = planner.plan_catchup(made, pending, pending + 1800_000)
    assert plan.fire == [pending] and plan.missed == 0


def test_all_fires_only_within_the_window() -> None:
    made = schedule(every=60, catchup="all", catchup_window=600)
    plan = planner.plan_catchup(made, NOW_MS, NOW_MS + 59 * MINUTE_MS)
    assert len(plan.fire) == 11 and plan.missed == 49


def test_cron_catchup_counts_what_it_walks() -> None:
    made = schedule(cron="*/5 * * * *", catchup="all")
    plan = planner.plan_catchup(made, NOW_MS, NOW_MS + 24 * 3600_000 - 1)
    assert len(plan.fire) == 100 and plan.missed == 288 - 100


def test_a_long_outage_is_counted_without_a_long_walk() -> None:
    made = schedule(every=1, catchup="skip")
    plan = planner.plan_catchup(made, NOW_MS, NOW_MS + 365 * 86_400_000)
    assert plan.missed == 365 * 86_400 + 1 and plan.fire == []


# --- edits, resume, backfill, jitter -------------------------------------


@settings(max_examples=100, deadline=None)
@given(
    now_delta=st.integers(0, 10 * 86_400_000),
    fired_delta=st.one_of(st.none(), st.integers(-86_400_000, 20 * 86_400_000)),
    expr=st.sampled_from(["*/15 * * * *", "30 1 * * *", "0 9 * * 1-5"]),
)
def test_an_edit_never_fires_retroactively(
    now_delta: int, fired_delta: int | None, expr: str
) -> None:
    made = schedule(cron=expr, tz="Europe/London")
    now = NOW_MS + now_delta
    last = None if fired_delta is None else NOW_MS + fired_delta
    pending = planner.after_edit(made, now, last)
    assert pending is not None and pending > now
    assert last is None or pending > last


def test_resume_starts_from_now_and_backfill_is_explicit() -> None:
    made = schedule(every=3600)
    assert planner.after_resume(made, NOW_MS + 1) == NOW_MS + 3600_000
    filled = planner.backfill(made, NOW_MS - 3 * 3600_000, NOW_MS + 10 * 3600_000, NOW_MS)
    assert filled == [NOW_MS - k * 3600_000 for k in (3, 2, 1, 0)]
    with pytest.raises(RequestError, match="more than 1000"):
        planner.backfill(schedule(every=1), NOW_MS - 3600_000, NOW_MS, NOW_MS)
    with pytest.raises(RequestError, match="before start"):
        planner.backfill(made, NOW_MS, NOW_MS - 1, NOW_MS)


@settings(max_examples=100, deadline=None)
@given(
    jitter_s=st.integers(0, 7200),
    expr=st.sampled_from(["*/15 * * * *", "30 1 * * *", "* * * * * *"]),
    k=st.integers(0, 50),
)
def test_jitter_is_deterministic_and_never_past_the_next(jitter_s: int, expr: str, k: int) -> None:
    made = schedule(cron=expr, tz="America/New_York", jitter=jitter_s)
    nominal = planner.occurrences(made, NOW_MS + k * 7_919_000, 1)[0]
    following = planner.occurrences(made, nominal, 1)[0]
    offset = planner.jitter_ms(made, nominal)
    assert offset == planner.jitter_ms(made, nominal)
    assert 0 <= offset < max(1, min(jitter_s * 1000, following - nominal))


def test_jitter_spreads_and_differs_by_id() -> None:
    a, b = schedule(id="a", every=3600, jitter=600), schedule(id="b", every=3600, jitter=600)
    offsets_a = [planner.jitter_ms(a, NOW_MS + k * 3600_000) for k in range(20)]
    offsets_b = [planner.jitter_ms(b, NOW_MS + k * 3600_000) for k in range(20)]
    assert len(set(offsets_a)) > 10 and offsets_a != offsets_b
    assert planner.jitter_ms(schedule(every=60), NOW_MS) == 0


# --- both planners against the per-minute reference ---------------------------------------


# Dense ones too, so that catchup all meets its cap of 100 within the window.
PLANNED = st.one_of(EXPRESSIONS, st.sampled_from(["* * * * *", "*/5 * * * *", "*/7 9-17 * * 1-5"]))


PLANNER_CASES = {
    "expr": PLANNED,
    "tz": st.sampled_from(ZONES),
    "start_s": INSTANTS,
    "policy": st.sampled_from(["latest", "skip", "all"]),
    "window_s": st.sampled_from([600, 3600, 86_400]),
    "data": st.data(),
}


def _planners_test(examples: int) -> Any:
    """The test below with ``examples`` random cases (25 in the fast suite, 300 slow)."""

    @settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(**PLANNER_CASES)
    def run(
        expr: str, tz: str, start_s: int, policy: str, window_s: int, data: st.DataObject
    ) -> None:
        _check_planners(expr, tz, start_s, policy, window_s, data)

    return run


test_both_planners_match_the_per_minute_reference = _planners_test(25)
test_both_planners_match_the_reference_at_length = pytest.mark.slow(_planners_test(300))


def _check_planners(
    expr: str, tz: str, start_s: int, policy: str, window_s: int, data: st.DataObject
) -> None:
    """A saved schedule's planners, pure functions of ``now``, against the
    brute-force reference (tests/test_schedule_cron.py: every real minute, Debian
    cron's DST rule) for random expressions and instants in 2024-2027 in the five
    zones. The occurrence planner: the same instants from ``start_s``, strictly
    increasing, distinct ids. The catch-up planner, with the server down from the
    pending occurrence until ``now`` (anywhere in two days, on an occurrence, or
    where one is at the window's edge): what fires, what is missed and the next
    pending one are the policy applied to the reference's due occurrences."""
    made = check_schedule(
        {"id": "p", "cron": expr, "tz": tz, "topic": "t", "catchup": policy,
         "catchup_window": window_s},
        TICK_S,
        start_s * 1000,
    )  # fmt: skip
    expected = reference(expr, tz, start_s, start_s + WINDOW_S)
    ours = [t // 1000 for t in planner.occurrences(made, start_s * 1000, len(expected) + 1)]
    assert ours[: len(expected)] == expected
    assert ours[len(expected)] > start_s + WINDOW_S  # nothing more within the window
    ids = [occurrence_id("p", t * 1000) for t in ours]
    assert ours == sorted(set(ours)) and len(set(ids)) == len(ids)

    pending_s = ours[0]
    now_s = data.draw(
        st.one_of(
            st.integers(pending_s, pending_s + WINDOW_S),
            st.sampled_from(ours),
            st.tuples(st.sampled_from(ours), st.sampled_from([-1, 0, 1])).map(
                lambda edge: edge[0] + window_s + edge[1]
            ),
        ),
        label="now_s",
    )
    due = reference(expr, tz, pending_s - 1, now_s)
    assert due[0] == pending_s
    later = reference(expr, tz, now_s, now_s + 86_400)
    if policy == "skip":
        fire = due if due == [pending_s] and now_s == pending_s else []  # on time (0 ms late)
    else:
        newest = due[-1:] if policy == "latest" else due[-planner.CATCHUP_CAP :]
        fire = [t for t in newest if t >= now_s - window_s]
    plan = planner.plan_catchup(made, pending_s * 1000, now_s * 1000)
    assert [t // 1000 for t in plan.fire] == fire
    assert plan.missed == len(due) - len(fire)
    if later:
        assert plan.next_ms == later[0] * 1000
