"""The ``delaywheel`` command, end to end against a real server.

One server per module (``serverproc.ServerProcess``). A few flows run the CLI as a real
subprocess (``python -m delaywheel``); the rest use click's CliRunner, which runs the same
command code in-process against the same server.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from helpers import cli, cli_json, unique
from serverproc import ServerProcess, free_port

from delaywheel.cli import main

ROOT = Path(__file__).resolve().parent.parent


def proc(
    *args: str, input: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m delaywheel ARGS`` as a real process."""
    return subprocess.run(
        [sys.executable, "-m", "delaywheel", *args],
        input=input,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


def one_line(stderr: str) -> str:
    """The failure message: exactly one line, no traceback."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


# -- real subprocesses ------------------------------------------------------------------------


def test_process_add_get_delete_with_json(address: str) -> None:
    task_id, topic = unique("id"), unique()
    done = proc(
        "--server",
        address,
        "--json",
        "add",
        "--topic",
        topic,
        "--delay",
        "1h",
        "--body",
        "hello",
        "--id",
        task_id,
    )
    assert done.returncode == 0, done.stderr
    added = json.loads(done.stdout)
    assert added["id"] == task_id
    assert added["at"] == pytest.approx(time.time() + 3600, abs=30)
    assert {"cycle", "slot"} <= added.keys()

    done = proc("--server", address, "--json", "get", task_id)
    assert done.returncode == 0, done.stderr
    task = json.loads(done.stdout)
    assert (task["topic"], task["state"], task["body"]) == (topic, "delayed", "hello")

    done = proc("--server", address, "delete", task_id)
    assert (done.returncode, done.stdout.strip()) == (0, f"deleted {task_id}")

    for command in ("get", "delete"):
        done = proc("--server", address, command, task_id)
        assert done.returncode == 1
        assert done.stdout == ""
        assert one_line(done.stderr) == f"not found: {task_id}"


def test_process_reserve_then_ack(address: str) -> None:
    topic = unique()
    done = proc("--server", address, "add", "--topic", topic, "--body", "work me")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("added ")
    task_id = done.stdout.split()[1].rstrip(",")

    done = proc("--server", address, "reserve", topic, "--timeout", "5s")
    assert done.returncode == 0, done.stderr
    assert "id:" in done.stdout and task_id in done.stdout
    assert "state:" in done.stdout and "reserved" in done.stdout
    assert done.stdout.rstrip().endswith("work me")  # the body, printed last

    done = proc("--server", address, "ack", task_id)
    assert (done.returncode, done.stdout.strip()) == (0, f"acked {task_id}")
    assert proc("--server", address, "get", task_id).returncode == 1


def test_process_server_from_env_and_unreachable_exits_3(address: str) -> None:
    done = proc("ping", env={"DELAYWHEEL_SERVER": address})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("pong")

    dead = f"127.0.0.1:{free_port()}"
    done = proc("get", "x", env={"DELAYWHEEL_SERVER": dead})
    assert done.returncode == 3
    assert done.stdout == ""
    assert one_line(done.stderr).startswith("cannot reach the server")


@pytest.mark.process
def test_process_serve_bad_setting_exits_2_with_one_line() -> None:
    done = proc("serve", "--store", "memory://", "--tick", "0")
    assert done.returncode == 2
    line = one_line(done.stderr)
    assert line.startswith("delaywheel serve:") and "tick" in line

    done = proc("serve", "--store", "memory://", env={"DELAYWHEEL_MAX_CONNECTIONS": "0"})
    assert done.returncode == 2
    assert "max connections" in one_line(done.stderr)


@pytest.mark.process
@pytest.mark.parametrize("value", ["bogus", "public,publc", "127.0.0.1,no-such-host.invalid"])
def test_process_serve_refuses_an_http_allow_entry_that_is_nothing(value: str) -> None:
    """Neither public, *, an address, a range, a *.suffix nor a name DNS knows."""
    done = proc("serve", "--store", "memory://", "--port", "0", "--http-allow", value)
    assert done.returncode == 2
    line = one_line(done.stderr)
    bad = value.rsplit(",", 1)[-1]
    assert f"--http-allow entry {bad!r} is not public" in line and "resolves" in line


# -- help, usage errors ------------------------------------------------------------------------


STORE_URL_FORMS = ("redis://", "rediss://", "redis+sentinel://", "sqlite:///", "memory://")


def test_every_store_url_form_is_named_by_serve_help_the_operations_guide_and_the_readme() -> None:
    """An operator finds each form where they look first (issue 35: the help and
    the guide's table left out rediss:// and redis+sentinel://)."""
    result = CliRunner().invoke(main, ["serve", "--help"], terminal_width=200)
    assert result.exit_code == 0
    help_text = " ".join(result.output.split())
    operations = (ROOT / "docs" / "operations.md").read_text()
    store_row = next(line for line in operations.splitlines() if line.startswith("| `--store`"))
    durability = (ROOT / "README.md").read_text().split("## Durability", 1)[1].split("##", 1)[0]
    for form in STORE_URL_FORMS:
        assert form in help_text, form
        assert form in store_row, form
        assert form.rstrip("/") in durability, form


def test_a_bad_flag_is_reported_as_the_flag_and_a_bad_variable_as_the_variable() -> None:
    """click names the variable for every bad value of an option that has one;
    ours names it only when the value came from it."""
    by_flag = CliRunner().invoke(main, ["--server", "127.0.0.1:notaport", "get", "x"])
    assert by_flag.exit_code == 2
    assert "Invalid value for '--server': expected HOST:PORT" in by_flag.stderr
    assert "DELAYWHEEL_SERVER" not in by_flag.stderr
    env = {"DELAYWHEEL_SERVER": "127.0.0.1:notaport"}
    by_variable = CliRunner().invoke(main, ["get", "x"], env=env)
    assert by_variable.exit_code == 2
    assert "(env var: 'DELAYWHEEL_SERVER')" in by_variable.stderr
    serve_flag = CliRunner().invoke(main, ["serve", "--port", "notaport"])
    assert serve_flag.exit_code == 2 and "DELAYWHEEL_PORT" not in serve_flag.stderr


def test_serve_help_puts_every_option_in_one_section_each_described() -> None:
    from delaywheel.cli.serve import HELP_SECTIONS, serve

    named = [name for names in HELP_SECTIONS.values() for name in names]
    options = [max(p.opts, key=len) for p in serve.params if isinstance(p, click.Option)]
    assert sorted(named) == sorted(options)  # each once, none left in "Other options"
    assert all(p.help for p in serve.params if isinstance(p, click.Option)), "an option has no help"
    result = CliRunner().invoke(main, ["serve", "--help"])
    assert result.exit_code == 0
    for title in HELP_SECTIONS:
        assert f"\n{title}:\n" in result.output
    assert "Other options:" in result.output  # --help alone
    assert "The least severe level logged." in result.output


@pytest.mark.process
def test_version_flag_and_shell_completion() -> None:
    from delaywheel import __version__

    for flag in ("-V", "--version"):
        result = CliRunner().invoke(main, [flag])
        assert (result.exit_code, result.output) == (0, f"delaywheel, version {__version__}\n")
    # docs/cli.md's completion line, as bash would run it (the installed command:
    # click names the variable after the program, `_DELAYWHEEL_COMPLETE`).
    env = {**os.environ, "_DELAYWHEEL_COMPLETE": "bash_source"}
    command = str(Path(sys.executable).parent / "delaywheel")
    done = subprocess.run([command], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert "complete -o nosort -F" in done.stdout and "_DELAYWHEEL_COMPLETE" in done.stdout
    docs = (ROOT / "docs" / "cli.md").read_text()
    assert 'eval "$(_DELAYWHEEL_COMPLETE=bash_source delaywheel)"' in docs


def test_serve_help_lists_the_env_vars() -> None:
    result = CliRunner().invoke(main, ["serve", "--help"])
    assert result.exit_code == 0
    for name in (
        "HOST",
        "PORT",
        "STORE",
        "REDIS_PREFIX",
        "SLOTS",
        "TICK",
        "TOKEN",
        "MAX_MESSAGE",
        "MAX_BODY",
        "MAX_CONNECTIONS",
        "LOG_LEVEL",
    ):
        assert f"DELAYWHEEL_{name}" in result.stdout, name


# The cluster options (issue 16), each as its flag and as its variable.
CLUSTER_OPTIONS = (
    ("--node", "DELAYWHEEL_NODE", "n1"),
    ("--advertise", "DELAYWHEEL_ADVERTISE", "h:3450"),
    ("--partitions", "DELAYWHEEL_PARTITIONS", "8"),
    ("--lease", "DELAYWHEEL_LEASE", "1500ms"),  # a duration, as the issue writes it
    ("--replicas", "DELAYWHEEL_REPLICAS", "1"),
)


@pytest.fixture
def logging_restored() -> Iterator[None]:
    """``serve`` in this process configures logging (root handlers and level, the
    drivers' levels): put it back, or later tests' log captures see more."""
    from delaywheel.logs import CHATTY_DRIVERS

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    drivers = {name: logging.getLogger(name).level for name in CHATTY_DRIVERS}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, driver_level in drivers.items():
        logging.getLogger(name).setLevel(driver_level)


@pytest.mark.usefixtures("logging_restored")
@pytest.mark.parametrize("store", ["memory://", "sqlite:///never-made.db"])
@pytest.mark.parametrize(("flag", "variable", "value"), CLUSTER_OPTIONS)
def test_cluster_options_by_flag_or_variable_on_a_single_node_store_are_a_usage_error(
    store: str, flag: str, variable: str, value: str, tmp_path: Path
) -> None:
    url = store.replace("never-made.db", str(tmp_path / "never-made.db"))
    by_flag = CliRunner().invoke(main, ["serve", "--store", url, flag, value])
    by_variable = CliRunner().invoke(main, ["serve", "--store", url], env={variable: value})
    for result in (by_flag, by_variable):
        assert result.exit_code == 2, result.output
        message = " ".join(result.output.split())
        assert f"{flag}: several nodes share a Redis keyspace only" in message, message
        assert "serves one node" in message
    assert not (tmp_path / "never-made.db").exists()  # refused before the store opens
    result = CliRunner().invoke(main, ["serve", "--help"])
    assert variable in result.stdout


def test_a_nodes_name_address_lease_and_partitions_default_and_can_be_given() -> None:
    """--node: host name and port; --advertise: the listen address, or the host
    name for 0.0.0.0; --lease 10 s, --partitions 16; each given one is used."""
    from delaywheel.app import shared_store
    from delaywheel.config import Settings

    host = socket.gethostname()
    url = "redis://127.0.0.1:1/0"  # nothing connects

    def sharing(**given: Any) -> tuple[str, str, float, int]:
        settings = Settings(store_url=url, **given)
        keyspace = shared_store(settings)[1]
        assert keyspace is not None
        made = keyspace.sharing
        return made.node, made.address, made.lease_s, made.partitions

    anywhere = sharing(host="0.0.0.0", port=3450, token="t")
    assert anywhere == (f"{host}:3450", f"{host}:3450", 10.0, 16)
    assert sharing(host="127.0.0.1", port=3451) == (f"{host}:3451", "127.0.0.1:3451", 10.0, 16)
    given = {"node": "n1", "advertise": "dw-1.example:7711", "lease_s": 4.0, "partitions": 8}
    assert sharing(port=3450, **given) == ("n1", "dw-1.example:7711", 4.0, 8)


@pytest.mark.usefixtures("logging_restored")
def test_the_lease_takes_a_duration_and_names_a_bad_one() -> None:
    result = CliRunner().invoke(main, ["serve", "--store", "memory://", "--lease", "ten"])
    assert result.exit_code == 2
    assert "--lease" in result.output and "'ten'" in result.output


@pytest.mark.parametrize(("lease", "named"), [("0.4", "got 0.4"), ("601", "got 601.0")])
def test_a_lease_outside_half_a_second_to_600_s_is_a_usage_error(lease: str, named: str) -> None:
    # Refused before the store is opened: nothing listens on port 1.
    store = "redis://127.0.0.1:1/0"
    result = CliRunner().invoke(main, ["serve", "--store", store, "--lease", lease])
    assert result.exit_code == 2, result.output
    assert "lease must be 0.5 to 600.0 s" in result.output and named in result.output


def test_group_help_documents_env_vars_exit_codes_and_bin_wrapper() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    for needle in (
        "DELAYWHEEL_SERVER",
        "DELAYWHEEL_TOKEN",
        "DELAYWHEEL_JSON",
        "DELAYWHEEL_TIMEOUT",
        '"$bin"',
        "Exit codes",
    ):
        assert needle in text, needle
    for command in (
        "add",
        "update",
        "delete",
        "get",
        "list",
        "stats",
        "reserve",
        "ack",
        "release",
        "kick",
        "ping",
        "touch",
        "import",
        "serve",
    ):
        assert CliRunner().invoke(main, [command, "--help"]).exit_code == 0, command
    import_help = " ".join(CliRunner().invoke(main, ["import", "--help"]).stdout.split())
    assert "batches before it HAVE been added" in import_help


def test_version() -> None:
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0 and "delaywheel" in result.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["add"], "Missing option '--topic'"),
        (["add", "--topic", "t", "--delay", "5x"], "bad duration '5x'"),
        (["add", "--topic", "t", "--delay", "-5s"], "negative duration"),
        (["add", "--topic", "t", "--at", "someday"], "bad time 'someday'"),
        (["add", "--topic", "t", "--delay", "1s", "--at", "2h"], "--delay or --at"),
        (["add", "--topic", "t", "--body", "a", "--json-body", "1"], "give one of --body"),
        (["add", "--topic", "t", "--json-body", "{nope"], "not JSON"),
        (["add", "--topic", "t", "--max-attempts", "0"], "--max-attempts"),
        (["update", "some-id"], "nothing to update"),
        (["kick", "t", "--count", "0"], "--count"),
        (["list", "--state", "sleeping"], "--state"),
        (["nosuch"], "No such command"),
        (["--timeout", "0", "ping"], "--timeout"),
    ],
)
def test_usage_errors_exit_2_with_one_line(address: str, args: list[str], needle: str) -> None:
    result = cli(address, *args)
    assert result.exit_code == 2, result.stdout
    assert needle in one_line(result.stderr)
    assert result.stdout == ""


