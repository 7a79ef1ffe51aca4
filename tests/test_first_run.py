"""First-run polish (issue 20): what a new user and an operator meet in the first hour.

Each test runs the real ``delaywheel`` command (or the real server) and checks
what it prints: one clear line, the documented exit code, no Python repr.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import closing
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import msgpack
import nats
import pytest
from conftest import RedisServer, free_port
from delaywheel_client import AsyncClient, Client, Worker, targets
from delaywheel_client.errors import ConnectionFailed
from nats.js.api import StreamConfig
from serverproc import ServerProcess
from waiting import wait_until

# Every test here runs the CLI or the server in a process of its own.
pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parent.parent
EXIT_CANNOT_LISTEN = 4


def delaywheel(*args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "delaywheel", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=ROOT,
    )


def last_line(stderr: str) -> str:
    return stderr.strip().splitlines()[-1]


# -- 1. a port already taken -------------------------------------------------------


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port of 127.0.0.1 that this test process listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def _own_command_start() -> str:
    """This process's argv[0] as /proc shows it (what the server reads of the
    holder): ``make test`` starts pytest as .venv/bin/python, a relative path."""
    return Path(f"/proc/{os.getpid()}/cmdline").read_bytes().split(b"\0")[0].decode()


@pytest.mark.parametrize(
    ("args", "what", "option"),
    [
        (("--port", "{port}"), "the server", "--port"),
        (("--port", "0", "--metrics-port", "{port}"), "metrics", "--metrics-port"),
    ],
)
def test_a_taken_port_is_one_line_naming_it_and_its_holder(
    taken_port: int, args: tuple[str, ...], what: str, option: str
) -> None:
    result = delaywheel(
        "serve", "--store", "memory://", *(arg.format(port=taken_port) for arg in args)
    )
    assert result.returncode == EXIT_CANNOT_LISTEN, result.stderr
    assert "Traceback" not in result.stderr
    line = last_line(result.stderr)
    prefix = (
        f"delaywheel: cannot listen on 127.0.0.1:{taken_port} ({what}): the address is already"
        f" in use, held by pid {os.getpid()} ({_own_command_start()} "
    )
    assert line.startswith(prefix), line
    assert line.endswith(f"); choose another port with {option}, or stop what holds it"), line


def test_an_address_not_of_this_machine_is_one_line() -> None:
    # 192.0.2.0/24 is TEST-NET-1: never an address of this machine.
    result = delaywheel(
        "serve", "--store", "memory://", "--host", "192.0.2.1", "--port", "0", "--insecure-no-auth"
    )
    assert result.returncode == EXIT_CANNOT_LISTEN, result.stderr
    assert "Traceback" not in result.stderr
    line = last_line(result.stderr)
    assert line.startswith("delaywheel: cannot listen on 192.0.2.1:0 (the server): "), line
    assert line.endswith("; check --host and --port"), line


# -- 2. Redis authentication ------------------------------------------------------

REDIS_PASSWORD = "first-run-secret"


@pytest.fixture(scope="module")
def password_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis-auth"), ["--requirepass", REDIS_PASSWORD])
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_no_password_for_a_redis_that_needs_one_says_so(password_redis: RedisServer) -> None:
    result = delaywheel("serve", "--port", "0", "--store", password_redis.url)
    assert result.returncode == 3, result.stderr
    assert result.stderr.strip() == (
        f"delaywheel: store {password_redis.url}: Redis needs a password and the URL has none:"
        " put it in the URL as redis://:PASSWORD@host:port/db"
    )


@pytest.mark.parametrize("user", ["", "someone"])
def test_a_wrong_password_says_so_and_hides_it(password_redis: RedisServer, user: str) -> None:
    url = f"redis://{user}:not-the-{REDIS_PASSWORD}@127.0.0.1:{password_redis.port}/0"
    result = delaywheel("serve", "--port", "0", "--store", url)
    assert result.returncode == 3, result.stderr
    assert result.stderr.strip() == (
        f"delaywheel: store redis://{user}:***@127.0.0.1:{password_redis.port}/0: Redis refused"
        " the password in the URL (a wrong password, or a user Redis does not know): it goes in"
        " as redis://:PASSWORD@host:port/db, or redis://USER:PASSWORD@host:port/db for an ACL user"
    )
    assert REDIS_PASSWORD not in result.stderr


def test_the_right_password_serves(password_redis: RedisServer) -> None:
    url = f"redis://:{REDIS_PASSWORD}@127.0.0.1:{password_redis.port}/0"
    server = ServerProcess(store=url)
    try:
        assert (
            f"store redis://:***@127.0.0.1:{password_redis.port}/0 connected" in server.log_text()
        )
        assert REDIS_PASSWORD not in server.log_text()
    finally:
        assert server.stop() == 0


def test_an_unreachable_redis_still_suggests_the_embedded_store() -> None:
    port = free_port()
    result = delaywheel("serve", "--port", "0", "--store", f"redis://127.0.0.1:{port}/0")
    assert result.returncode == 3, result.stderr
    assert result.stderr.strip().endswith(
        "Is Redis running there? Without Redis, use the embedded store:"
        " --store sqlite:///delaywheel.db"
    )


def test_a_sqlite_path_in_a_missing_directory_says_how_to_write_an_absolute_one(
    tmp_path: Path,
) -> None:
    # sqlite:///tmp/... is ./tmp/...: the commonest slip with SQLite URLs.
    meant = str(tmp_path).lstrip("/")  # the directory as a user means it, slash dropped
    written = f"{meant}/d.db"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "delaywheel",
            "serve",
            "--port",
            "0",
            "--store",
            f"sqlite:///{written}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 3, result.stderr
    assert last_line(result.stderr) == (
        f"delaywheel: store sqlite:///{written}: the directory {tmp_path / meant}"
        f" does not exist; sqlite:///{written} is relative to the working directory"
        f" ({tmp_path}), an absolute path takes four slashes: sqlite:////{written}"
    )
    missing = tmp_path / "none" / "d.db"
    result = delaywheel("serve", "--port", "0", "--store", f"sqlite:///{missing}")
    assert result.returncode == 3, result.stderr
    assert last_line(result.stderr) == (
        f"delaywheel: store sqlite:///{missing}: the directory {missing.parent} does not exist"
    )


# -- 3. human output says yes, no, - and never ----------------------------------

PYTHON_REPRS = re.compile(r"\b(None|True|False)\b")


@pytest.fixture(scope="module")
def broker_server() -> Iterator[ServerProcess]:
    """A server with the machine's NATS as a broker, and one that nothing listens for."""
    server = ServerProcess(
        "--broker", "up=nats://127.0.0.1:4222", "--broker", f"gone=nats://127.0.0.1:{free_port()}"
    )
    yield server
    server.stop()


