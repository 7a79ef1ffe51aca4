"""The target options of ``delaywheel add`` and ``update``, against a real server.

The server (one per module) has a Redis store, so ``store`` is a broker, plus a Redis
broker ``r`` (the same Redis), a RabbitMQ broker ``q`` and a NATS broker ``n`` (both run
on this machine: a test of the server skips when either does not answer, see
tests/services.py), and lets HTTP targets point at 127.0.0.1. Tasks are added an hour
ahead, so nothing is delivered: each test reads the target back with ``get`` and
compares it with the normalized map the server keeps, or with the line that ``get``
shows of it in text. The usage errors are caught before any connection, so they run
against an address where nothing listens: reaching the network would exit 3, not 2.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from conftest import free_port
from helpers import cli as run
from helpers import cli_json as run_json
from helpers import unique
from targetserver import server as server  # the module's server

from delaywheel.cli.output import task_text

HOOK = f"http://127.0.0.1:{free_port()}/hook"  # nothing listens: never called an hour ahead
NOWHERE = f"127.0.0.1:{free_port()}"


def http_target(**changes: Any) -> dict[str, Any]:
    defaults = {"type": "http", "url": HOOK, "method": "POST", "headers": {}, "timeout": 10.0}
    return {**defaults, **changes}


ALL_HTTP_OPTIONS = ["--http", HOOK, "--method", "put", "--http-timeout", "2.5"]
ALL_HTTP_OPTIONS += ["--header", "X-Token:  abc ", "--header", "X-Next:http://a.example:8080/x"]
NATS_JSON = '{"type": "nats", "broker": "n", "subject": "s"}'

# Options -> the target the server keeps, every field present.
TARGETS = {
    "http": (["--http", HOOK], http_target()),
    "http-all-options": (
        ALL_HTTP_OPTIONS,
        http_target(
            method="PUT",
            timeout=2.5,
            headers={"X-Token": "abc", "X-Next": "http://a.example:8080/x"},
        ),
    ),
    "http-timeout-duration": (["--http", HOOK, "--http-timeout", "1m"], http_target(timeout=60.0)),
    "redis-list": (
        ["--redis-list", "jobs"],
        {"type": "redis", "key": "jobs", "mode": "list", "broker": "store"},
    ),
    "redis-stream-store": (
        ["--redis-stream", "events", "--broker", "store"],
        {"type": "redis", "key": "events", "mode": "stream", "broker": "store"},
    ),
    "redis-stream": (
        ["--redis-stream", "events", "--broker", "r"],
        {"type": "redis", "key": "events", "mode": "stream", "broker": "r"},
    ),
    "amqp": (
        ["--amqp", "work", "--broker", "q"],
        {"type": "amqp", "broker": "q", "exchange": "", "routing_key": "work"},
    ),
    "amqp-exchange": (
        ["--amqp", "work", "--broker", "q", "--exchange", "amq.direct"],
        {"type": "amqp", "broker": "q", "exchange": "amq.direct", "routing_key": "work"},
    ),
    "nats": (
        ["--nats", "jobs.due", "--broker", "n"],
        {"type": "nats", "broker": "n", "subject": "jobs.due"},
    ),
    "target-json": (["--target", NATS_JSON], {"type": "nats", "broker": "n", "subject": "s"}),
}
IDS = list(TARGETS)


@pytest.mark.parametrize(("args", "expected"), TARGETS.values(), ids=IDS)
def test_add_option_makes_its_target(address: str, args: list[str], expected: Any) -> None:
    added = run_json(address, "add", "--topic", unique(), "--delay", "3600", *args)
    task = run_json(address, "get", added["id"])
    assert task["target"] == expected
    assert task["state"] == "delayed"


@pytest.mark.parametrize(("args", "expected"), TARGETS.values(), ids=IDS)
def test_update_option_changes_the_target(address: str, args: list[str], expected: Any) -> None:
    added = run_json(address, "add", "--topic", unique(), "--delay", "3600")
    updated = run_json(address, "update", added["id"], *args)
    assert updated["target"] == expected
    assert run_json(address, "get", added["id"])["target"] == expected


# What `get` shows on its target row for the same options (no header values: they
# may be credentials).
TEXTS = {
    "http": f"http POST {HOOK}",
    "http-all-options": f"http PUT {HOOK}",
    "http-timeout-duration": f"http POST {HOOK}",
    "redis-list": "redis list jobs, broker store",
    "redis-stream-store": "redis stream events, broker store",
    "redis-stream": "redis stream events, broker r",
    "amqp": "amqp routing key work, default exchange, broker q",
    "amqp-exchange": "amqp routing key work, exchange amq.direct, broker q",
    "nats": "nats subject jobs.due, broker n",
    "target-json": "nats subject s, broker n",
}
assert list(TEXTS) == IDS


def target_row(address: str, task_id: str) -> str:
    shown = run(address, "get", task_id)
    assert shown.exit_code == 0, shown.stderr
    [row] = [line for line in shown.stdout.splitlines() if line.startswith("target:")]
    return row.removeprefix("target:").strip()


@pytest.mark.parametrize(("args", "text"), [(TARGETS[i][0], TEXTS[i]) for i in IDS], ids=IDS)
def test_get_shows_where_the_target_points(address: str, args: list[str], text: str) -> None:
    added = run_json(address, "add", "--topic", unique(), "--delay", "3600", *args)
    assert target_row(address, added["id"]) == text


def test_get_quotes_a_name_that_is_not_one_word(address: str) -> None:
    args = ["--amqp", "a b, exchange x", "--broker", "q"]
    added = run_json(address, "add", "--topic", unique(), "--delay", "1h", *args)
    expected = 'amqp routing key "a b, exchange x", default exchange, broker q'
    assert target_row(address, added["id"]) == expected


def test_a_target_kind_newer_than_the_cli_is_shown_with_its_fields() -> None:
    task = {"id": "x", "target": {"type": "kafka", "broker": "k", "topic": "due"}}
    [row] = [line for line in task_text(task).splitlines() if line.startswith("target:")]
    assert row.removeprefix("target:").strip() == 'kafka {"broker": "k", "topic": "due"}'


def test_update_back_to_the_ready_queue(address: str) -> None:
    added = run_json(address, "add", "--topic", unique(), "--delay", "3600", "--redis-list", "k")
    updated = run_json(address, "update", added["id"], "--target", '{"type": "queue"}')
    assert updated["target"] == {"type": "queue"}


def test_readable_add_with_a_target(address: str) -> None:
    result = run(address, "add", "--topic", unique(), "--delay", "1h", "--http", HOOK)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("added ")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--http", HOOK, "--redis-list", "k"], "--http and --redis-list"),
        (["--target", '{"type": "queue"}', "--nats", "s"], "--target and --nats"),
        (["--redis-stream", "k", "--amqp", "rk", "--broker", "q"], "--redis-stream and --amqp"),
        (["--method", "PUT"], "--method goes with --http"),
        (["--redis-list", "k", "--header", "A: b"], "--header goes with --http"),
        (
            ["--nats", "s", "--broker", "n", "--http-timeout", "3"],
            "--http-timeout goes with --http",
        ),
        (["--http", HOOK, "--header", "X-Token abc"], "'X-Token abc' has no colon"),
        (["--http", HOOK, "--header", "A: 1", "--header", "a: 2"], "'a' given twice"),
        (["--http", HOOK, "--method", "FETCH"], "'FETCH' is not one of GET, POST"),
        (["--http", HOOK, "--http-timeout", "soon"], "bad duration 'soon'"),
        (["--nats", "s", "--broker", "n", "--exchange", "e"], "--exchange goes with --amqp"),
        (["--exchange", "e"], "--exchange goes with --amqp"),
        (["--broker", "q"], "--broker goes with"),
        (["--http", HOOK, "--broker", "q"], "--broker goes with"),
        (["--target", '{"type": "queue"}', "--broker", "q"], "--broker goes with"),
        (["--amqp", "rk"], "--amqp needs --broker"),
        (["--nats", "s"], "--nats needs --broker"),
        (["--target", "{nope"], "'--target': not JSON"),
        (["--target", "null"], "'--target': must be a JSON object"),
    ],
)
@pytest.mark.parametrize("command", ["add", "update"])
def test_usage_errors_exit_2_naming_the_option(command: str, args: list[str], needle: str) -> None:
    head = ["add", "--topic", "t"] if command == "add" else ["update", "some-id"]
    result = run(NOWHERE, *head, *args)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert needle in lines[0]
    assert lines[0].startswith(f"delaywheel {command}: ")
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--http", "http://10.1.2.3/hook"], "10.1.2.3"),
        (["--amqp", "rk", "--broker", "nosuch"], "nosuch"),
        (["--nats", "s", "--broker", "q"], "'q'"),  # a broker of another kind
    ],
)
def test_server_refusals_exit_2_naming_the_target(
    address: str, args: list[str], needle: str
) -> None:
    result = run(address, "add", "--topic", unique(), "--delay", "1h", *args)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert result.stderr.startswith("bad request:")
    assert needle in result.stderr


def test_dead_targeted_task_is_listed_and_kicked(address: str) -> None:
    """``list --state dead`` and ``kick`` need nothing new: an HTTP target that
    refuses connections uses its one attempt and is dead, with ``last_error``."""
    topic = unique()
    dead = f"http://127.0.0.1:{free_port()}/gone"
    added = run_json(address, "add", "--topic", topic, "--http", dead, "--max-attempts", "1")
    deadline = time.monotonic() + 20
    while (task := run_json(address, "get", added["id"]))["state"] != "dead":
        assert time.monotonic() < deadline, f"task never went dead: {task}"
        time.sleep(0.05)
    assert isinstance(task["last_error"], str) and task["last_error"]
    assert task["attempts"] == 1

    listed = run_json(address, "list", "--state", "dead", "--topic", topic)
    assert [t["id"] for t in listed["tasks"]] == [added["id"]]
    table = run(address, "list", "--state", "dead", "--topic", topic)
    assert added["id"] in table.stdout and " dead " in table.stdout
    # The README says "with last_error": the table has the column, the error's start.
    header, row = table.stdout.splitlines()
    assert header.split() == ["ID", "TOPIC", "STATE", "PRI", "DUE", "ATTEMPTS", "LAST", "ERROR"]
    assert " ".join(task["last_error"].split())[:40] in row
    shown = run(address, "get", added["id"])
    assert shown.exit_code == 0 and "last_error:" in shown.stdout

    kicked = run(address, "kick", topic, "--count", "5")
    assert (kicked.exit_code, kicked.stdout.strip()) == (0, f"kicked 1 task of {topic}")
    # Kicked, it is tried again and fails again: dead once more, it can be kicked again.
    deadline = time.monotonic() + 20
    while run_json(address, "kick", topic) != 1:
        assert time.monotonic() < deadline, "the kicked task was never tried again"
        time.sleep(0.05)
