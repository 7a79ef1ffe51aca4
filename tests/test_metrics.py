"""Prometheus metrics (docs/metrics.md): the real server scraped over HTTP.

Each test starts ``delaywheel serve --metrics-port 0`` (tests/serverproc.py),
reads the endpoint's address from its ``metrics on`` line, drives the server
with the client (and a local HTTP endpoint for deliveries), then scrapes with
a plain GET and parses with prometheus-client's own parser. Waiting is done
by scraping too, so the requests counted are exactly the test's own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from conftest import RedisServer
from delaywheel_client import Client
from delaywheel_client.errors import BadRequest, NoMethod, NotFound, Unavailable
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from serverproc import ServerProcess
from waiting import wait_until as wait_for

from delaywheel.config import Settings
from delaywheel.engine.engine import Engine
from delaywheel.engine.queues import Waiter
from delaywheel.engine.task import STATES
from delaywheel.metrics import registry_for
from delaywheel.net.server import Server
from delaywheel.store.memory import MemoryStore
from delaywheel.tallies import LATENESS_BOUNDS_S

DOCS = Path(__file__).resolve().parent.parent / "docs"
METRICS_LINE = re.compile(r"metrics on (http://\S+/metrics)")
DELIVERY_ARGS = ("--http-allow", "127.0.0.1", "--retry-base", "0.2", "--retry-cap", "1")

Labels = frozenset[tuple[str, str]]


class Scrape:
    """One scrape: every sample by (name, labels), and each family's type."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.samples: dict[tuple[str, Labels], float] = {}
        self.types: dict[str, str] = {}
        for family in text_string_to_metric_families(text):
            self.types[family.name] = family.type
            for sample in family.samples:
                self.samples[sample.name, frozenset(sample.labels.items())] = sample.value

    def __call__(self, name: str, **labels: str) -> float:
        """The value of one sample; KeyError when there is none."""
        return self.samples[name, frozenset(labels.items())]

    def series(self, name: str) -> dict[Labels, float]:
        return {labels: value for (n, labels), value in self.samples.items() if n == name}

    def names(self) -> set[str]:
        return set(self.types) | {name for name, _ in self.samples}


def metrics_url(proc: ServerProcess) -> str:
    for line in proc.log:
        match = METRICS_LINE.search(line)
        if match:
            return match.group(1)
    raise AssertionError("no 'metrics on' line:\n" + proc.log_text())


def scrape(proc: ServerProcess) -> Scrape:
    with urllib.request.urlopen(metrics_url(proc), timeout=10) as reply:
        assert reply.status == 200
        assert reply.headers["Content-Type"].startswith("text/plain")
        return Scrape(reply.read().decode())


def until(proc: ServerProcess, name: str, value: float, **labels: str) -> Scrape:
    """Scrape until the sample has ``value``; returns that scrape."""
    return until_all(proc, {(name, frozenset(labels.items())): value})


def until_all(proc: ServerProcess, wanted: dict[tuple[str, Labels], float]) -> Scrape:
    """Scrape until every sample has its value; returns that scrape."""

    def reached() -> Scrape | None:
        found = scrape(proc)
        return found if all(found.samples.get(key) == v for key, v in wanted.items()) else None

    return wait_for(reached, what=f"{wanted}")


def http_outcome(outcome: str) -> Labels:
    return frozenset({("target", "http"), ("outcome", outcome)})