def test_bad_server_address_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["--server", "localhost:99999", "ping"])
    assert result.exit_code == 2
    assert "port must be 1 to 65535" in one_line(result.stderr)


# -- exit codes from the server ----------------------------------------------------------------


def test_server_refusals_exit_2(address: str) -> None:
    result = cli(address, "add", "--topic", "x" * 300)
    assert result.exit_code == 2
    assert one_line(result.stderr).startswith("bad request:")

    big = os.urandom(1024 * 1024 + 100)  # over the default 1 MiB --max-body
    result = cli(address, "add", "--topic", "t", "--body-file", "-", input=big)
    assert result.exit_code == 2
    assert one_line(result.stderr).startswith("too large:")


def test_exists_and_conflict_exit_1(address: str) -> None:
    task_id = unique("id")
    assert cli(address, "add", "--topic", "t", "--id", task_id, "--delay", "1h").exit_code == 0
    result = cli(address, "add", "--topic", "t", "--id", task_id)
    assert result.exit_code == 1
    assert one_line(result.stderr).startswith("exists:")

    result = cli(address, "ack", task_id)  # delayed, not reserved
    assert result.exit_code == 1
    assert one_line(result.stderr).startswith("conflict:")

    for command in (["ack"], ["touch"], ["release"], ["update", "--delay", "1s"]):
        result = cli(address, command[0], "missing-id", *command[1:])
        assert result.exit_code == 1, command
        assert one_line(result.stderr) == "not found: missing-id"