def cli(server: ServerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return delaywheel("--server", f"{server.host}:{server.port}", *args)


def _broker_rows(stats_text: str, name: str) -> dict[str, str]:
    lines = stats_text.splitlines()
    start = lines.index(f"    {name}:") + 1
    rows = {}
    for line in lines[start:]:
        if not line.startswith("      "):
            break
        key, _, value = line.strip().partition(": ")
        rows[key] = value
    return rows


def test_stats_shows_no_python_reprs(broker_server: ServerProcess) -> None:
    result = cli(broker_server, "stats")
    assert result.returncode == 0, result.stderr
    assert not PYTHON_REPRS.search(result.stdout), result.stdout
    assert "tls: no" in result.stdout.splitlines()
    up, gone = _broker_rows(result.stdout, "up"), _broker_rows(result.stdout, "gone")
    assert (up["connected"], up["failing_since"], up["last_error"]) == ("yes", "never", "-")
    assert gone["connected"] == "no"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\S+ \((now|.+ ago)\)", gone["failing_since"]), gone
    assert gone["last_error"].startswith("ConnectionRefusedError")
    as_json = json.loads(cli(broker_server, "--json", "stats").stdout)
    shown = as_json["deliveries"]["brokers"]["up"]
    assert (shown["connected"], shown["failing_since"], shown["last_error"]) == (True, None, None)
    assert as_json["tls"] is False


def test_a_dead_task_shows_no_wheel_row(broker_server: ServerProcess) -> None:
    added = cli(broker_server, "add", "--topic", "first-run-3", "--id", "r3", "--max-attempts", "1")
    assert added.returncode == 0, added.stderr
    assert cli(broker_server, "reserve", "first-run-3").returncode == 0
    assert cli(broker_server, "release", "r3").returncode == 0  # its last attempt: dead
    shown = cli(broker_server, "get", "r3")
    assert shown.returncode == 0, shown.stderr
    assert "state:    dead" in shown.stdout
    assert "wheel" not in shown.stdout
    assert not PYTHON_REPRS.search(shown.stdout), shown.stdout
    task = json.loads(cli(broker_server, "--json", "get", "r3").stdout)
    assert (task["cycle"], task["slot"]) == (None, None)


# -- 4. the worker's line on a task's last attempt ----------------------------------


def test_the_worker_says_a_task_is_dead_after_its_last_attempt(
    broker_server: ServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    topic = "first-run 4"
    with Client(*broker_server.address) as client:
        task_id = client.add(topic, "boom", max_attempts=2)["id"]
        worker = Worker(client, reserve_timeout_s=1.0, retry_base_s=0.1)

        @worker.handler(topic)
        def fail(task: dict[str, Any]) -> None:
            raise ValueError("handler failed")

        with caplog.at_level(logging.ERROR, logger="delaywheel_client.worker"):
            assert worker.run(max_tasks=2) == 2
        task = client.get(task_id)
    assert task is not None and task["state"] == "dead"
    first, last = (record.getMessage() for record in caplog.records)
    assert first == (
        f"task {task_id!r} of topic {topic!r} failed on attempt 1 of 2; releasing it for 0.1 s"
    )
    assert last == (
        f"task {task_id!r} of topic {topic!r} failed on its last attempt (2 of 2): it is now"
        f" dead; `delaywheel kick 'first-run 4'` (or client.kick({topic!r})) makes it due again"
    )


# -- 6. stats shows --http-concurrency ------------------------------------------------


def test_stats_shows_the_http_concurrency_setting() -> None:
    server = ServerProcess("--http-concurrency", "48")
    try:
        shown = cli(server, "stats")
        as_json = json.loads(cli(server, "--json", "stats").stdout)
    finally:
        server.stop()
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    http = lines.index("  http:")
    assert lines[http + 1 : http + 5] == [
        "    in_flight: 0",
        "    waiting: 0",
        "    concurrency: 48",
        "    concurrency_total: 768",
    ]
    assert as_json["deliveries"]["http"]["concurrency"] == 48


# -- 8. start-up lines are INFO -------------------------------------------------------


def test_the_listening_and_metrics_lines_are_info() -> None:
    server = ServerProcess("--metrics-port", "0", "--log-format", "json")
    try:
        events = [json.loads(line) for line in server.log if line.startswith("{")]
    finally:
        assert server.stop() == 0
    levels = {
        event["message"].split(" on ")[0]: event["level"]
        for event in events
        if " on " in event["message"]
    }
    assert levels == {"delaywheel listening": "INFO", "metrics": "INFO"}
    # What is left at WARNING is what an operator should act on.
    warnings = [event["message"] for event in events if event["level"] == "WARNING"]
    assert warnings == [
        "store memory://: memory:// persists nothing: every task is lost when the server stops"
    ]


# -- 9. settings errors say each word once ------------------------------------------


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ("--broker", "bad"),
            "delaywheel serve: broker 'bad': must be NAME=URL",
        ),
        (
            ("--http-allow", "zz/99"),
            "delaywheel serve: --http-allow entry 'zz/99' is not a CIDR range: 'zz/99' does not"
            " appear to be an IPv4 or IPv6 network",
        ),
    ],
)
def test_a_bad_broker_or_allow_entry_is_named_once(args: tuple[str, ...], line: str) -> None:
    result = delaywheel("serve", "--store", "memory://", *args)
    assert result.returncode == 2
    assert result.stderr.strip() == line