@pytest.fixture
def endpoint() -> Iterator[str]:
    """``http://127.0.0.1:PORT``: ``/ok`` answers 200, anything else 500."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200 if self.path == "/ok" else 500)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def sqlite_server(tmp_path: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(
        *DELIVERY_ARGS, "--metrics-port", "0", store=f"sqlite:///{tmp_path / 'tasks.db'}"
    )
    try:
        yield proc
    finally:
        proc.stop()


def test_every_lifecycle_event_is_counted_exactly(
    sqlite_server: ServerProcess, endpoint: str
) -> None:
    proc = sqlite_server
    with Client(*proc.address) as client:
        ready = [client.add("a", n)["id"] for n in range(3)]
        later = client.add("b", "x", delay=3600)["id"]
        client.update(later, body="y")
        assert client.delete(later) and not client.delete("no-such-task")
        first = client.reserve("a")
        assert first is not None and first["id"] == ready[0]
        client.ack(first["id"])
        second = client.reserve("a")
        assert second is not None
        client.release(second["id"])
        # A TTR that runs out: back to ready, then reserved and acked.
        short = client.add("x", ttr=0.2)["id"]
        assert client.reserve("x") is not None
        until(proc, "delaywheel_tasks_expired_total", 1)
        again = client.reserve("x")
        assert again is not None and again["id"] == short
        client.ack(short)
        # Dead by a release on the last attempt; kicked, reserved, acked.
        last = client.add("y", max_attempts=1)["id"]
        assert client.reserve("y") is not None
        client.release(last)
        assert client.kick("y", 10) == 1
        assert client.reserve("y") is not None
        client.ack(last)
        # Dead by a TTR that runs out on the last attempt.
        client.add("z", ttr=0.2, max_attempts=1)
        assert client.reserve("z") is not None
        until(proc, "delaywheel_tasks_expired_total", 2)
        # An HTTP delivery that succeeds, and one that fails its only attempt.
        client.add("h", 1, target={"type": "http", "url": f"{endpoint}/ok"})
        client.add("h", 2, target={"type": "http", "url": f"{endpoint}/fail"}, max_attempts=1)
        # Errors: a bad id, a method that does not exist, a task that does not.
        with pytest.raises(BadRequest):
            client.call("get", 123)
        with pytest.raises(NoMethod):
            client.call("no_such_method")
        with pytest.raises(NotFound):
            client.ack("no-such-task")
        got = until_all(
            proc,
            {
                ("delaywheel_task_deaths_total", frozenset()): 3,
                ("delaywheel_deliveries_total", http_outcome("delivered")): 1,
                ("delaywheel_deliveries_total", http_outcome("failed")): 1,
            },
        )
        stats = client.stats()

    events = {
        "added": 9,  # 3 + 1 + x + y + z + 2 http
        "updated": 1,
        "deleted": 1,
        "reserved": 7,
        "acked": 3,
        "released": 2,
        "touched": 0,
        "expired": 2,
        "kicked": 1,
        "fired": 2,  # the two HTTP tasks fell due; added due now, the rest were ready at once
    }
    for event, n in events.items():
        assert got(f"delaywheel_tasks_{event}_total") == n, event
    assert got("delaywheel_task_deaths_total") == 3
    assert got("delaywheel_deliveries_total", target="http", outcome="delivered") == 1
    assert got("delaywheel_delivery_seconds_count", target="http", outcome="failed") == 1
    # Two deliveries fell due and two reservations ran out: four timers fired.
    assert got("delaywheel_fire_lateness_seconds_count") == 4
    assert got("delaywheel_fire_lateness_seconds_bucket", le="+Inf") == 4
    assert 0 <= got("delaywheel_fire_lateness_seconds_sum") < 4 * 2.5

    requests = {
        "add": 9,
        "update": 1,
        "delete": 2,
        "reserve": 7,
        "ack": 4,
        "release": 2,
        "kick": 1,
        "get": 1,
        "unknown": 1,
        "touch": 0,
        "stats": 0,  # the scrape came before the stats call
    }
    for method, n in requests.items():
        assert got("delaywheel_requests_total", method=method) == n, method
    assert got.series("delaywheel_request_errors_total") == {
        frozenset({("method", "get"), ("code", "bad_request")}): 1,
        frozenset({("method", "unknown"), ("code", "no_method")}): 1,
        frozenset({("method", "ack"), ("code", "not_found")}): 1,
    }
    assert got("delaywheel_connections") == 1
    assert got("delaywheel_connections_accepted_total") == 1

    # Stats and metrics agree on task counts: a2 released, a3 never reserved, two dead.
    assert {state: got("delaywheel_tasks", state=state) for state in stats["states"]} == {
        **stats["states"]
    }
    assert stats["states"] == {
        "delayed": 0,
        "ready": 2,
        "reserved": 0,
        "delivering": 0,
        "dead": 2,
        "done": 0,
    }
    topics = got.series("delaywheel_topic_tasks")
    shown = {
        topic: {state: int(topics[frozenset({("topic", topic), ("state", state)})]) for state in s}
        for topic, s in stats["topics"].items()
    }
    assert shown == stats["topics"]
    assert sum(topics.values()) == sum(stats["states"].values())
    assert got("delaywheel_topics") == len(stats["topics"]) == 3  # a, z, h

    assert got("delaywheel_store_up") == 1 and got("delaywheel_store_errors_total") == 0
    flushes = got("delaywheel_store_flushes_total")
    assert flushes == stats["flushes"]  # stats, which came after, is not journaled
    assert got("delaywheel_store_flush_seconds_count") == flushes >= 1
    assert got("delaywheel_store_flush_changes_count") == flushes
    assert got("delaywheel_store_flush_changes_sum") >= 20  # every journaled change, once
    assert got("delaywheel_info", version=stats["version"], store=stats["store"]) == 1


@pytest.mark.process
def test_topics_beyond_the_limit_are_summed_apart(tmp_path: Path) -> None:
    proc = ServerProcess("--metrics-port", "0", "--metrics-topics", "3")
    try:
        with Client(*proc.address) as client:
            for topic_number in range(1, 11):  # topic tN gets N tasks
                client.add_many([{"topic": f"t{topic_number}"}] * topic_number)
            client.add("t10", delay=3600)
            stats = client.stats()
            got = scrape(proc)
    finally:
        proc.stop()
    topics = got.series("delaywheel_topic_tasks")
    assert {dict(labels)["topic"] for labels in topics} == {"t10", "t9", "t8"}
    assert len(topics) == 3 * len(STATES)  # every state of each, zeros too
    assert got("delaywheel_topic_tasks", topic="t10", state="ready") == 10
    assert got("delaywheel_topic_tasks", topic="t10", state="delayed") == 1
    assert got("delaywheel_topic_tasks", topic="t9", state="dead") == 0
    assert got("delaywheel_other_topics_tasks", state="ready") == sum(range(1, 8))
    assert got("delaywheel_other_topics_tasks", state="delayed") == 0
    assert got("delaywheel_topics") == 10
    assert got("delaywheel_tasks", state="ready") == stats["states"]["ready"] == 55
    assert sum(topics.values()) + sum(got.series("delaywheel_other_topics_tasks").values()) == 56


@pytest.mark.process
@pytest.mark.redis
def test_a_store_that_goes_away_shows_in_the_metrics(tmp_path: Path) -> None:
    (tmp_path / "redis").mkdir()
    redis = RedisServer(tmp_path / "redis")
    redis.start()
    proc = ServerProcess("--metrics-port", "0", store=redis.url)
    try:
        with Client(*proc.address) as client:
            client.add("t")
            until(proc, "delaywheel_broker_up", 1, broker="store", kind="redis")
            redis.stop()
            with pytest.raises(Unavailable):
                client.add("t")
            got = scrape(proc)
            assert got("delaywheel_store_up") == 0
            assert got("delaywheel_store_errors_total") == 1
            assert got("delaywheel_request_errors_total", method="add", code="unavailable") == 1
            assert got("delaywheel_tasks", state="ready") == 1  # the failed add was undone
            redis.start()

            def added() -> bool:
                try:
                    client.add("t")
                except Unavailable:  # the store's reconnect backoff, up to 2 s
                    return False
                return True

            wait_for(added, what="an add once Redis is back")
            got = scrape(proc)
            assert got("delaywheel_store_up") == 1
            assert got("delaywheel_tasks", state="ready") == 2
            errors = got("delaywheel_store_errors_total")
            assert errors == got(
                "delaywheel_request_errors_total", method="add", code="unavailable"
            )
    finally:
        proc.stop()
        redis.stop()


@pytest.mark.process
def test_metrics_are_off_by_default() -> None:
    proc = ServerProcess()
    try:
        with Client(*proc.address) as client:
            client.ping()
        assert not any(METRICS_LINE.search(line) for line in proc.log)
        assert proc.proc is not None
        assert listening_ports(proc.proc.pid) == {proc.port}
    finally:
        proc.stop()


@pytest.mark.process
def test_a_server_without_metrics_does_not_import_them() -> None:
    """Importing the server (``app``, the CLI) loads neither prometheus-client
    nor aiohttp: a tenth of a second at every start that only metrics need."""
    code = (
        "import sys, delaywheel.app, delaywheel.cli, delaywheel.net.server; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'prometheus_client', 'aiohttp'}))"
    )
    found = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert found.strip() == "[]"


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` listens on (Linux's /proc)."""
    if not Path("/proc/net/tcp").exists():
        pytest.skip("needs Linux's /proc")
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