def test_unreachable_exits_3() -> None:
    dead = f"127.0.0.1:{free_port()}"
    for args in (["ping"], ["add", "--topic", "t"], ["list"], ["import", "-"]):
        result = CliRunner().invoke(main, ["--server", dead, *args], input='{"topic": "t"}\n')
        assert result.exit_code == 3, (args, result.stderr)
        assert "cannot reach the server" in one_line(result.stderr)


# -- add, get, update ----------------------------------------------------------------------------


def test_add_readable_output(address: str) -> None:
    result = cli(address, "add", "--topic", unique(), "--delay", "90s")
    assert result.exit_code == 0, result.stderr
    line = result.stdout.strip()
    assert line.startswith("added ") and "due " in line and "(in 1m" in line
    assert "cycle " in line and "slot " in line


def test_an_at_in_the_past_is_added_due_now_and_said(address: str) -> None:
    """Accepted (the server takes a past time as now), but a year typed wrong
    should not pass unseen: one note on stderr; none for a time ahead."""
    result = cli(address, "add", "--topic", unique(), "--at", "2019-06-01T00:00:00Z")
    assert result.exit_code == 0, result.stderr
    assert one_line(result.stderr).startswith("note: --at 2019-06-01")
    assert "is in the past: the task is due now" in result.stderr
    assert "ago)" in result.stdout
    task_id = result.stdout.split()[1].rstrip(",")
    updated = cli(address, "update", task_id, "--at", "2020-01-01T00:00:00Z")
    assert updated.exit_code == 0 and "is in the past" in updated.stderr
    ahead = cli(address, "add", "--topic", unique(), "--at", "2h")
    assert ahead.exit_code == 0 and ahead.stderr == ""


