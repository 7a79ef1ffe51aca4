"""Delivery headers: the partition epoch on every delivery, and what a schedule's
occurrence says of itself (docs/delivery.md, docs/protocol.md).

- The occurrence's fields from its id and its schedule's zone, and in the
  engine's task maps: the zone from the schedule's record, UTC once it is
  deleted (unit).
- A real server (memory store, a 50 ms tick) and a real HTTP endpoint: an
  ``every`` schedule's deliveries carry ``Delaywheel-Schedule``,
  ``Delaywheel-Nominal``, ``-Nominal-Local``, ``-Late-By`` and
  ``Idempotency-Key`` = the task id; a cron schedule in Europe/London,
  backfilled over the spring change, shows the local offsets; a ready-queue
  occurrence's task map has the fields; a plain task has none of them, and
  epoch 0 (a single-node store has no epochs).
- The senders against the machine's RabbitMQ and NATS and a private Redis.
- Two nodes on one Redis: each delivery's epoch is the one ``cluster`` shows
  for its partition.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import msgpack
import pytest
import redis
from brokerkit import (
    AMQP_URL,
    NATS_URL,
    amqp_target,
    delivery,
    jetstream_stream,
    nats_target,
    rabbit_queue,
    run,
    started,
)
from clusternodes import node as _node
from clusternodes import owned_once as _settled
from delaywheel_client import Client, ClusterClient
from delaywheel_client.partitions import parse_occurrence, partition_of
from endpoint import Endpoint, Seen
from endpoint import endpoint as endpoint  # the fixture
from hacheck import Sink
from serverproc import ServerProcess
from waiting import wait_until

from delaywheel.delivery.brokers import Brokers
from delaywheel.engine.engine import Engine
from delaywheel.schedules.occurrence import Occurrence, occurrence
from delaywheel.schedules.spec import check_spec
from delaywheel.store.memory import MemoryStore

LONDON_SPEC = {"cron": "30 1 * * *", "tz": "Europe/London"}
LONDON = check_spec(LONDON_SPEC, 1.0)
# The 01:30 of 2026-03-29, Europe/London's spring change, is in the gap: it
# fires at the first instant after it, 02:00 BST (Debian cron's rule).
SPRING_NOMINALS = {
    1774661400: ("2026-03-28T01:30:00Z", "2026-03-28T01:30:00+00:00"),
    1774746000: ("2026-03-29T01:00:00Z", "2026-03-29T02:00:00+01:00"),
    1774830600: ("2026-03-30T00:30:00Z", "2026-03-30T01:30:00+01:00"),
}
ISO_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{3})?Z")
OCCURRENCE_HEADERS = (
    "Delaywheel-Schedule",
    "Delaywheel-Nominal",
    "Delaywheel-Nominal-Local",
    "Delaywheel-Late-By",
    "Idempotency-Key",
)
OCCURRENCE_FIELDS = ("schedule", "nominal", "nominal_local", "late_by")
NOMINAL_MS = 1774746000_000
OCCURRENCE = Occurrence("nightly", NOMINAL_MS, spec=LONDON)
TASK_ID = "s:nightly:1774746000"
OCCURRENCE_SENT = {"task_id": TASK_ID, "epoch": 7, "occurrence": OCCURRENCE}


# -- the occurrence from its id (unit) ------------------------------------------------


def test_an_occurrence_id_gives_the_schedule_and_the_nominal_time() -> None:
    assert parse_occurrence("s:a:b:1774746000") == ("a:b", 1774746000_000)  # to the last colon
    assert parse_occurrence("s:beat:12.5") == ("beat", 12_500)  # a fractional every
    for plain in ("t-1", "s:x:", "s:x:12a", "s::12", "x:s:1", "s:x:99999999999999"):
        assert parse_occurrence(plain) is None, plain
    found = occurrence("s:nightly:1774746000", LONDON)
    assert found is not None
    assert (found.nominal_utc, found.nominal_local) == SPRING_NOMINALS[1774746000]
    assert found.nominal_s == 1774746000
    assert found.late_by_s(1774746000 + 12.3456) == 12.346
    assert found.late_by_s(1774746000 - 1) == 0.0  # never negative
    gone = Occurrence("nightly", 1774746000_500)  # a deleted schedule's: UTC
    assert gone.nominal_utc == "2026-03-29T01:00:00.500Z"
    assert gone.nominal_local == "2026-03-29T01:00:00.500+00:00"
    assert gone.nominal_s == 1774746000.5


def test_the_local_time_follows_the_schedules_record_and_is_utc_once_it_is_gone() -> None:
    async def scenario() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        store = MemoryStore("memory://")
        await store.open()
        now_s = time.time()
        engine = Engine(store, now_s=now_s, tick_s=0.05)
        engine.schedule_add({"id": "nightly", **LONDON_SPEC, "topic": "n"}, now_s)
        engine.schedule_backfill("nightly", 1774746000, 1774746000, now_s)
        engine.add({"topic": "plain", "id": "s:x:y"}, now_s)  # not an occurrence's form
        kept = engine.get(TASK_ID)
        engine.schedule_delete("nightly")
        gone = engine.get(TASK_ID)
        plain = engine.get("s:x:y")
        await engine.journal.drain()
        await store.close()
        assert kept is not None and gone is not None and plain is not None
        return kept, gone, plain

    kept, gone, plain = asyncio.run(scenario())
    assert (kept["schedule"], kept["nominal"]) == ("nightly", 1774746000)
    assert kept["nominal_local"] == "2026-03-29T02:00:00+01:00"
    assert gone["nominal_local"] == "2026-03-29T01:00:00+00:00"  # deleted: UTC
    assert "late_by" not in kept  # only a reserve's answer has it
    assert [name for name in OCCURRENCE_FIELDS if name in plain] == []


# -- a real server, a real endpoint -------------------------------------------------


def _first(endpoint: Endpoint, prefix: str) -> dict[str, Seen]:
    """The first request for each task id starting with ``prefix``, by id."""
    found: dict[str, Seen] = {}
    for seen in endpoint.requests():
        found.setdefault(seen.headers.get("Delaywheel-Id", ""), seen)
    return {task_id: seen for task_id, seen in found.items() if task_id.startswith(prefix)}


@pytest.fixture(scope="module")
def headers_server() -> Iterator[ServerProcess]:
    proc = ServerProcess("--http-allow", "127.0.0.1")
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def dw(headers_server: ServerProcess) -> Iterator[Client]:
    with Client(*headers_server.address) as client:
        yield client


def _nominal_s(task_id: str) -> float:
    return float(task_id.rsplit(":", 1)[1])


def test_an_every_schedules_deliveries_carry_the_occurrence(dw: Client, endpoint: Endpoint) -> None:
    url = endpoint.url("/ok")
    target = {"type": "http", "url": url, "headers": {"Idempotency-Key": "mine"}}
    dw.schedule_add({"id": "beat", "every": 0.5, "topic": "beats", "target": target})
    plain = dw.add("plain", {"n": 1}, target={"type": "http", "url": url})["id"]
    try:
        wait_until(lambda: len(_first(endpoint, "s:beat:")) >= 2, 10, "two occurrences delivered")
    finally:
        dw.schedule_delete("beat")
    wait_until(lambda: plain in _first(endpoint, plain), 10, "the plain task delivered")
    for task_id, seen in _first(endpoint, "s:beat:").items():
        at_s, headers = seen.at_s, seen.headers
        nominal_s = _nominal_s(task_id)
        assert headers["Delaywheel-Schedule"] == "beat"
        assert ISO_UTC.fullmatch(headers["Delaywheel-Nominal"]), headers
        nominal = datetime.fromisoformat(headers["Delaywheel-Nominal"].replace("Z", "+00:00"))
        assert nominal.timestamp() == nominal_s
        local = datetime.fromisoformat(headers["Delaywheel-Nominal-Local"])
        assert local.utcoffset() == timedelta(0)
        assert local.timestamp() == nominal_s  # every counts in UTC
        late_by_s = float(headers["Delaywheel-Late-By"])
        assert re.fullmatch(r"\d+\.\d{3}", headers["Delaywheel-Late-By"])
        assert 0 <= late_by_s <= at_s - nominal_s + 0.01  # counted when it went out
        assert headers["Idempotency-Key"] == task_id  # the server's, over the template's
        assert headers["Delaywheel-Epoch"] == "0"  # a single-node store
    headers = _first(endpoint, plain)[plain].headers
    assert headers["Delaywheel-Epoch"] == "0"
    assert [name for name in OCCURRENCE_HEADERS if name in headers] == []


def test_a_london_cron_schedule_shows_the_local_offset(dw: Client, endpoint: Endpoint) -> None:
    target = {"type": "http", "url": endpoint.url("/ok")}
    dw.schedule_add(
        {
            "id": "nightly",
            "cron": "30 1 * * *",
            "tz": "Europe/London",
            "topic": "n",
            "target": target,
        }
    )
    try:
        start = datetime(2026, 3, 28, tzinfo=timezone.utc).timestamp()
        put = dw.schedule_backfill("nightly", start, start + 3 * 86_400)
        assert sorted(put["ids"]) == [f"s:nightly:{s}" for s in sorted(SPRING_NOMINALS)]
        wait_until(lambda: len(_first(endpoint, "s:nightly:")) == 3, 10, "the backfill delivered")
    finally:
        dw.schedule_delete("nightly")
    for seconds, (utc, local) in SPRING_NOMINALS.items():
        seen = _first(endpoint, "s:nightly:")[f"s:nightly:{seconds}"]
        at_s, headers = seen.at_s, seen.headers
        assert (headers["Delaywheel-Nominal"], headers["Delaywheel-Nominal-Local"]) == (utc, local)
        assert abs(float(headers["Delaywheel-Late-By"]) - (at_s - seconds)) < 1.0


def test_a_reserved_occurrence_carries_the_fields(dw: Client) -> None:
    dw.schedule_add({"id": "ticks", "every": 0.5, "topic": "ticks"})
    try:
        task = dw.reserve("ticks", timeout=10)
        reserved_s = time.time()
    finally:
        dw.schedule_delete("ticks")
    assert task is not None and task["id"].startswith("s:ticks:")
    nominal_s = _nominal_s(task["id"])
    assert task["schedule"] == "ticks"
    assert task["nominal"] == nominal_s
    assert datetime.fromisoformat(task["nominal_local"]).timestamp() == nominal_s
    assert 0 <= task["late_by"] <= reserved_s - nominal_s + 0.01
    got = dw.get(task["id"])  # a get shows what it is, not how late a reserve was
    assert got is not None
    assert [got[name] for name in OCCURRENCE_FIELDS[:3]] == [task[f] for f in OCCURRENCE_FIELDS[:3]]
    assert "late_by" not in got
    dw.ack(task["id"])
    dw.add("plain-q", {"n": 1})
    plain = dw.reserve("plain-q", timeout=5)
    assert plain is not None
    assert [name for name in OCCURRENCE_FIELDS if name in plain] == []


# -- the senders against real brokers ---------------------------------------------------


@pytest.mark.brokers("rabbitmq")
def test_amqp_headers_carry_the_epoch_and_the_occurrence() -> None:
    async def scenario() -> dict[str, Any]:
        async with rabbit_queue() as queue, started(Brokers({"mq": AMQP_URL})) as brokers:
            sender = brokers.sender("mq")
            target = amqp_target(queue.name)
            await sender.send(delivery(target, **OCCURRENCE_SENT))
            await sender.send(delivery(target, task_id="plain", epoch=3))
            got = [await queue.get(timeout=5, no_ack=True) for _ in range(2)]
            return {message.message_id: message.headers for message in got if message}

    sent_s = time.time()
    headers = run(scenario())
    late_by_s = headers[TASK_ID].pop("delaywheel-late-by")
    assert headers[TASK_ID] == {
        "delaywheel-topic": "emails",
        "delaywheel-attempt": 1,
        "delaywheel-epoch": 7,
        "delaywheel-schedule": "nightly",
        "delaywheel-nominal": "2026-03-29T01:00:00Z",
        "delaywheel-nominal-local": "2026-03-29T02:00:00+01:00",
    }
    assert abs(late_by_s - (sent_s - NOMINAL_MS / 1000)) < 30
    assert headers["plain"] == {
        "delaywheel-topic": "emails",
        "delaywheel-attempt": 1,
        "delaywheel-epoch": 3,
    }


@pytest.mark.brokers("nats")
def test_nats_headers_carry_the_epoch_and_the_occurrence() -> None:
    async def scenario() -> list[dict[str, str]]:
        async with (
            jetstream_stream() as (js, stream, prefix),
            started(Brokers({"bus": NATS_URL})) as brokers,
        ):
            sender = brokers.sender("bus")
            target = nats_target(f"{prefix}.beat")
            await sender.send(delivery(target, **OCCURRENCE_SENT))
            await sender.send(delivery(target, task_id="plain", epoch=3))
            return [(await js.get_msg(stream, seq)).headers for seq in (1, 2)]

    sent_s = time.time()
    first, second = run(scenario())
    late_by_s = float(first.pop("Delaywheel-Late-By"))
    assert first == {
        "Content-Type": "application/json",
        "Delaywheel-Topic": "emails",
        "Delaywheel-Attempt": "1",
        "Delaywheel-Epoch": "7",
        "Nats-Msg-Id": TASK_ID,
        "Delaywheel-Schedule": "nightly",
        "Delaywheel-Nominal": "2026-03-29T01:00:00Z",
        "Delaywheel-Nominal-Local": "2026-03-29T02:00:00+01:00",
    }
    assert abs(late_by_s - (sent_s - NOMINAL_MS / 1000)) < 30
    assert second["Delaywheel-Epoch"] == "3"
    assert [name for name in OCCURRENCE_HEADERS if name in second] == []


def test_redis_entries_carry_the_epoch_and_the_occurrence(redis_url: str) -> None:
    listed = {"type": "redis", "key": "jobs", "mode": "list", "broker": "r"}
    streamed = {"type": "redis", "key": "events", "mode": "stream", "broker": "r"}

    async def scenario() -> None:
        async with started(Brokers({"r": redis_url})) as brokers:
            sender = brokers.sender("r")
            for target in (listed, streamed):
                await sender.send(delivery(target, "hi", **OCCURRENCE_SENT))
                await sender.send(delivery(target, "hi", task_id="plain", epoch=3))

    sent_s = time.time()
    run(scenario())
    with redis.Redis.from_url(redis_url) as client:
        plain_entry, entry = (msgpack.unpackb(raw) for raw in client.lrange("jobs", 0, -1))
        fields, plain_fields = (f for _entry_id, f in client.xrange("events"))
    late_by_s = entry.pop("late_by")
    assert entry == {
        "id": TASK_ID,
        "topic": "emails",
        "body": "hi",
        "attempt": 1,
        "at": 1_700_000_000.25,
        "epoch": 7,
        "schedule": "nightly",
        "nominal": 1774746000,
        "nominal_local": "2026-03-29T02:00:00+01:00",
    }
    assert abs(late_by_s - (sent_s - NOMINAL_MS / 1000)) < 30
    assert plain_entry["epoch"] == 3 and "schedule" not in plain_entry
    assert (fields[b"epoch"], fields[b"schedule"], fields[b"nominal"]) == (
        b"7",
        b"nightly",
        b"1774746000",
    )
    assert fields[b"nominal_local"] == b"2026-03-29T02:00:00+01:00"
    assert abs(float(fields[b"late_by"]) - late_by_s) < 30
    assert plain_fields[b"epoch"] == b"3" and b"schedule" not in plain_fields


# -- two nodes: the epoch is the partition's ------------------------------------------


def _agreed_map(nodes: list[ServerProcess]) -> list[dict[str, Any]] | None:
    """The owners every node shows, once each shows an owner for every partition
    and all show the same (a node's map is its last look at the leases)."""
    seen = []
    for node in nodes:
        with Client(*node.address) as dw:
            seen.append(dw.cluster()["owners"])
    complete = all(entry["node"] is not None for owners in seen for entry in owners)
    return seen[0] if complete and all(owners == seen[0] for owners in seen) else None


@pytest.mark.process
@pytest.mark.slow
def test_each_delivery_carries_its_partitions_epoch_from_cluster(redis_url: str) -> None:
    sink = Sink()
    nodes = [_node(redis_url, name, "--http-allow", "127.0.0.1") for name in ("a", "b")]
    try:
        wait_until(lambda: _settled(*nodes), 15, "the two nodes to share the partitions")
        wait_until(lambda: _agreed_map(nodes) is not None, 15, "both nodes' maps to agree")
        before = _agreed_map(nodes)
        ids = [f"e-{n}" for n in range(40)]
        with ClusterClient([f"{node.host}:{node.port}" for node in nodes]) as dw:
            for task_id in ids:
                dw.add("t", None, id=task_id, delay=0.1, target={"type": "http", "url": sink.url})
        wait_until(lambda: len(sink.received()) >= len(ids), 15, "every task delivered")
        after = _agreed_map(nodes)
    finally:
        for node in nodes:
            node.stop()
        sink.close()
    assert before is not None and before == after  # no move in between: one epoch each
    epochs = {entry["partition"]: entry["epoch"] for entry in before}
    seen = {got.task_id: got.epoch for got in sink.received()}
    assert sorted(seen) == sorted(ids)
    assert seen == {task_id: epochs[partition_of(task_id, len(before))] for task_id in ids}
    assert all(epoch is not None and epoch >= 1 for epoch in seen.values())