@pytest.mark.process
def test_a_scrape_is_valid_exposition_with_the_documented_metrics() -> None:
    proc = ServerProcess("--metrics-port", "0")
    try:
        got = scrape(proc)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(metrics_url(proc).removesuffix("metrics"), timeout=10)
        refused.value.close()
        assert refused.value.code == 404  # only /metrics is served
    finally:
        proc.stop()
    page = (DOCS / "metrics.md").read_text()
    documented = set(re.findall(r"^\| `(\w+)` \|", page, re.M))
    # A node of a shared Redis keyspace has more (tests/test_ha.py scrapes them).
    documented -= set(re.findall(r"^\| `(\w+)` \|.*shared Redis keyspace", page, re.M))
    ours = {name for name in got.types if name.startswith("delaywheel_")}
    counters = {name for name in ours if got.types[name] == "counter"}
    # Counters are documented by their sample name (..._total), the rest by family name.
    assert documented == {f"{name}_total" for name in counters} | (ours - counters)
    assert {"process_resident_memory_bytes", "python_gc_collections_total"} <= got.names()


def referenced_metrics(text: str) -> set[str]:
    return set(re.findall(r"\b((?:delaywheel|process|python)_[a-z_]+)\b", text))


def known(name: str, got: Scrape) -> bool:
    """Whether a name a query uses exists in the scrape, before it has a sample
    too (a labelled counter's ..._total, a histogram's _bucket, _count, _sum)."""
    if name in got.names():
        return True
    base, _, suffix = name.rpartition("_")
    if suffix == "total":
        return got.types.get(base) == "counter"
    return suffix in ("bucket", "count", "sum") and got.types.get(base) == "histogram"