def test_add_at_iso_time_and_duration(address: str) -> None:
    when = datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    added = cli_json(address, "add", "--topic", unique(), "--at", "2030-01-02T03:04:05Z")
    assert added["at"] == when.timestamp()
    added = cli_json(address, "add", "--topic", unique(), "--at", "2030-01-02T04:04:05+01:00")
    assert added["at"] == when.timestamp()
    added = cli_json(address, "add", "--topic", unique(), "--at", "2h")
    assert added["at"] == pytest.approx(time.time() + 7200, abs=30)

    result = cli(address, "get", added["id"])
    assert result.exit_code == 0
    assert "(in 1h59m" in result.stdout or "(in 2h" in result.stdout


def test_bodies_str_bytes_json_and_stdin(address: str, tmp_path: Path) -> None:
    raw = bytes(range(256))
    path = tmp_path / "body.bin"
    path.write_bytes(raw)
    cases: list[tuple[list[str], bytes | None, Any]] = [
        (["--body", "plain text"], None, "plain text"),
        (["--body-file", str(path)], None, {"$bin": base64.b64encode(raw).decode()}),
        (["--body-file", "-"], b"from stdin", {"$bin": base64.b64encode(b"from stdin").decode()}),
        (
            ["--json-body", '{"a": [1, 2.5, null], "b": true}'],
            None,
            {"a": [1, 2.5, None], "b": True},
        ),
        (["--json-body", '{"$bin": "AAEC"}'], None, {"$bin": "AAEC"}),
        (["--json-body", '"just a string"'], None, "just a string"),
    ]
    for args, stdin, expected in cases:
        added = cli_json(address, "add", "--topic", unique(), "--delay", "1h", *args, input=stdin)
        assert cli_json(address, "get", added["id"])["body"] == expected, args

    added = cli_json(address, "add", "--topic", "t", "--delay", "1h", "--body-file", str(path))
    shown = cli(address, "get", added["id"]).stdout
    assert "body (bin, 256 bytes, base64):" in shown
    assert base64.b64encode(raw).decode() in shown


