"""``delaywheel schedule ...``: ``next`` of an unsaved spec offline, and the
commands that call the server's schedule methods, against a real server
process (docs/schedules.md, docs/cli.md)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest
from click.testing import CliRunner, Result
from helpers import cli as on
from helpers import cli_json as on_json
from helpers import unique
from serverproc import ServerProcess

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
        # The zone's time with its offset, then UTC (the README says "local and UTC").
        "2025-10-26T01:30:00+01:00  (2025-10-26T00:30:00Z)",
        "2025-10-27T01:30:00+00:00  (2025-10-27T01:30:00Z)",
        "2025-10-28T01:30:00+00:00  (2025-10-28T01:30:00Z)",
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


def test_the_cli_offers_the_servers_policies() -> None:
    from delaywheel.cli import schedules
    from delaywheel.schedules import spec

    assert schedules.CATCHUP_POLICIES == spec.CATCHUP_POLICIES
    assert schedules.OVERLAP_POLICIES == spec.OVERLAP_POLICIES
    fields = {name.replace("-", "_") for name in schedules.OPTIONAL_FIELDS}
    assert fields <= spec.CHANGE_FIELDS


# -- against a real server ------------------------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    # HTTP targets on this machine are allowed, so a template may name one.
    proc = ServerProcess("--http-allow", "127.0.0.1")
    yield proc
    proc.stop()


def failed(result: Result, exit_code: int) -> str:
    """The one line on stderr of a command that failed with ``exit_code``."""
    assert result.exit_code == exit_code, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def test_add_takes_every_field_and_get_shows_them(address: str) -> None:
    sid = unique("full")
    added = on_json(
        address, "schedule", "add", sid, "--cron", "30 1 * * *", "--tz", "Europe/London",
        "--topic", "reports", "--json-body", '{"kind": "nightly"}', "--ttr", "2m",
        "--max-attempts", "4", "--http", "http://127.0.0.1:9/hook", "--start-at",
        "2030-01-01T00:00:00Z", "--end-at", "2031-01-01T00:00:00Z", "--max-runs", "30",
        "--jitter", "1m30s", "--catchup", "all", "--catchup-window", "2h",
        "--overlap", "buffer_one",
    )  # fmt: skip
    start, end = 1893456000, 1924992000  # 2030-01-01, 2031-01-01 (UTC)
    expected = {
        "id": sid, "cron": "30 1 * * *", "tz": "Europe/London", "topic": "reports",
        "body": {"kind": "nightly"}, "ttr": 120, "max_attempts": 4, "start_at": start,
        "end_at": end, "max_runs": 30, "jitter": 90, "catchup": "all",
        "catchup_window": 7200, "overlap": "buffer_one", "version": 1, "paused": False,
    }  # fmt: skip
    assert {key: added[key] for key in expected} == expected
    assert added["target"]["url"] == "http://127.0.0.1:9/hook"
    assert added["next"] == start + 5400  # 01:30 GMT on the first day
    assert on_json(address, "schedule", "get", sid) == added

    text = on(address, "schedule", "get", sid)
    assert text.exit_code == 0, text.stderr
    *rows, label, opened, body, closed = text.stdout.splitlines()
    shown = dict(row.split(":", 1) for row in rows)
    assert {name: value.strip() for name, value in shown.items() if name != "next"} == {
        "id": sid, "spec": "cron '30 1 * * *' Europe/London", "topic": "reports",
        "last fired": "never", "counts": "fired 0, skipped 0, missed 0", "paused": "no",
        "version": "1", "policies": "catchup all (window 2h), overlap buffer_one, jitter 1m30s",
        "start at": shown["start at"].strip(), "end at": shown["end at"].strip(),
        "max runs": "30", "ttr": "2m", "max attempts": "4",
        "target": "http POST http://127.0.0.1:9/hook",
    }  # fmt: skip
    assert [label, opened, body, closed] == ["body (json):", "{", '  "kind": "nightly"', "}"]


def test_update_pause_resume_delete(address: str) -> None:
    sid = unique("edit")
    added = on(address, "schedule", "add", sid, "--every", "1h", "--topic", "t", "--jitter", "5")
    assert added.exit_code == 0, added.stderr
    assert added.stdout.startswith(f"added schedule {sid}, next ")

    updated = on_json(
        address, "schedule", "update", sid, "--every", "10m", "--unset", "jitter",
        "--max-runs", "3", "--expected-version", "1",
    )  # fmt: skip
    assert (updated["every"], updated["jitter"], updated["max_runs"]) == (600, 0, 3)
    assert updated["version"] == 2 and updated["next"] % 600 == 0
    stale = on(address, "schedule", "update", sid, "--jitter", "1", "--expected-version", "1")
    assert failed(stale, 1) == f"conflict: schedule {sid!r} is at version 2, not expected_version 1"
    assert "nothing to update" in failed(on(address, "schedule", "update", sid), 2)

    paused = on(address, "schedule", "pause", sid, "--note", "deploy")
    assert (paused.exit_code, paused.stdout) == (0, f"paused schedule {sid}\n")
    state = on_json(address, "schedule", "get", sid)
    assert (state["paused"], state["note"], state["next"]) == (True, "deploy", None)
    listed = on_json(address, "schedule", "list", "--paused", "--topic", "t")
    assert sid in [s["id"] for s in listed["schedules"]]
    active = on_json(address, "schedule", "list", "--active")
    assert sid not in [s["id"] for s in active["schedules"]]

    resumed = on_json(address, "schedule", "resume", sid)
    assert not resumed["paused"] and resumed["next"] > time.time()
    nxt = on_json(address, "schedule", "next", sid, "-n", "2")
    assert [t["utc"] for t in nxt["times"]] == [resumed["next"], resumed["next"] + 600]

    deleted = on(address, "schedule", "delete", sid)
    assert (deleted.exit_code, deleted.stdout) == (0, f"deleted schedule {sid}\n")
    for command in ("delete", "get", "pause", "resume", "trigger", "next"):
        assert failed(on(address, "schedule", command, sid), 1) == f"not found: {sid}"


def test_list_pages_with_a_cursor_or_all(address: str) -> None:
    topic = unique("paged")
    ids = sorted(unique("p") for _ in range(5))
    for sid in ids:
        assert on(address, "schedule", "add", sid, "--every", "1h", "--topic", topic).exit_code == 0
    first = on(address, "schedule", "list", "--topic", topic, "--limit", "2")
    assert first.exit_code == 0, first.stderr
    table = first.stdout.splitlines()
    assert table[0].split() == ["ID", "SPEC", "TOPIC", "NEXT", "FIRED", "PAUSED"]
    assert [row.split()[0] for row in table[1:]] == ids[:2]
    assert first.stderr.strip() == (
        f"more schedules: use --all, or --cursor {ids[1]} for the next page"
    )
    second = on_json(address, "schedule", "list", "--topic", topic, "--limit", "2",
                     "--cursor", ids[1])  # fmt: skip
    assert [s["id"] for s in second["schedules"]] == ids[2:4] and second["next"] == ids[3]
    every = on_json(address, "schedule", "list", "--topic", topic, "--limit", "2", "--all")
    assert [s["id"] for s in every["schedules"]] == ids and every["next"] is None


def test_trigger_and_backfill_put_occurrences(address: str) -> None:
    sid, topic = unique("fill"), unique("ft")
    assert on(address, "schedule", "add", sid, "--every", "1m", "--topic", topic).exit_code == 0
    triggered = on_json(address, "schedule", "trigger", sid)
    assert triggered["id"].startswith(f"s:{sid}:")
    assert on_json(address, "get", triggered["id"])["topic"] == topic

    now = int(time.time())
    start = now // 60 * 60 - 120
    iso = datetime.fromtimestamp(start, timezone.utc).isoformat()
    filled = on(address, "schedule", "backfill", sid, iso, "now")
    assert filled.exit_code == 0, filled.stderr
    expected = [f"s:{sid}:{start + 60 * k}" for k in range(3)]
    assert filled.stdout.splitlines() == ["backfilled 3, 0 already present", *expected]
    again = on_json(address, "schedule", "backfill", sid, iso, "now")
    assert again == {"ids": [], "existing": 3}


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (["add", "x", "--cron", "0 25 * * *", "--topic", "t"], 2, "bad hour field '25'"),
        (["add", "x", "--every", "1m"], 2, "Missing option '--topic'"),
        (["add", "x", "--every", "1m", "--topic", "t", "--catchup", "most"], 2, "'most'"),
        (["add", "x", "--every", "soon", "--topic", "t"], 2, "'soon'"),
        (["add", "x", "--every", "1m", "--topic", "t", "--body", "a", "--json-body", "1"], 2,
         "--body"),
        (["update", "x", "--jitter", "1", "--unset", "jitter"], 2, "--unset jitter"),
        (["next", "x", "--every", "1m"], 2, "not both (--every)"),
        (["backfill", "x", "yesterday", "now"], 2, "'yesterday'"),
    ],
)  # fmt: skip
def test_refusals_are_one_line(address: str, args: list[str], code: int, needle: str) -> None:
    assert needle in failed(on(address, "schedule", *args), code)


def test_a_real_process_adds_and_lists(address: str) -> None:
    """The README's example, as typed: python -m delaywheel in a process of its own."""
    sid = unique("proc")
    done = subprocess.run(
        [sys.executable, "-m", "delaywheel", "--server", address, "schedule", "add", sid,
         "--every", "15m", "--topic", "emails", "--body", "digest", "--catchup", "skip"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"added schedule {sid}, next ")
    state = on_json(address, "schedule", "get", sid)
    assert (state["every"], state["body"], state["catchup"]) == (900, "digest", "skip")