@pytest.mark.process
def test_the_dashboard_and_the_alerts_use_only_metrics_the_server_has(redis_url: str) -> None:
    proc = ServerProcess("--metrics-port", "0")
    try:
        got = scrape(proc)
    finally:
        proc.stop()
    # A node of a shared Redis keyspace has the HA metrics the HA alerts use.
    node = ServerProcess("--metrics-port", "0", "--replicas", "0", store=redis_url)
    try:
        got_ha = scrape(node)
    finally:
        node.stop()
    dashboard = json.loads((DOCS / "grafana-dashboard.json").read_text())
    assert dashboard["title"] and dashboard["panels"]
    queries = [
        target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])
    ]
    assert len(queries) >= 6
    alerts_text = (DOCS / "alerts.yml").read_text()
    yaml = pytest.importorskip("yaml")
    alerts = yaml.safe_load(alerts_text)
    rules = [rule for group in alerts["groups"] for rule in group["rules"]]
    assert {rule["alert"] for rule in rules} >= {
        "DelaywheelStoreUnavailable",
        "DelaywheelStoreErrors",
        "DelaywheelLatenessHigh",
        "DelaywheelDeadTasksGrowing",
        "DelaywheelBrokerDisconnected",
        # high availability (docs/ha.md)
        "DelaywheelPartitionsUnowned",
        "DelaywheelWritesRefusedNoReplicas",
        "DelaywheelFailoverWouldStopWrites",
        "DelaywheelPartitionsLost",
        "DelaywheelTakeoversFrequent",
        "DelaywheelFencedFlushes",
    }
    for rule in rules:
        assert rule["expr"] and rule["labels"]["severity"] and rule["annotations"]["summary"]
    names = set().union(*map(referenced_metrics, queries + [rule["expr"] for rule in rules]))
    assert names and not {n for n in names if not (known(n, got) or known(n, got_ha))}
    if shutil.which("promtool"):
        subprocess.run(["promtool", "check", "rules", str(DOCS / "alerts.yml")], check=True)
        # The HA rules' expressions on made-up series (tests/alerts_test.yml).
        tests_yml = Path(__file__).parent / "alerts_test.yml"
        subprocess.run(["promtool", "test", "rules", str(tests_yml)], check=True)


