"""The pieces of the log, in process: the JSON format, the settings as the start
line shows them, refusals and destinations without secrets, the store's outage
and slow-write lines, a death logged once durable, and loading's progress. The real server's log
is tests/test_logging.py."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import re
import sys
from pathlib import Path
from typing import Any

import pytest

import delaywheel.engine.cold
from delaywheel.config import Settings
from delaywheel.delivery.allow import AllowList
from delaywheel.delivery.targets import TargetRules, destination
from delaywheel.engine.engine import Engine
from delaywheel.engine.retry import RetryPolicy
from delaywheel.logs import JsonFormatter, shown_settings
from delaywheel.net.connlog import loggable
from delaywheel.store.base import Changes, Done, StoreUnavailable
from delaywheel.store.memory import MemoryStore
from delaywheel.store.watch import StoreWatch

TOKEN = "token-c0ffee"
SIGNING_SECRET = "signing-c0ffee"
STORE_PASSWORD = "storepw-c0ffee"
BROKER_PASSWORD = "brokerpw-c0ffee"
NATS_TOKEN = "natstoken-c0ffee"
QUERY_SECRET = "query-c0ffee"
AUTH_SECRET = "bearer-c0ffee"
MARKER = "body-marker-c0ffee"
ISO_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


# -- the JSON format, the settings, the pieces of text ------------------------------------


def format_json(record: logging.LogRecord) -> dict[str, Any]:
    entry: dict[str, Any] = json.loads(JsonFormatter().format(record))
    return entry


def test_json_line_has_the_fixed_fields_and_the_extras() -> None:
    record = logging.LogRecord("delaywheel.x", logging.WARNING, __file__, 1, "a %s", ("b",), None)
    record.__dict__.update(changes=3, where={"k": [1]}, path=Path("/p"))
    entry = format_json(record)
    assert ISO_UTC.fullmatch(entry.pop("ts"))
    assert entry == {
        "level": "WARNING",
        "logger": "delaywheel.x",
        "message": "a b",
        "changes": 3,
        "where": {"k": [1]},
        "path": "/p",  # what JSON cannot hold is shown as its str()
    }


def test_json_line_carries_an_exception_as_one_string() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        record = logging.getLogger("t").makeRecord(
            "t", logging.ERROR, __file__, 1, "failed", (), exc_info=sys.exc_info()
        )
    entry = format_json(record)
    assert entry["message"] == "failed"
    assert entry["exc"].startswith("Traceback (most recent call last):")
    assert entry["exc"].endswith("RuntimeError: boom")


def test_json_ts_is_utc() -> None:
    record = logging.LogRecord("t", logging.INFO, __file__, 1, "m", (), None)
    record.created = 1767225600.25  # 2026-01-01 00:00:00.250 UTC
    assert format_json(record)["ts"] == "2026-01-01T00:00:00.250Z"


def test_shown_settings_hold_every_field_and_no_secret() -> None:
    settings = Settings(
        store_url=f"redis://user:{STORE_PASSWORD}@h:1/0?password={STORE_PASSWORD}",
        token=TOKEN,
        signing_secret=SIGNING_SECRET,
        brokers=(f"a=amqp://guest:{BROKER_PASSWORD}@h/", f"n=nats://{NATS_TOKEN}@h:4222"),
    )
    shown = shown_settings(settings)
    assert list(shown) == [field.name for field in dataclasses.fields(Settings)]
    assert shown["token"] == shown["signing_secret"] == "***"
    assert shown["store_url"] == "redis://user:***@h:1/0?password=***"
    assert shown["brokers"] == ["a=amqp://guest:***@h/", "n=nats://***@h:4222"]
    assert shown["port"] == settings.port and shown["tick_s"] == settings.tick_s
    text = json.dumps(shown)
    assert "c0ffee" not in text
    unset = shown_settings(Settings())
    assert unset["token"] is None and unset["signing_secret"] is None


@pytest.mark.parametrize(
    ("message", "logged"),
    [
        (
            "a message must be an array, got str 'secret body'...",
            "a message must be an array, got str [input not logged]",
        ),
        (
            "method is not valid UTF-8: bin b'\\xff\\xfe'",
            "method is not valid UTF-8: bin [input not logged]",
        ),
        (
            'params must be an array, got str "it\'s"',
            "params must be an array, got str [input not logged]",
        ),
        (
            "undecodable MessagePack byte 0xc1 at stream offset 0",
            "undecodable MessagePack byte 0xc1 at stream offset 0",
        ),
        ("x" * 500, "x" * 197 + "..."),
    ],
)
def test_a_refusal_is_logged_without_what_it_quotes(message: str, logged: str) -> None:
    assert loggable(message) == logged


@pytest.mark.parametrize(
    ("target", "shown"),
    [
        (
            {"type": "http", "method": "PUT", "url": "https://h.example:8443/a/b?token=s#frag"},
            "PUT https://h.example:8443/a/b",
        ),
        (
            {"type": "redis", "key": "jobs", "mode": "stream", "broker": "r"},
            "stream 'jobs' on broker 'r'",
        ),
        (
            {"type": "amqp", "broker": "mq", "exchange": "", "routing_key": "rk"},
            "routing key 'rk' via the default exchange on broker 'mq'",
        ),
        (
            {"type": "amqp", "broker": "mq", "exchange": "ex", "routing_key": "rk"},
            "routing key 'rk' via 'ex' on broker 'mq'",
        ),
        ({"type": "nats", "broker": "bus", "subject": "a.b"}, "subject 'a.b' on broker 'bus'"),
    ],
)
def test_a_destination_shows_no_query_string_and_no_headers(
    target: dict[str, Any], shown: str
) -> None:
    assert destination({**target, "headers": {"Authorization": AUTH_SECRET}}) == shown


# -- the store's health, with a clock of our own ------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def test_an_outage_is_one_line_when_it_begins_and_one_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    watch = StoreWatch("redis://:***@h:1/0", clock=clock)
    caplog.set_level(logging.DEBUG, logger="delaywheel.store")
    for size in (3, 1, 2, 5):
        started_s = watch.started()
        clock.now_s += 0.01
        watch.failed(size, RuntimeError("store redis://:***@h:1/0: write failed: gone"), started_s)
        clock.now_s += 1.0
    assert watch.lost
    watch.written(4, watch.started())
    watch.recovered(0)
    assert not watch.lost
    infos = [(r.levelname, r.getMessage()) for r in caplog.records if r.levelno > logging.DEBUG]
    assert infos == [
        (
            "WARNING",
            "store redis://:***@h:1/0 lost: write failed: gone; "
            "writes answer unavailable until it is back",
        ),
        (
            "INFO",
            "store redis://:***@h:1/0 back after 4.0 s; 4 writes (11 changes) failed meanwhile",
        ),
    ]
    assert len([r for r in caplog.records if r.levelno == logging.DEBUG]) == 3
    fields = vars(caplog.records[-1])
    assert (fields["failed_writes"], fields["failed_changes"], fields["outage_s"]) == (4, 11, 4.04)
    caplog.clear()
    watch.failed(1, RuntimeError("again"), watch.started())  # a new outage is a new line
    assert caplog.records[0].getMessage().startswith("store redis://:***@h:1/0 lost: again")


def test_an_outage_of_some_lanes_ends_when_they_or_their_group_write_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A Cluster primary's partitions failing while another primary's writes
    land is one outage, not a lost/back pair at every write of the other; on
    one Redis (one group) any write that lands ends it."""
    clock = Clock()
    watch = StoreWatch("redis://h:1/0", clock=clock)
    caplog.set_level(logging.INFO, logger="delaywheel.store")
    for lane in (3, 5):  # partitions of primary "b"
        watch.failed(1, RuntimeError("gone"), watch.started(), lane, "b")
    for _ in range(3):  # primary "a"'s writes land meanwhile
        clock.now_s += 1.0
        watch.written(2, watch.started())
        watch.recovered(0, "a")
    assert watch.lost
    watch.recovered(3, "b")  # b is back: its other lanes with it
    assert not watch.lost
    watch.failed(1, RuntimeError("gone"), watch.started(), 7)  # one Redis: group None
    watch.recovered(2)
    assert not watch.lost
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 4 and "back after 3.0 s" in messages[1], messages