# -- 10. protected mode -----------------------------------------------------------------


def test_listening_beyond_loopback_without_a_token_is_refused() -> None:
    result = delaywheel("serve", "--store", "memory://", "--host", "0.0.0.0", "--port", "0")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "delaywheel serve: --host '0.0.0.0' listens beyond this machine with no token: anyone"
        " who can reach the port could add, delete and read every task. Set --token"
        " (DELAYWHEEL_TOKEN), which clients then send, or pass --insecure-no-auth if that is"
        " meant (--tls-client-ca, requiring client certificates, also does)"
    )


def test_insecure_no_auth_serves_and_warns_at_every_start() -> None:
    server = ServerProcess("--host", "0.0.0.0", env={"DELAYWHEEL_INSECURE_NO_AUTH": "1"})
    try:
        for _ in range(2):  # every start, not only the first
            warnings = [line for line in server.log if " WARNING delaywheel: --insecure" in line]
            assert len(warnings) == 1, server.log_text()
            assert warnings[0].endswith(
                "--insecure-no-auth: listening on '0.0.0.0' with no token and no client"
                " certificates: anyone who can reach the port can add, delete and read every task"
            )
            pinged = delaywheel("--server", f"127.0.0.1:{server.port}", "ping")
            assert pinged.returncode == 0, pinged.stderr
            assert server.stop() == 0
            server.log.clear()
            server.start()
    finally:
        server.stop()


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost"])
def test_loopback_needs_no_token(host: str) -> None:
    server = ServerProcess("--host", host)
    try:
        assert "--insecure" not in server.log_text()
    finally:
        assert server.stop() == 0