def test_lateness_is_counted_per_fired_batch_as_one_observation_per_timer() -> None:
    """The batch count (``Firing._count_fired``: bisects on the fired list)
    against a histogram built one timer at a time, for timers spread over
    every bucket, overdue ones included."""

    async def main() -> None:
        store = MemoryStore("memory://")
        await store.open()
        t0 = 1_800_000_000.0
        engine = Engine(store, now_s=t0, tick_s=0.001)
        offsets = [0.0003 * i for i in range(1, 1000)] + [70.0, 70.0005, 120.0]
        due = [t0 + 200 - offset for offset in offsets]
        for at_s in due:
            engine.add({"topic": "t", "at": at_s}, t0)
        await engine.journal.drain()
        now_s = t0 + 200
        fired = 0
        while (n := engine.advance(now_s)) > 0:
            fired += n
        assert fired == len(due)
        expected = [0] * (len(LATENESS_BOUNDS_S) + 1)
        for at_s in due:
            late_s = now_s - at_s
            expected[sum(1 for bound in LATENESS_BOUNDS_S if bound < late_s)] += 1
        assert engine.firing.lateness.counts == expected
        assert engine.firing.lateness.total == pytest.approx(
            sum(now_s - at_s for at_s in due), abs=0.01
        )
        assert engine.events.fired == len(due)

    asyncio.run(main())