def test_get_readable(address: str) -> None:
    topic = unique()
    added = cli_json(
        address,
        "add",
        "--topic",
        topic,
        "--delay",
        "1h",
        "--ttr",
        "2m",
        "--max-attempts",
        "3",
        "--json-body",
        '{"k": "v"}',
    )
    result = cli(address, "get", added["id"])
    assert result.exit_code == 0
    fields = dict(
        line.split(":", 1) for line in result.stdout.splitlines() if ":" in line and line[0] != " "
    )
    assert fields["id"].strip() == added["id"]
    assert fields["topic"].strip() == topic
    assert fields["state"].strip() == "delayed"
    assert fields["attempts"].strip() == "0 of 3"
    assert fields["ttr"].strip() == "2m"
    assert fields["target"].strip() == "queue"
    assert '"k": "v"' in result.stdout


def test_update_sends_only_what_is_given(address: str) -> None:
    topic, other = unique(), unique()
    added = cli_json(
        address, "add", "--topic", topic, "--delay", "1h", "--body", "old", "--ttr", "60"
    )
    task = cli_json(address, "update", added["id"], "--delay", "2h", "--max-attempts", "7")
    assert task["at"] == pytest.approx(time.time() + 7200, abs=30)
    assert (task["max_attempts"], task["body"], task["ttr"], task["topic"]) == (7, "old", 60, topic)

    task = cli_json(
        address,
        "update",
        added["id"],
        "--topic",
        other,
        "--body",
        "new",
        "--ttr",
        "1m30s",
        "--at",
        "2030-01-01T00:00:00Z",
    )
    assert (task["topic"], task["body"], task["ttr"]) == (other, "new", 90)
    assert task["at"] == datetime(2030, 1, 1, tzinfo=timezone.utc).timestamp()

    result = cli(address, "update", added["id"], "--json-body", "[1, 2]")
    assert result.exit_code == 0
    assert "state:" in result.stdout and "[\n  1,\n  2\n]" in result.stdout


