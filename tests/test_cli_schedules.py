"""``delaywheel schedule next``: an unsaved spec previewed offline (docs/schedules.md)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

from delaywheel.cli import main


def run(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(main, list(args))


def next_json(*args: str) -> dict[str, Any]:
    result = run("--json", "schedule", "next", *args)
    assert result.exit_code == 0, result.output
    reply: dict[str, Any] = json.loads(result.output)
    return reply


def test_next_shows_the_london_autumn_night_once() -> None:
    result = run(
        "schedule", "next", "--cron", "30 1 * * *", "--tz", "Europe/London",
        "-n", "3", "--from", "2025-10-25T12:00:00Z",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        "At 01:30 every day (Europe/London; DST by Debian cron's rule)",
        "2025-10-26T01:30:00+01:00  (1761438600)",
        "2025-10-27T01:30:00+00:00  (1761528600)",
        "2025-10-28T01:30:00+00:00  (1761615000)",
    ]


def test_next_as_json_is_the_schedule_next_reply() -> None:
    reply = next_json(
        "--cron", "30 2 * * *", "--tz", "America/New_York", "-n", "2",
        "--from", "2025-03-08T12:00:00Z",
    )  # fmt: skip
    assert [t["local"] for t in reply["times"]] == [
        "2025-03-09T03:00:00-04:00",  # 02:30 is in the gap: the first instant after it
        "2025-03-10T02:30:00-04:00",
    ]
    assert reply["times"][0]["utc"] == 1741503600
    assert reply["description"].startswith("At 02:30 every day")


def test_next_every_counts_from_the_anchor() -> None:
    reply = next_json(
        "--every", "15m", "--anchor", "2026-01-01T00:05:00Z", "-n", "2",
        "--from", "2026-01-01T00:07:00Z",
    )  # fmt: skip
    assert [t["local"] for t in reply["times"]] == [
        "2026-01-01T00:20:00+00:00",
        "2026-01-01T00:35:00+00:00",
    ]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--cron", "0 25 * * *"], "bad hour field '25' at position 3"),
        (["--cron", "0 1 * * *", "--tz", "EST"], "tz must be an IANA zone name"),
        ([], "exactly one of cron"),
        (["--every", "1h", "--tz", "Europe/London"], "tz is for cron"),
        (["--every", "1h", "-n", "0"], "-n"),
    ],
)
def test_next_refusals_are_one_line_usage_errors(args: list[str], needle: str) -> None:
    result = run("schedule", "next", *args)
    assert result.exit_code == 2, result.output
    assert needle in result.output
    assert "Traceback" not in result.output
