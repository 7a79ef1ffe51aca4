"""The log: one line per event that matters, in text or JSON, and never a secret.

The end-to-end test runs the real server (``--log-format json``, then
``text``) through the events docs/operations.md ("Logging") lists: the
start with its settings, a password-protected private Redis as the store
(connected, a write slowed down by SIGSTOP, an outage: lost and back), a
password-protected private Redis as a broker (connected, lost, back), an
AMQP broker with a password where nothing listens (lost), an HTTP delivery
with a secret query string and an Authorization header that dies against an
endpoint answering 500, connections refused for garbage, and a wrong token.
Then it reads the whole log: each event is there once, in its exact form,
and no secret and no task body appears anywhere.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import msgpack  # type: ignore[import-untyped, unused-ignore]
import pytest
from conftest import RedisServer, free_port
from delaywheel_client import Client
from delaywheel_client.errors import DelaywheelError, Unavailable
from rawpeer import Raw
from serverproc import ServerProcess
from waiting import wait_until as wait_for

from delaywheel import __version__
from delaywheel.config import Settings

pytestmark = pytest.mark.process  # every test runs the server in a process of its own


def _secret(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:12]}"


TOKEN = _secret("token")
WRONG_TOKEN = _secret("wrongtoken")
SIGNING_SECRET = _secret("signing")
STORE_PASSWORD = _secret("storepw")
BROKER_PASSWORD = _secret("brokerpw")
DOWN_PASSWORD = _secret("downpw")
QUERY_SECRET = _secret("query")
AUTH_SECRET = _secret("bearer")
MARKER = _secret("body-marker")
SECRETS = (
    TOKEN,
    WRONG_TOKEN,
    SIGNING_SECRET,
    STORE_PASSWORD,
    BROKER_PASSWORD,
    DOWN_PASSWORD,
    QUERY_SECRET,
    AUTH_SECRET,
    MARKER,
)
SLOW_FLUSH_S = 0.3
STOPPED_S = 0.8  # how long the store's redis-server is SIGSTOPped: well over SLOW_FLUSH_S
TEXT_LINE = re.compile(
    r"(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (?P<level>[A-Z]+) (?P<logger>[\w.]+): "
    r"(?P<message>.*)"
)
OTHER_LINES = (
    r"task '\w+' attempt \d+ to broker rb failed: .*|broker 'store' \(.*\) connected"
    # A node of a Redis keyspace, per partition (tests/test_ha.py checks these).
    r"|serving partition \d+, epoch \d+: \d+ tasks loaded in .*|handed back partition \d+"
)
ISO_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


# -- end to end ---------------------------------------------------------------------------


@dataclass
class Event:
    level: str
    logger: str
    message: str
    fields: dict[str, Any]  # the JSON object (empty in text)
    checked: bool = False  # matched by ``one``


def parse_log(text: str, log_format: str) -> list[Event]:
    """Every line of the log as an event; a line that is not one fails the test."""
    events = []
    for line in text.splitlines():
        if log_format == "json":
            entry = json.loads(line)
            assert ISO_UTC.fullmatch(entry["ts"]), line
            events.append(Event(entry["level"], entry["logger"], entry["message"], entry))
        else:
            match = TEXT_LINE.fullmatch(line)
            assert match, f"not a log line: {line!r}"
            events.append(Event(match["level"], match["logger"], match["message"], {}))
    return events


def one(events: list[Event], pattern: str, level: str, logger: str) -> tuple[Event, re.Match[str]]:
    """The one event whose message matches ``pattern`` whole, at ``level`` from ``logger``."""
    found = [(e, m) for e in events if (m := re.fullmatch(pattern, e.message))]
    assert len(found) == 1, f"{pattern!r}: {[e.message for e, _ in found]}"
    event, match = found[0]
    assert (event.level, event.logger) == (level, logger), event
    event.checked = True
    return event, match


@contextlib.contextmanager
def failing_endpoint() -> Iterator[tuple[int, list[dict[str, str]]]]:
    """An HTTP endpoint on 127.0.0.1 that answers 500 to everything; yields its
    port and the headers of each request it got."""
    seen: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append(dict(self.headers))
            self.send_response(500)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd.server_address[1], seen
    finally:
        httpd.shutdown()
        httpd.server_close()


@contextlib.contextmanager
def redis_with_password(directory: Path, password: str) -> Iterator[RedisServer]:
    server = RedisServer(directory, ["--requirepass", password])
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def store_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with redis_with_password(tmp_path_factory.mktemp("log-store"), STORE_PASSWORD) as server:
        yield server


@pytest.fixture(scope="module")
def broker_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with redis_with_password(tmp_path_factory.mktemp("log-broker"), BROKER_PASSWORD) as server:
        yield server


def refused_garbage(address: tuple[str, int], data: bytes) -> None:
    """Send ``data`` on a connection of its own and wait until the server closes it."""
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(data)
        while sock.recv(65536):
            pass


@pytest.mark.slow
@pytest.mark.parametrize("log_format", ["json", "text"])
def test_a_run_logs_each_event_once_and_no_secret(
    log_format: str, store_redis: RedisServer, broker_redis: RedisServer
) -> None:
    store_redis.start()
    broker_redis.start()
    with store_redis.client(password=STORE_PASSWORD) as admin:
        admin.flushall()
    store_shown = f"redis://:***@127.0.0.1:{store_redis.port}/0"
    down_port = free_port()
    with failing_endpoint() as (http_port, seen):
        proc = ServerProcess(
            "--token", TOKEN,
            "--signing-secret", SIGNING_SECRET,
            "--broker", f"rb=redis://:{BROKER_PASSWORD}@127.0.0.1:{broker_redis.port}/0",
            "--broker", f"down=amqp://guest:{DOWN_PASSWORD}@127.0.0.1:{down_port}/",
            "--http-allow", "127.0.0.1",
            "--retry-base", "0.1",
            "--slow-flush", str(SLOW_FLUSH_S),
            "--log-format", log_format,
            store=f"redis://:{STORE_PASSWORD}@127.0.0.1:{store_redis.port}/0",
            tick="0.01",
        )  # fmt: skip
        try:
            ids = drive(proc, store_redis, broker_redis, http_port)
        finally:
            proc.stop()
        assert seen and seen[0]["Authorization"] == f"Bearer {AUTH_SECRET}"  # it was sent
    text = proc.log_text()
    leaked = [secret for secret in SECRETS if secret in text]
    assert not leaked, f"in the log: {leaked}\n{text}"
    check_events(parse_log(text, log_format), log_format, ids, store_shown, http_port, down_port)


@dataclass
class Ids:
    dead: str
    failed_writes: int


def drive(
    proc: ServerProcess, store_redis: RedisServer, broker_redis: RedisServer, http_port: int
) -> Ids:
    """Make every event happen once, in turn."""
    with Client(*proc.address, token=TOKEN) as client:
        client.add("plain", {"note": MARKER}, delay=3600)
        hook = {
            "type": "http",
            "url": f"http://127.0.0.1:{http_port}/hook?sig={QUERY_SECRET}",
            "headers": {"Authorization": f"Bearer {AUTH_SECRET}"},
        }
        dead = client.add("hooks", MARKER, target=hook, max_attempts=1)["id"]
        wait_for(lambda: (client.get(dead) or {}).get("state") == "dead", what="the death")
        wait_for(lambda: "is dead after" in proc.log_text(), what="the death's line")

        refused_garbage(proc.address, b"\xc1" + MARKER.encode())
        refused_garbage(proc.address, msgpack.packb(MARKER))
        peer = Raw(proc.address)
        assert peer.call("auth", WRONG_TOKEN)[:2] == ("error", "unauthorized")
        peer.sock.close()

        # The broker: lost when a push meets it stopped, back by itself.
        broker_redis.stop()
        push = {"type": "redis", "broker": "rb", "key": "jobs", "mode": "list"}
        pushed = client.add("pushes", MARKER, target=push, max_attempts=20)["id"]
        wait_for(lambda: re.search(r"broker 'rb' .* unreachable", proc.log_text()), what="rb lost")
        broker_redis.start()
        wait_for(lambda: client.get(pushed) is None, what="the push after the broker is back")

        # A slow write: the store's redis-server stopped while an add waits on it.
        assert store_redis.proc is not None
        pid = store_redis.proc.pid
        added: list[str] = []
        os.kill(pid, signal.SIGSTOP)
        try:
            adder = threading.Thread(target=lambda: added.append(client.add("slow", 1)["id"]))
            adder.start()
            time.sleep(STOPPED_S)  # stays: the write must be slow enough to be logged
        finally:
            os.kill(pid, signal.SIGCONT)
        adder.join(10)
        assert added

        # An outage: every add fails while the store is down, then one gets through.
        store_redis.stop()
        failed = 0
        for _ in range(5):
            with pytest.raises(Unavailable):
                client.add("outage", 1)
            failed += 1
        store_redis.start()

        def add_once_back() -> bool:
            nonlocal failed
            try:
                client.add("outage", 1)
            except DelaywheelError:
                failed += 1
                return False
            return True

        wait_for(add_once_back, what="an add after the store is back")
    return Ids(dead, failed)


def check_events(
    events: list[Event], log_format: str, ids: Ids, store: str, http_port: int, down_port: int
) -> None:
    is_json = log_format == "json"
    start, _ = one(
        events, rf"delaywheel {re.escape(__version__)} starting: .*", "INFO", "delaywheel"
    )
    settings_text = start.message.split(": ", 1)[1]
    for name in (field.name for field in dataclasses.fields(Settings)):
        assert f" {name}=" in f" {settings_text}", name
    assert 'token="***"' in settings_text and 'signing_secret="***"' in settings_text
    assert f'store_url="{store}"' in settings_text
    if is_json:
        shown = start.fields["settings"]
        assert list(shown) == [field.name for field in dataclasses.fields(Settings)]
        assert (shown["token"], shown["signing_secret"], shown["store_url"]) == (
            "***",
            "***",
            store,
        )
        assert shown["brokers"][1] == f"down=amqp://guest:***@127.0.0.1:{down_port}/"
        assert shown["slow_flush_s"] == SLOW_FLUSH_S
        assert start.fields["version"] == __version__

    connected, _ = one(events, rf"store {re.escape(store)} connected", "INFO", "delaywheel")
    one(events, rf"loaded 0 tasks from {re.escape(store)} in \d+\.\d\d s", "INFO", "delaywheel")
    one(events, r"delaywheel listening on 127\.0\.0\.1:\d+", "INFO", "delaywheel")

    url = f"http://127.0.0.1:{http_port}/hook"
    death, _ = one(
        events,
        re.escape(
            f"task {ids.dead!r} (topic 'hooks') is dead after 1 attempt to http POST {url}: "
            f"HTTP 500 from {url}"
        ),
        "WARNING",
        "delaywheel.delivery",
    )
    if is_json:
        assert {k: death.fields[k] for k in ("task_id", "topic", "attempts")} == {
            "task_id": ids.dead,
            "topic": "hooks",
            "attempts": 1,
        }
        assert (death.fields["target_type"], death.fields["destination"]) == ("http", f"POST {url}")
        assert death.fields["error"] == f"HTTP 500 from {url}"

    one(
        events,
        re.escape(f"task {ids.dead!r} attempt 1 to http://127.0.0.1:{http_port} failed: ")
        + re.escape(f"HTTP 500 from {url}"),
        "INFO",
        "delaywheel.delivery.dispatcher",
    )

    peer = r"127\.0\.0\.1:\d+"
    one(
        events,
        rf"closing connection from {peer}: bad_request: undecodable MessagePack byte 0xc1 at "
        r"stream offset 0",
        "INFO",
        "delaywheel.connection",
    )
    refusal, _ = one(
        events,
        rf"closing connection from {peer}: bad_request: a message must be an array, got str "
        r"\[input not logged\]",
        "INFO",
        "delaywheel.connection",
    )
    if is_json:
        assert refusal.fields["code"] == "bad_request"
        assert re.fullmatch(peer, refusal.fields["peer"])

    rb = r"broker 'rb' \(redis://:\*\*\*@127\.0\.0\.1:\d+/0\)"
    logger = "delaywheel.delivery.brokers"
    one(events, rf"{rb} connected", "INFO", logger)
    one(events, rf"{rb} unreachable: .*; reconnecting in the background", "WARNING", logger)
    one(events, rf"{rb} is back after \d+\.\d s", "INFO", logger)
    down = rf"broker 'down' \(amqp://guest:\*\*\*@127\.0\.0\.1:{down_port}/\)"
    one(events, rf"{down} unreachable: .*; reconnecting in the background", "WARNING", logger)

    slow, match = one(
        events,
        rf"slow store write: (\d+) changes took (\d+\.\d\d) s \(threshold {SLOW_FLUSH_S:g} s\)",
        "WARNING",
        "delaywheel.store",
    )
    assert int(match[1]) == 1 and float(match[2]) >= STOPPED_S - 0.1
    if is_json:
        assert slow.fields["changes"] == 1 and slow.fields["duration_s"] >= STOPPED_S - 0.1

    one(
        events,
        rf"store {re.escape(store)} lost: write failed: .*; "
        "writes answer unavailable until it is back",
        "WARNING",
        "delaywheel.store",
    )
    back, match = one(
        events,
        rf"store {re.escape(store)} back after (\d+\.\d) s; (\d+) writes \((\d+) changes\) "
        "failed meanwhile",
        "INFO",
        "delaywheel.store",
    )
    # Each failed add was one write of one change (nothing else was changing).
    assert int(match[2]) == int(match[3]) == ids.failed_writes
    if is_json:
        assert back.fields["failed_writes"] == ids.failed_writes
        assert back.fields["store"] == store == connected.fields["store"]

    # The wrong token: one line for the burst, naming the address, not the token.
    one(
        events,
        r"failed sign-in from 127\.0\.0\.1 \(protocol\): after 5 failures in a row it is "
        r"refused for a growing time, up to 60 s",
        "WARNING",
        "delaywheel.auth",
    )
    one(events, "shutting down", "INFO", "delaywheel")
    # The first node of a keyspace writes its first assignment record (docs/ha.md).
    one(
        events,
        r"assignment generation 1: 1 node\(s\), 0 partition\(s\) move",
        "INFO",
        "delaywheel.cluster",
    )
    # A node of a keyspace says what its stop handed over (docs/ha.md).
    stopped, match = one(
        events, r"stopped: handed back (\d+) partitions in [\d.]+ s", "INFO", "delaywheel.cluster"
    )
    assert int(match[1]) == 16  # every partition, the node being alone
    if is_json:
        assert stopped.fields["partitions"] == 16 and stopped.fields["duration_s"] >= 0
    # Nothing else, from any logger: the push's failed attempts while its broker
    # was down, and the store's Redis as a broker, are the only other lines.
    others = [e for e in events if not e.checked and not re.fullmatch(OTHER_LINES, e.message)]
    assert others == []


def test_log_level_and_format_from_the_environment() -> None:
    # At warning the listening line (INFO) is not logged either, so the port is
    # chosen here rather than read from it.
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "delaywheel", "serve", "--port", str(port), "--store", "memory://"],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "DELAYWHEEL_LOG_FORMAT": "json", "DELAYWHEEL_LOG_LEVEL": "warning"},
    )
    try:
        wait_for(lambda: _answers(port), timeout_s=30)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, log_text = proc.communicate(timeout=30)
    events = parse_log(log_text, "json")
    assert {e.level for e in events} == {"WARNING"}  # no start line, no "shutting down"
    assert any(e.message.startswith("store memory://: ") for e in events)
    assert not any("listening" in e.message for e in events)


def _answers(port: int) -> bool:
    try:
        with Client("127.0.0.1", port) as client:
            client.ping()
    except DelaywheelError:
        return False
    return True