# -- list, stats ---------------------------------------------------------------------------------


def test_list_table_pages_and_all(address: str) -> None:
    topic = unique()
    ids = [
        cli_json(address, "add", "--topic", topic, "--delay", f"{i + 1}h")["id"] for i in range(5)
    ]

    result = cli(address, "list", "--topic", topic)
    assert result.exit_code == 0
    lines = result.stdout.strip().splitlines()
    assert lines[0].split() == ["ID", "TOPIC", "STATE", "PRI", "DUE", "ATTEMPTS"]
    rows = [line.split() for line in lines[1:]]
    assert [row[0] for row in rows] == ids
    assert all(row[1:4] == [topic, "delayed", "1024"] and row[5] == "0/5" for row in rows)
    datetime.fromisoformat(rows[0][4])  # an ISO time

    result = cli(address, "list", "--topic", topic, "--limit", "2")
    assert len(result.stdout.strip().splitlines()) == 3
    assert "more tasks" in result.stderr

    page = cli_json(address, "list", "--topic", topic, "--limit", "2")
    assert [t["id"] for t in page["tasks"]] == ids[:2] and page["next"] is not None
    page = cli_json(
        address, "list", "--topic", topic, "--limit", "2", "--cursor", str(page["next"])
    )
    assert [t["id"] for t in page["tasks"]] == ids[2:4]

    everything = cli_json(address, "list", "--topic", topic, "--limit", "2", "--all")
    assert [t["id"] for t in everything["tasks"]] == ids and everything["next"] is None
    result = cli(address, "list", "--topic", topic, "--limit", "2", "--all")
    assert len(result.stdout.strip().splitlines()) == 6 and result.stderr == ""

    assert cli_json(address, "list", "--topic", topic, "--state", "ready")["tasks"] == []
    assert cli(address, "list", "--topic", unique()).stdout.strip() == "no tasks"


def test_stats(address: str) -> None:
    topic = unique()
    cli_json(address, "add", "--topic", topic, "--delay", "1h")
    stats = cli_json(address, "stats")
    assert stats["topics"][topic] == {"delayed": 1}
    result = cli(address, "stats")
    assert result.exit_code == 0
    assert "uptime:" in result.stdout and "slots:" in result.stdout
    assert f"  {topic}:" in result.stdout


# -- reserve, ack, release, touch, kick, ping ----------------------------------------------------