def test_stats_and_the_metrics_read_one_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    """``stats`` and ``/metrics`` show the engine's figures from one
    ``Engine.snapshot()``: they agree on a server holding a task in every
    state (a packed one and a blocked reserve too), and both show what a
    snapshot says when it says something else."""

    def both(server: Server, now_s: float) -> tuple[dict[str, Any], Scrape]:
        registry = registry_for(server, topics=20)
        return server.stats(now_s), Scrape(generate_latest(registry).decode())

    async def main() -> None:
        store = MemoryStore("memory://")
        await store.open()
        t0 = 1_800_000_000.0
        engine = Engine(store, now_s=t0, slots=10, tick_s=1.0)
        server = Server(Settings(store_url="memory://"), engine)
        engine.add({"id": "near", "topic": "a", "delay": 5}, t0)
        engine.add({"id": "far", "topic": "a", "delay": 500}, t0)  # packed once durable
        engine.add({"id": "ready", "topic": "b"}, t0)
        engine.add({"id": "held", "topic": "b", "at": t0 - 1}, t0)
        engine.add({"id": "dead", "topic": "c", "at": t0 - 2, "max_attempts": 1}, t0)
        assert engine.try_reserve("c", t0)["id"] == "dead"  # type: ignore[index]
        engine.release("dead", 0, t0)
        assert engine.try_reserve("b", t0)["id"] == "held"  # type: ignore[index]
        engine.wait_reserve(Waiter(["empty"], lambda task: None))
        await engine.journal.drain()

        stats, got = both(server, t0 + 3)
        assert stats["states"] == {
            "delayed": 2,
            "ready": 1,
            "reserved": 1,
            "delivering": 0,
            "dead": 1,
            "done": 0,
        }
        assert {state: got("delaywheel_tasks", state=state) for state in stats["states"]} == {
            **stats["states"]
        }
        topics = got.series("delaywheel_topic_tasks")
        assert {
            topic: {state: topics[frozenset({("topic", topic), ("state", state)})] for state in s}
            for topic, s in stats["topics"].items()
        } == stats["topics"]
        assert got("delaywheel_topics") == len(stats["topics"]) == 3
        assert got("delaywheel_packed_tasks") == stats["wheel"]["packed"] == 1
        assert got("delaywheel_waiting_reserves") == stats["waiting_reserves"] == 1
        assert got("delaywheel_store_flushes_total") == stats["flushes"] >= 1
        assert got("delaywheel_info", version=stats["version"], store=stats["store"]) == 1
        assert got("delaywheel_start_time_seconds") == t0 + 3 - stats["uptime"] == t0

        real = engine.snapshot()
        other = dataclasses.replace(real, packed=7, waiting_reserves=3, flushes=11, store="x://")
        monkeypatch.setattr(engine, "snapshot", lambda: other)
        stats, got = both(server, t0 + 3)
        assert got("delaywheel_packed_tasks") == stats["wheel"]["packed"] == 7
        assert got("delaywheel_waiting_reserves") == stats["waiting_reserves"] == 3
        assert got("delaywheel_store_flushes_total") == stats["flushes"] == 11
        assert got("delaywheel_info", version=stats["version"], store="x://") == 1
        assert stats["store"] == "x://"

    asyncio.run(main())


# -- schedules ---------------------------------------------------------------------------


def test_schedule_metrics_count_fired_skipped_missed_and_lateness() -> None:
    """An in-process engine on a manual clock, for exact figures: one schedule
    fires on time twice (30 ms late each: its lateness), one is held by its
    reserved previous occurrence (overlap skip), one every second is looked at
    only every 10 s (catchup skip: all missed), and a paused one is counted."""

    async def main() -> None:
        store = MemoryStore("memory://")
        await store.open()
        t0 = 1_800_000_000.0  # a multiple of 10: occurrences at t0 + 10 k
        engine = Engine(store, now_s=t0, tick_s=0.01)
        server = Server(Settings(store_url="memory://"), engine)
        engine.schedule_add({"id": "on", "every": 10, "topic": "on", "ttr": 0}, t0)
        engine.schedule_add({"id": "held", "every": 10, "topic": "held", "ttr": 60}, t0)
        engine.schedule_add({"id": "down", "every": 1, "topic": "d", "catchup": "skip"}, t0)
        engine.schedule_add({"id": "p", "every": 10, "topic": "p"}, t0)
        engine.schedule_pause("p", "quiet")
        engine.advance(t0 + 10.03)  # on, held: fired; down: 1..10 missed
        assert engine.try_reserve("held", t0 + 10.03) is not None  # reserved, never acked
        assert engine.try_reserve("on", t0 + 10.03) is not None  # ttr 0: gone
        engine.advance(t0 + 20.03)  # on: fired; held: skipped; down: 11..20 missed
        await engine.journal.drain()
        got = Scrape(generate_latest(registry_for(server, topics=20)).decode())

        states = [engine.schedule_get(sid) for sid in ("on", "held", "p", "down")]
        totals = {name: sum(s["counts"][name] for s in states) for name in COUNTS}  # type: ignore[index]
        assert totals == {"fired": 3, "skipped": 1, "missed": 20}
        assert got("delaywheel_schedules", paused="false") == 3
        assert got("delaywheel_schedules", paused="true") == 1
        assert got("delaywheel_schedule_occurrences_fired_total") == 3
        assert got("delaywheel_schedule_occurrences_skipped_total", reason="overlap") == 1
        assert got("delaywheel_schedule_occurrences_missed_total") == 20
        lateness = "delaywheel_schedule_fire_lateness_seconds"
        assert got(f"{lateness}_count") == 3
        assert got(f"{lateness}_bucket", le="0.025") == 0
        assert got(f"{lateness}_bucket", le="0.05") == 3
        assert got(f"{lateness}_sum") == pytest.approx(0.09)
        assert server.stats(t0 + 21)["schedules"] == {"count": 4, "paused": 1}

    asyncio.run(main())