def test_a_token_opens_any_address() -> None:
    server = ServerProcess("--host", "0.0.0.0", "--token", "first-run")
    try:
        assert "--insecure" not in server.log_text()
        pinged = delaywheel("--server", f"127.0.0.1:{server.port}", "--token", "first-run", "stats")
        assert pinged.returncode == 0, pinged.stderr
    finally:
        assert server.stop() == 0


# -- 5. ids that headers cannot carry arrive percent-encoded ----------------------------

EDGE_IDS = [" lead", "lead", "lead ", "50%"]
ENCODED_IDS = ["%20lead", "lead", "lead%20", "50%25"]


class _Hooks:
    """A real HTTP endpoint (the stdlib's server) that keeps each request's headers."""

    def __init__(self) -> None:
        self.headers: list[dict[str, str]] = []
        hooks = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                hooks.headers.append(dict(self.headers))
                self.send_response(204)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.http.server_address[1]
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


def _wait_for(check: Any, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_edge_spaces_in_ids_reach_an_http_endpoint_percent_encoded() -> None:
    hooks = _Hooks()
    server = ServerProcess("--http-allow", "127.0.0.1")
    try:
        with Client(*server.address) as client:
            for task_id in EDGE_IDS:
                target = targets.http(f"http://127.0.0.1:{hooks.port}/hook")
                client.add(" topic", {"n": 1}, id=task_id, target=target)
            _wait_for(lambda: len(hooks.headers) == len(EDGE_IDS))
    finally:
        server.stop()
        hooks.close()
    got = sorted(headers["Delaywheel-Id"] for headers in hooks.headers)
    assert got == sorted(ENCODED_IDS)
    assert sorted(unquote(text) for text in got) == sorted(EDGE_IDS)  # four ids, as added
    assert {headers["Delaywheel-Topic"] for headers in hooks.headers} == {"%20topic"}


@pytest.mark.brokers("nats")
def test_edge_spaces_in_ids_reach_nats_percent_encoded() -> None:
    stream = f"dw_first_run_{uuid.uuid4().hex[:12]}"
    subject = f"dw-first-run-{uuid.uuid4().hex[:12]}.x"

    async def on_nats(action: Any) -> Any:
        connection = await nats.connect("nats://127.0.0.1:4222")
        try:
            return await action(connection.jetstream())
        finally:
            await connection.close()

    async def create(js: Any) -> None:
        await js.add_stream(StreamConfig(name=stream, subjects=[subject]))

    async def stored_ids(js: Any) -> list[str]:
        count = (await js.stream_info(stream)).state.messages
        return [
            (await js.get_msg(stream, seq)).headers["Nats-Msg-Id"] for seq in range(1, count + 1)
        ]

    async def delete(js: Any) -> None:
        await js.delete_stream(stream)

    asyncio.run(on_nats(create))
    server = ServerProcess("--broker", "bus=nats://127.0.0.1:4222")
    try:
        with Client(*server.address) as client:
            for task_id in EDGE_IDS:
                client.add("t", {"n": 1}, id=task_id, target=targets.nats(subject, broker="bus"))
        _wait_for(lambda: len(asyncio.run(on_nats(stored_ids))) == len(EDGE_IDS))
        got = asyncio.run(on_nats(stored_ids))
    finally:
        server.stop()
        asyncio.run(on_nats(delete))
    # Four messages, not three: JetStream did not take " lead" for a repeat of "lead".
    assert sorted(got) == sorted(ENCODED_IDS)


# -- 7. the docs: target helpers, Redis targets on SQLite ----------------------------


def test_a_redis_list_target_on_sqlite_says_what_to_use(tmp_path: Path) -> None:
    server = ServerProcess(store=f"sqlite:///{tmp_path / 'quick.db'}")
    try:
        result = cli(server, "add", "--topic", "mail", "--redis-list", "mail:due")
    finally:
        server.stop()
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "bad request: target broker 'store' is unknown: the store is not Redis;"
        " this server has no brokers; use --broker NAME with --broker NAME=redis://... on the"
        " server"
    )