def test_reserve_touch_release_ack(address: str) -> None:
    topic, other = unique(), unique()
    added = cli_json(
        address, "add", "--topic", topic, "--body-file", "-", "--ttr", "30s", input=b"\xff\x00bytes"
    )

    task = cli_json(address, "reserve", other, topic)
    assert (task["id"], task["state"]) == (added["id"], "reserved")
    assert task["body"] == {"$bin": base64.b64encode(b"\xff\x00bytes").decode()}
    assert task["deadline"] == pytest.approx(time.time() + 30, abs=10)

    deadline = cli_json(address, "touch", added["id"])
    assert deadline == pytest.approx(time.time() + 30, abs=10)
    result = cli(address, "touch", added["id"])
    assert result.exit_code == 0 and "deadline" in result.stdout and "(in " in result.stdout

    result = cli(address, "release", added["id"], "--delay", "1h")
    assert (result.exit_code, result.stdout.strip()) == (0, f"released {added['id']}, due in 1h")
    assert cli_json(address, "get", added["id"])["state"] == "delayed"

    cli_json(address, "update", added["id"], "--delay", "0")
    task = cli_json(address, "reserve", topic, "--timeout", "5")
    assert task["id"] == added["id"]
    assert cli_json(address, "ack", added["id"]) is True
    assert cli(address, "get", added["id"]).exit_code == 1


def test_reserve_nothing_ready_exits_1_after_its_timeout(address: str) -> None:
    topic = unique()
    started = time.monotonic()
    result = cli(address, "--timeout", "2", "reserve", topic, "--timeout", "0.3")
    assert 0.25 < time.monotonic() - started < 5
    assert result.exit_code == 1
    assert one_line(result.stderr) == f"nothing ready in {topic}"


def _dead_task(address: str, topic: str) -> dict[str, Any]:
    """A task of ``topic`` reserved on its one attempt and left to its TTR: dead."""
    added = cli_json(address, "add", "--topic", topic, "--max-attempts", "1", "--ttr", "0.1")
    assert cli_json(address, "reserve", topic)["id"] == added["id"]
    deadline = time.monotonic() + 10
    while cli_json(address, "get", added["id"])["state"] != "dead":
        assert time.monotonic() < deadline, "task never went dead"
        time.sleep(0.05)
    return added


def test_kick_makes_dead_tasks_ready(address: str) -> None:
    topic = unique()
    added = _dead_task(address, topic)

    result = cli(address, "kick", topic, "--count", "5")
    assert (result.exit_code, result.stdout.strip()) == (0, f"kicked 1 task of {topic}")
    assert cli_json(address, "reserve", topic, "--timeout", "5")["id"] == added["id"]
    assert cli_json(address, "kick", topic) == 0


def test_kick_by_id_makes_one_dead_task_ready(address: str) -> None:
    topic = unique()
    added = _dead_task(address, topic)

    result = cli(address, "kick", "--id", added["id"])
    assert (result.exit_code, result.stdout.strip()) == (0, f"kicked {added['id']}")
    assert cli_json(address, "get", added["id"])["state"] == "ready"
    missing = cli(address, "kick", "--id", "no-such-task")
    assert missing.exit_code != 0 and "no-such-task" in missing.stderr
    neither = cli(address, "kick")
    assert neither.exit_code == 2 and "TOPIC or --id" in neither.stderr


def test_ping(address: str) -> None:
    assert cli_json(address, "ping") == "pong"
    result = cli(address, "ping")
    assert result.exit_code == 0 and result.stdout.startswith(f"pong from {address} in ")


# -- import --------------------------------------------------------------------------------------


def test_import_batches_with_a_bad_line_in_the_middle(address: str, tmp_path: Path) -> None:
    topic = unique()
    lines = [json.dumps({"topic": topic, "delay": "1h", "body": i}) for i in range(2000)]
    lines[1233] = '{"topic": "broken", '  # line 1234, in the third batch of 500
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(lines) + "\n")

    result = cli(address, "import", str(path), "--batch-size", "500")
    assert result.exit_code == 2
    line = one_line(result.stderr)
    assert line.startswith("line 1234: not JSON")
    assert "1000 tasks" in line and "resume from line 1001" in line
    found = cli_json(address, "list", "--topic", topic, "--all", "--limit", "1000")["tasks"]
    assert sorted(task["body"] for task in found) == list(range(1000))


