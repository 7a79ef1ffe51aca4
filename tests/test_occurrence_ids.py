"""The schedules' id format, ``s:{X}:{seconds}``, and the partition rule over it.

Written once (client/delaywheel_client/partitions.py) for the server and the
clients: built and parsed back, hostile ids, and the rule as docs/protocol.md
states it for clients in other languages (a regular expression, checked here
against the code on every kind of id).
"""

from __future__ import annotations

import re
import zlib

import pytest
from delaywheel_client.partitions import (
    MAX_NOMINAL_MS,
    is_record_key,
    occurrence_id,
    parse_occurrence,
    partition_key,
    partition_of,
    record_key,
)
from hypothesis import given
from hypothesis import strategies as st

from delaywheel.schedules.occurrence import Occurrence, occurrence

# docs/protocol.md, "Several nodes: partitions", as a third party would write it.
DOCUMENTED = re.compile(r"s:(.*):[0-9]+(?:\.[0-9]+)?", re.DOTALL)

# Ids with colons, digits, dots and the characters a hostile caller would try.
ID_ALPHABET = st.sampled_from(["s", ":", "0", "1", "9", ".", "x", "\n", "²", "٣", "é", " "])
HOSTILE = st.text(ID_ALPHABET, max_size=20).map(lambda tail: "s:" + tail) | st.text(max_size=20)
SCHEDULE_IDS = st.text(min_size=1, max_size=40)


def documented_key(task_id: str) -> str:
    found = DOCUMENTED.fullmatch(task_id)
    return task_id if found is None else found.group(1)


@given(SCHEDULE_IDS, st.integers(0, MAX_NOMINAL_MS))
def test_an_occurrence_id_parses_back_and_shares_its_schedules_partition(
    schedule_id: str, nominal_ms: int
) -> None:
    task_id = occurrence_id(schedule_id, nominal_ms)
    assert parse_occurrence(task_id) == (schedule_id, nominal_ms)
    assert partition_key(task_id) == schedule_id == partition_key(record_key(schedule_id))
    assert not is_record_key(task_id)
    assert is_record_key(record_key(schedule_id))
    found = occurrence(task_id, None)
    assert found is not None and found.id == task_id
    assert (found.schedule_id, found.nominal_ms) == (schedule_id, nominal_ms)


def test_occurrence_ids_write_the_seconds_as_the_schedule_map_does() -> None:
    assert occurrence_id("daily", 1_767_571_200_000) == "s:daily:1767571200"
    assert occurrence_id("fast", 1_767_571_200_250) == "s:fast:1767571200.25"
    assert occurrence_id("a:b", 5) == "s:a:b:0.005"
    assert occurrence_id("x", 0) == "s:x:0"  # never 00, the record's key
    assert record_key("x") == "s:x:00"
    assert parse_occurrence("s:a:b:1774746000") == ("a:b", 1774746000_000)  # to the last colon


@pytest.mark.parametrize(
    ("task_id", "key", "parsed"),
    [
        ("plain", "plain", None),
        ("s:", "s:", None),
        ("s:x", "s:x", None),
        ("s:x:", "s:x:", None),
        ("s::12", "", None),  # the rule hashes an empty X; no schedule has it
        ("s:x:12a", "s:x:12a", None),
        ("s:x:1.", "s:x:1.", None),
        ("s:x:.5", "s:x:.5", None),
        ("s:x:1.2.3", "s:x:1.2.3", None),
        ("s:x:1.2345", "x", None),  # the rule takes any fraction; a time has ms
        ("s:x:1234567890123", "x", None),  # 13 digits: no calendar time
        ("s:x:253370764800", "x", None),  # past MAX_NOMINAL_MS
        ("s:x:253370764799.999", "x", ("x", MAX_NOMINAL_MS)),
        ("s:x:²", "s:x:²", None),  # a digit to str.isdigit, not ASCII
        ("s:x:٣", "s:x:٣", None),
        ("s:x:1\n", "s:x:1\n", None),
        ("s:\n:1", "\n", ("\n", 1000)),
        ("S:x:1", "S:x:1", None),
        ("x:s:x:1", "x:s:x:1", None),
        ("s:x:00", "x", ("x", 0)),  # a record key reads as a time; is_record_key tells
    ],
)
def test_hostile_ids(task_id: str, key: str, parsed: tuple[str, int] | None) -> None:
    assert partition_key(task_id) == key == documented_key(task_id)
    assert parse_occurrence(task_id) == parsed


@given(HOSTILE)
def test_the_rule_is_the_documented_one_on_any_id(task_id: str) -> None:
    assert partition_key(task_id) == documented_key(task_id)
    assert partition_of(task_id, 16) == zlib.crc32(documented_key(task_id).encode()) % 16
    # The server reads an occurrence where the clients route it: in its schedule's partition.
    found = occurrence(task_id, None)
    if found is not None:
        assert found.schedule_id == partition_key(task_id) != ""
        # "s:x:01.50" names the time "s:x:1.5" does: its id is written that way.
        assert parse_occurrence(found.id) == (found.schedule_id, found.nominal_ms)


def test_one_occurrence_class_for_firing_and_reading_back() -> None:
    planned = Occurrence("nightly", 1774746000_000, fire_at_ms=1774746000_250)
    assert planned.id == "s:nightly:1774746000"
    assert planned.nominal_utc == "2026-03-29T01:00:00Z"
    assert planned.nominal_local == "2026-03-29T01:00:00+00:00"  # no spec: UTC
    assert occurrence(planned.id, None) == Occurrence("nightly", 1774746000_000)