def test_a_write_refused_to_a_deposed_owner_is_no_outage(caplog: pytest.LogCaptureFixture) -> None:
    """A fenced write (another node owns the partition now) is the store working:
    no lost line, no back line after it (the coordinator says it, docs/ha.md)."""

    class Refused(RuntimeError):
        reply_code = "moved"  # as FencedWrite's

    watch = StoreWatch("redis://h:1/0", clock=Clock())
    caplog.set_level(logging.INFO, logger="delaywheel.store")
    watch.failed(1, Refused("partition 3 is no longer this node's"), watch.started(), 3)
    assert not watch.lost and not watch.is_failing(3) and watch.failures == 0
    watch.recovered(2)
    assert caplog.records == []


def test_a_slow_write_is_a_warning_with_its_size_and_time(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    watch = StoreWatch("memory://", slow_s=0.5, clock=clock)
    caplog.set_level(logging.DEBUG, logger="delaywheel.store")
    started_s = watch.started()
    clock.now_s += 0.49
    watch.written(10, started_s)
    assert not caplog.records
    started_s = watch.started()
    clock.now_s += 0.75
    watch.written(250, started_s)
    [record] = caplog.records
    assert record.levelname == "WARNING"
    assert record.getMessage() == "slow store write: 250 changes took 0.75 s (threshold 0.5 s)"
    assert (vars(record)["changes"], vars(record)["duration_s"]) == (250, 0.75)


# -- a death is logged once durable ---------------------------------------------------


class FlakyStore(MemoryStore):
    """The memory store, with writes that fail while ``failing`` is set."""

    failing = False

    def submit(self, changes: Changes, done: Done) -> None:
        if self.failing:
            done(StoreUnavailable("store memory://: write failed: test"))
        else:
            super().submit(changes, done)


def test_a_death_is_logged_once_the_store_has_it(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="delaywheel.delivery")
    t0 = 1_800_000_000.0
    url = f"http://127.0.0.1:9/hook?sig={QUERY_SECRET}"
    target = {"type": "http", "url": url, "headers": {"Authorization": AUTH_SECRET}}

    def deaths() -> list[str]:
        return [r.getMessage() for r in caplog.records if "is dead after" in r.getMessage()]

    async def main() -> None:
        store = FlakyStore("memory://")
        await store.open()
        engine = Engine(
            store,
            now_s=t0,
            targets=TargetRules(AllowList.parse("127.0.0.1")),
            retry=RetryPolicy(base_s=1.0, jitter=lambda: 0.0),
        )
        # Every due task's attempt begun at once, nothing sent: the outcomes come below.
        engine.start_deliveries(
            lambda task_id, *_: engine.attempts.begin(task_id, lambda delivery: None) and None
        )
        task_id = engine.add(
            {"topic": "t", "body": MARKER, "target": target, "max_attempts": 1}, t0
        )["id"]
        engine.advance(t0 + 0.1)
        await engine.journal.drain()
        store.failing = True  # the death's write fails: undone, so not logged
        engine.delivered(task_id, 1, "HTTP 500 from http://127.0.0.1:9/hook", t0 + 0.2)
        await engine.journal.drain()
        assert deaths() == []
        shown = engine.get(task_id)
        # Undone: delivering, as in the store; its outcome is journaled again,
        # the attempt is not sent again.
        assert shown is not None and shown["state"] == "delivering"
        store.failing = False
        engine.advance(t0 + 3)  # journaled again a retry base later (and a 1 s tick)
        await engine.journal.drain()
        assert deaths() == [
            f"task {task_id!r} (topic 't') is dead after 1 attempt to http "
            "POST http://127.0.0.1:9/hook: HTTP 500 from http://127.0.0.1:9/hook"
        ]
        await store.close()

    asyncio.run(main())


def test_loading_reports_its_progress_under_its_documented_logger(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``loaded N tasks so far``, logger ``delaywheel.loading``
    (docs/operations.md, "Logging"), whatever module loads."""
    monkeypatch.setattr(delaywheel.engine.cold, "LOAD_PROGRESS_EVERY", 3)
    caplog.set_level(logging.INFO, logger="delaywheel.loading")

    async def main() -> None:
        store = MemoryStore("memory://")
        await store.open()
        t0 = 1_800_000_000.0
        before = Engine(store, now_s=t0)
        for i in range(7):
            before.add({"id": f"t{i}", "topic": "t", "delay": 10 * i}, t0)
        await before.journal.drain()
        after = Engine(store, now_s=t0)
        assert await after.load(store.load(batch_size=2)) == 7

    asyncio.run(main())
    lines = [(r.name, r.getMessage()) for r in caplog.records if r.name == "delaywheel.loading"]
    assert lines == [("delaywheel.loading", f"loaded {n} tasks so far") for n in (4, 6)]