def test_import_line_refused_by_the_server_is_named(address: str, tmp_path: Path) -> None:
    topic = unique()
    lines = [json.dumps({"topic": topic, "delay": 3600}) for _ in range(7)]
    lines[5] = json.dumps({"delay": 3600})  # no topic: the server refuses batch 2
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(lines) + "\n")
    result = cli(address, "import", str(path), "--batch-size", "3")
    assert result.exit_code == 2
    line = one_line(result.stderr)
    assert line.startswith("line 6: bad request:"), line
    assert "3 tasks" in line and "resume from line 4" in line
    assert len(cli_json(address, "list", "--topic", topic)["tasks"]) == 3


def test_import_from_stdin_with_durations_times_and_bytes(address: str) -> None:
    topic = unique()
    stdin = "\n".join(
        [
            json.dumps({"topic": topic, "id": unique("a"), "delay": "90s", "ttr": "2m"}),
            "",
            json.dumps({"topic": topic, "at": "2030-01-01T00:00:00Z", "body": {"$bin": "AP8="}}),
            json.dumps({"topic": topic, "body": {"nested": [1, {"$bin": "AQ=="}]}}),
        ]
    )
    report = cli_json(address, "import", "-", input=stdin)
    assert (report["added"], report["batches"], len(report["ids"])) == (3, 1, 3)
    first, second, third = (cli_json(address, "get", i) for i in report["ids"])
    assert first["at"] == pytest.approx(time.time() + 90, abs=30) and first["ttr"] == 120
    assert second["at"] == datetime(2030, 1, 1, tzinfo=timezone.utc).timestamp()
    assert second["body"] == {"$bin": "AP8="}
    assert third["body"] == {"nested": [1, {"$bin": "AQ=="}]}

    result = cli(address, "import", "-", input=json.dumps({"topic": topic}) + "\n")
    assert (result.exit_code, result.stdout.strip()) == (0, "added 1 task from stdin in 1 batch")
    result = cli(address, "import", "-", input='{"topic": "t", "delay": "soon"}\n')
    assert result.exit_code == 2 and "line 1: bad duration 'soon'" in one_line(result.stderr)
    result = cli(address, "import", "-", input="[1, 2]\n")
    assert result.exit_code == 2 and "line 1: expected a task map" in one_line(result.stderr)


# -- environment variables, token ----------------------------------------------------------------


@pytest.mark.process
def test_env_vars_server_json_and_token() -> None:
    secured = ServerProcess(env={"DELAYWHEEL_TOKEN": "s3cret"})  # serve reads it too
    try:
        address = f"{secured.host}:{secured.port}"
        runner = CliRunner()
        env = {"DELAYWHEEL_SERVER": address, "DELAYWHEEL_TOKEN": None}
        result = runner.invoke(main, ["get", "x"], env=env)
        assert result.exit_code == 2
        # In the CLI's words, not the protocol's ("send auth [token]").
        assert one_line(result.stderr) == (
            "unauthorized: get needs auth first:"
            " give the server's token with --token or DELAYWHEEL_TOKEN"
        )

        result = runner.invoke(main, ["--token", "wrong", "get", "x"], env=env)
        assert result.exit_code == 2
        assert one_line(result.stderr) == (
            "unauthorized: wrong token: give the server's token with --token or DELAYWHEEL_TOKEN"
        )

        env = {"DELAYWHEEL_SERVER": address, "DELAYWHEEL_TOKEN": "s3cret", "DELAYWHEEL_JSON": "1"}
        result = runner.invoke(main, ["add", "--topic", "t", "--id", "env-task"], env=env)
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout)["id"] == "env-task"
        result = runner.invoke(main, ["get", "env-task"], env=env)
        assert json.loads(result.stdout)["id"] == "env-task"

        done = proc(
            "--json",
            "get",
            "env-task",
            env={"DELAYWHEEL_SERVER": address, "DELAYWHEEL_TOKEN": "s3cret"},
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["id"] == "env-task"
    finally:
        secured.stop()