def test_the_target_helpers_example_in_delivery_md_runs(redis_url: str) -> None:
    text = (ROOT / "docs" / "delivery.md").read_text()
    section = text[text.index("### From the Python client") :]
    start = section.index("```python\n") + len("```python\n")
    example = section[start : section.index("```", start)]
    for helper in ("http", "redis_list", "redis_stream", "amqp", "nats"):
        assert f"targets.{helper}(" in example
    server = ServerProcess(
        "--broker", f"cache={redis_url}",
        "--broker", "jobs=amqp://guest:guest@127.0.0.1:5672/",
        "--broker", "events=nats://127.0.0.1:4222",
        store=redis_url,
    )  # fmt: skip
    try:
        address = f'Client("{server.host}", {server.port})'
        exec(compile(example.replace('Client("127.0.0.1", 3450)', address), "delivery.md", "exec"))
        with Client(*server.address) as client:
            added = client.list(limit=10)["tasks"]
            for task in added:
                assert client.delete(task["id"])
    finally:
        server.stop()
    kinds = {
        task["topic"]: (task["target"]["type"], task["target"].get("broker")) for task in added
    }
    assert kinds == {
        "invoices": ("http", None),
        "mail": ("redis", "store"),
        "audit": ("redis", "cache"),
        "orders": ("amqp", "jobs"),
        "events": ("nats", "events"),
    }


# -- 11. delaywheel backup, under steady writes --------------------------------------

BACKUP_LINE = re.compile(
    r"backed up (?P<store>\S+) to (?P<file>\S+) \((?P<kind>[^)]+)\): (?P<tasks>\d+) tasks,"
    r" (?P<bytes>\d+) bytes in (?P<took>[\d.]+) s"
)