def test_topic_settings_metrics_show_pauses_and_limits() -> None:
    async def main() -> None:
        store = MemoryStore("memory://")
        await store.open()
        now_s = time.time()
        engine = Engine(store, now_s=now_s)
        server = Server(Settings(store_url="memory://"), engine)
        engine.topic_set("held", {"paused_until": now_s + 3600}, now_s)
        engine.topic_set("hooks", {"rate": 2.5, "concurrency": 4}, now_s)
        got = Scrape(generate_latest(registry_for(server, topics=20)).decode())
        assert got("delaywheel_topic_paused", topic="held") == 1
        assert got("delaywheel_topic_paused", topic="hooks") == 0
        assert got("delaywheel_topic_rate_limit", topic="hooks") == 2.5
        assert got("delaywheel_topic_concurrency_limit", topic="hooks") == 4
        assert server.stats(now_s)["topic_settings"]["hooks"]["rate"] == 2.5
        await engine.journal.drain()

    asyncio.run(main())


@pytest.mark.process
@pytest.mark.slow
def test_a_servers_schedule_metrics_match_the_schedules_counts() -> None:
    """A real server, stopped (SIGSTOP) for 2.5 s across the occurrences of
    two schedules firing every second: the metrics agree with what
    schedule_get counts, and the stop shows as missed and skipped."""
    proc = ServerProcess("--metrics-port", "0")
    try:
        with Client(*proc.address) as dw:
            assert scrape(proc)("delaywheel_schedule_occurrences_fired_total") == 0
            dw.schedule_add({"id": "held", "every": 1, "topic": "held", "ttr": 60})
            dw.schedule_add({"id": "gap", "every": 1, "topic": "gap", "ttr": 0, "catchup": "skip"})
            dw.schedule_add({"id": "quiet", "every": 60, "topic": "q"})
            dw.schedule_pause("quiet")
            assert dw.reserve("held", timeout=3) is not None  # held past the stop
            assert proc.proc is not None
            proc.proc.send_signal(signal.SIGSTOP)
            time.sleep(2.5)  # the time passing is what is tested
            proc.proc.send_signal(signal.SIGCONT)

            def after_the_stop() -> bool:
                counts = dw.schedule_get("gap")["counts"]  # type: ignore[index]
                return bool(counts["missed"] >= 2 and counts["fired"] >= 1)

            wait_for(after_the_stop, what="the stop counted as missed, then a fire")
            counts = [dw.schedule_pause(sid)["counts"] for sid in ("held", "gap")]
        got = scrape(proc)
    finally:
        proc.stop()
    fired, skipped, missed = (sum(c[name] for c in counts) for name in COUNTS)
    assert got("delaywheel_schedules", paused="true") == 3
    assert got("delaywheel_schedules", paused="false") == 0
    assert got("delaywheel_schedule_occurrences_fired_total") == fired >= 2  # held's, gap's
    assert got("delaywheel_schedule_occurrences_skipped_total", reason="overlap") == skipped >= 1
    assert got("delaywheel_schedule_occurrences_missed_total") == missed >= 2
    assert got("delaywheel_schedule_fire_lateness_seconds_count") == fired


COUNTS = ("fired", "skipped", "missed")