class _SteadyAdds:
    """Back-to-back add_many calls of 1,000 tasks from a thread, until stopped."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.calls = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            with Client(*self.server.address) as client:
                while not self._stop.is_set():
                    client.add_many([{"topic": "load", "delay": 3600}] * 1000)
                    self.calls += 1
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def __enter__(self) -> _SteadyAdds:
        self._thread.start()
        _wait_for(lambda: self.calls >= 2)
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        assert self.error is None, self.error


def _task_count(server: ServerProcess) -> int:
    with Client(*server.address) as client:
        return int(client.stats()["tasks"])


def test_backup_of_sqlite_finishes_under_steady_writes(tmp_path: Path) -> None:
    db = tmp_path / "live.db"
    server = ServerProcess(store=f"sqlite:///{db}")
    try:
        with Client(*server.address) as client:
            for _ in range(20):
                client.add_many([{"topic": "old", "delay": 3600}] * 1000)
        copies = []
        with _SteadyAdds(server) as load:
            for n in range(3):
                # What the store holds now (the server's count may include a
                # batch whose write is still under way).
                with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as live:
                    (before,) = live.execute("SELECT count(*) FROM tasks").fetchone()
                copy = tmp_path / f"copy-{n}.db"
                result = delaywheel("backup", "--store", f"sqlite:///{db}", str(copy), timeout_s=60)
                after = _task_count(server)
                assert result.returncode == 0, result.stderr
                copies.append((copy, before, after, result.stdout.strip()))
            calls_during = load.calls
    finally:
        assert server.stop() == 0
    assert calls_during > 3  # the writes went on throughout
    for copy, before, after, line in copies:
        shown = BACKUP_LINE.fullmatch(line)
        assert shown is not None, line
        assert (shown["store"], shown["file"], shown["kind"]) == (
            f"sqlite:///{db}",
            str(copy),
            "SQLite database",
        )
        with closing(sqlite3.connect(copy)) as check:
            assert check.execute("PRAGMA integrity_check").fetchone() == ("ok",)
            (count,) = check.execute("SELECT count(*) FROM tasks").fetchone()
        assert before <= count <= after
        assert int(shown["tasks"]) == count
        assert int(shown["bytes"]) == copy.stat().st_size
    assert not list(tmp_path.glob(".*.partial"))


@pytest.mark.redis
def test_backup_of_redis_streams_an_rdb_under_steady_writes(tmp_path: Path) -> None:
    password = "backup-secret"
    source = RedisServer(tmp_path / "source", ["--requirepass", password])
    (tmp_path / "source").mkdir()
    source.start()
    url = f"redis://:{password}@127.0.0.1:{source.port}/3"
    copy = tmp_path / "copy.rdb"
    try:
        server = ServerProcess(store=url)
        try:
            with Client(*server.address) as client:
                for _ in range(20):
                    client.add_many([{"topic": "old", "delay": 3600}] * 1000)
            with _SteadyAdds(server), source.client(3, password) as live:
                before = int(live.hlen("{delaywheel}:tasks"))
                result = delaywheel("backup", "--store", url, str(copy), timeout_s=120)
                after = _task_count(server)
        finally:
            assert server.stop() == 0
    finally:
        source.stop()
    assert result.returncode == 0, result.stderr
    assert password not in result.stdout + result.stderr
    shown = BACKUP_LINE.fullmatch(result.stdout.strip())
    assert shown is not None, result.stdout
    assert (shown["store"], shown["kind"]) == (
        f"redis://:***@127.0.0.1:{source.port}/3",
        "RDB snapshot",
    )
    assert int(shown["bytes"]) == copy.stat().st_size
    assert copy.read_bytes().startswith(b"REDIS")
    # Restored as docs/operations.md says: dump.rdb in a fresh Redis, AOF off.
    restored_dir = tmp_path / "restored"
    restored_dir.mkdir()
    copy.rename(restored_dir / "dump.rdb")
    restored = RedisServer(restored_dir, ["--appendonly", "no", "--dbfilename", "dump.rdb"])
    restored.start()
    try:
        with restored.client(3) as check:
            # Each of the keyspace's 16 partitions has its hash (docs/ha.md).
            count = sum(int(check.hlen(f"{{delaywheel:p{p:03d}}}:tasks")) for p in range(16))
    finally:
        restored.stop()
    assert before <= count <= after
    assert count >= 20_000


def test_backup_refuses_what_it_cannot_copy(tmp_path: Path) -> None:
    memory = delaywheel("backup", "--store", "memory://", str(tmp_path / "x"))
    assert (memory.returncode, memory.stderr.strip()) == (
        2,
        "memory:// keeps nothing to back up: its tasks live in the server",
    )
    missing = delaywheel("backup", "--store", f"sqlite:///{tmp_path}/none.db", str(tmp_path / "x"))
    assert missing.returncode == 2
    assert missing.stderr.strip() == (
        f"store sqlite:///{tmp_path}/none.db: no database at {tmp_path}/none.db"
    )
    unreachable = delaywheel(
        "backup", "--store", f"redis://127.0.0.1:{free_port()}/0", str(tmp_path / "x")
    )
    assert unreachable.returncode == 3
    assert unreachable.stderr.strip().startswith("store redis://127.0.0.1:")
    assert not (tmp_path / "x").exists()


# -- 11. a plain client on a TLS port is told to try --tls ------------------------------


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    directory = tmp_path_factory.mktemp("first-run-tls")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    server = ServerProcess("--tls-cert", str(cert), "--tls-key", str(key))
    yield server
    server.stop()


PLAIN_HINT = (
    "before any reply (is the server using TLS? try --tls, or --tls-ca FILE;"
    " in Python tls=True or tls_ca=)"
)


def test_the_cli_without_tls_on_a_tls_port_is_told_to_try_tls(tls_server: ServerProcess) -> None:
    result = cli(tls_server, "ping")
    assert result.returncode == 3
    assert result.stderr.strip() == (
        f"cannot reach the server: 127.0.0.1:{tls_server.port}: the server closed the connection"
        f" during ping {PLAIN_HINT}"
    )


def test_the_clients_without_tls_on_a_tls_port_are_told_to_try_tls(
    tls_server: ServerProcess,
) -> None:
    with Client(*tls_server.address, retries=0) as plain, pytest.raises(ConnectionFailed) as caught:
        plain.ping()
    assert str(caught.value).endswith(PLAIN_HINT)

    async def ping_async() -> None:
        async with AsyncClient(*tls_server.address, retries=0) as aio:
            await aio.ping()

    with pytest.raises(ConnectionFailed) as caught_async:
        asyncio.run(ping_async())
    assert str(caught_async.value).endswith(PLAIN_HINT)


def test_the_server_logs_a_plain_text_client_on_its_tls_port(tmp_path: Path) -> None:
    # A server of its own, with a short handshake timeout: a plain ping is
    # shorter than the TLS record OpenSSL reads it as, so only that timeout
    # ends it. The line is rate-limited: one server per kind of client.
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=localhost"],
        check=True, capture_output=True,
    )  # fmt: skip
    line = "sent plain text to this TLS port (or never finished its handshake)"
    for plain in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", msgpack.packb([0, 1, "ping", []])):
        server = ServerProcess(
            "--tls-cert", str(cert), "--tls-key", str(key), "--message-timeout", "1"
        )
        try:
            with socket.create_connection(server.address, timeout=10) as peer:
                peer.sendall(plain)
                wait_until(lambda s=server: line in s.log_text(), 15, "the plain-text line")
            logged = next(ln for ln in server.log_text().splitlines() if line in ln)
            assert "127.0.0.1:" in logged and "--tls" in logged, logged
            assert "Traceback" not in server.log_text()
        finally:
            server.stop()


# -- 11. counters with known labels are there from the start ---------------------------


def test_a_fresh_server_exports_zeros_for_known_labels() -> None:
    server = ServerProcess("--metrics-port", "0")
    try:
        url = re.search(r"metrics on (http://\S+/metrics)", server.log_text())
        assert url is not None, server.log_text()
        with urllib.request.urlopen(url.group(1), timeout=10) as reply:
            text = reply.read().decode()
    finally:
        server.stop()
    for target in ("http", "redis", "amqp", "nats"):
        for outcome in ("delivered", "failed"):
            sample = f'delaywheel_deliveries_total{{outcome="{outcome}",target="{target}"}} 0.0'
            assert sample in text.splitlines()
    for code in ("bad_request", "too_large", "unavailable"):
        assert f'delaywheel_connections_refused_total{{code="{code}"}} 0.0' in text.splitlines()
