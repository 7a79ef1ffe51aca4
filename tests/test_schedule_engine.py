"""Saved schedules on a real in-process server (memory store, a fast tick),
spoken to by AsyncClient: occurrences fire once each under their ids, edits,
pause, resume, delete, trigger, backfill and the refusals (docs/schedules.md)."""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from delaywheel_client import AsyncClient
from delaywheel_client.errors import DelaywheelError

from delaywheel.config import Settings
from delaywheel.engine.engine import Engine
from delaywheel.net.server import Server
from delaywheel.store.memory import MemoryStore

TICK_S = 0.05


@asynccontextmanager
async def served() -> AsyncIterator[AsyncClient]:
    config = Settings(port=0, store_url="memory://", tick_s=TICK_S)
    store = MemoryStore("memory://")
    await store.open()
    engine = Engine(store, now_s=time.time(), tick_s=config.tick_s, limits=config.limits)
    server = Server(config, engine)
    address = await server.start()
    try:
        async with await AsyncClient.connect(*address) as dw:
            yield dw
    finally:
        await server.stop()
        await store.close()


async def _drain(dw: AsyncClient, topic: str, until_s: float) -> list[str]:
    """The ids reserved from ``topic`` until the wall clock passes ``until_s``
    (ttr 0: each is gone once handed out)."""
    ids = []
    while time.time() < until_s:
        task = await dw.reserve(topic, timeout=0.2)
        if task is not None:
            ids.append(task["id"])
    return ids


def _nominals(ids: list[str], schedule_id: str) -> list[int]:
    prefix = f"s:{schedule_id}:"
    assert all(task_id.startswith(prefix) for task_id in ids), ids
    return [int(task_id[len(prefix) :]) for task_id in ids]


@pytest.mark.slow
def test_every_occurrence_fires_once_under_its_nominal_id() -> None:
    async def run() -> tuple[list[str], dict[str, Any], dict[str, Any]]:
        async with served() as dw:
            added = await dw.schedule_add({"id": "tick", "every": 1, "topic": "t", "ttr": 0})
            assert added["version"] == 1 and added["next"] > time.time() - 0.01
            ids = await _drain(dw, "t", time.time() + 3.6)
            return ids, await dw.schedule_get("tick"), await dw.stats()

    ids, state, stats = asyncio.run(run())
    nominals = _nominals(ids, "tick")
    assert len(nominals) >= 3
    assert nominals == list(range(nominals[0], nominals[0] + len(nominals)))  # no gap, no double
    assert state["counts"]["fired"] == len(ids)
    assert state["last_fired"] == nominals[-1]
    assert state["counts"]["skipped"] == state["counts"]["missed"] == 0
    assert stats["schedules"] == {"count": 1, "paused": 0}


def test_update_pause_resume_delete() -> None:
    async def run() -> list[Any]:
        out: list[Any] = []
        async with served() as dw:
            await dw.schedule_add({"id": "e", "every": 3600, "topic": "t"})
            with pytest.raises(DelaywheelError) as stale:
                await dw.schedule_update("e", {"every": 60}, 7)
            out.append(stale.value)
            updated = await dw.schedule_update("e", {"every": 60, "jitter": 5}, 1)
            out.append(updated)
            paused = await dw.schedule_pause("e", "deploy")
            out.append(paused)
            out.append(await dw.schedule_list(paused=True))
            out.append(await dw.schedule_next("e", 2))
            resumed = await dw.schedule_resume("e")
            out.append(resumed)
            out.append(await dw.schedule_next("e", 2))
            out.append(await dw.schedule_delete("e"))
            out.append(await dw.schedule_delete("e"))
            out.append(await dw.schedule_get("e"))
        return out

    now = time.time()
    stale, updated, paused, listed, paused_next, resumed, resumed_next, *rest = asyncio.run(run())
    assert stale.code == "conflict" and "version 1" in str(stale)
    assert updated["version"] == 2 and updated["every"] == 60 and updated["jitter"] == 5
    assert updated["next"] % 60 == 0 and now < updated["next"] <= now + 61
    assert paused["paused"] and paused["note"] == "deploy" and paused["next"] is None
    assert [s["id"] for s in listed["schedules"]] == ["e"] and listed["next"] is None
    assert paused_next["times"] == []
    assert not resumed["paused"] and resumed["note"] is None and resumed["version"] == 4
    assert [t["utc"] for t in resumed_next["times"]] == [resumed["next"], resumed["next"] + 60]
    assert rest == [True, False, None]


def test_list_pages_by_id_with_a_cursor() -> None:
    async def run() -> list[list[str]]:
        pages = []
        async with served() as dw:
            for n in range(5):
                await dw.schedule_add({"id": f"s{n}", "every": 3600, "topic": f"t{n % 2}"})
            cursor = None
            while True:
                page = await dw.schedule_list(limit=2, cursor=cursor)
                pages.append([s["id"] for s in page["schedules"]])
                cursor = page["next"]
                if cursor is None:
                    break
            odd = await dw.schedule_list(topic="t1")
            pages.append([s["id"] for s in odd["schedules"]])
        return pages

    assert asyncio.run(run()) == [["s0", "s1"], ["s2", "s3"], ["s4"], ["s1", "s3"]]


def test_trigger_and_backfill_put_occurrences_now() -> None:
    async def run() -> tuple[Any, ...]:
        async with served() as dw:
            await dw.schedule_add({"id": "b", "every": 60, "topic": "bt", "anchor": 0})
            triggered = await dw.schedule_trigger("b")
            now = time.time()
            start = (now // 60 - 3) * 60
            filled = await dw.schedule_backfill("b", start, now)
            again = await dw.schedule_backfill("b", start, now)
            got = await dw.get(triggered["id"])
            return triggered, filled, again, got, start

    triggered, filled, again, got, start = asyncio.run(run())
    assert triggered["id"].startswith("s:b:") and got["state"] == "ready"
    assert filled["ids"] == [f"s:b:{int(start) + 60 * k}" for k in range(4)]
    assert again == {"ids": [], "existing": 4}  # one already put is a no-op


@pytest.mark.parametrize(
    ("call", "params", "code", "named"),
    [
        ("schedule_add", [{"id": "x", "every": 60}], "bad_request", "topic"),
        ("schedule_add", [{"id": "x", "every": 0.01, "topic": "t"}], "bad_request", "every"),
        ("schedule_add", [{"id": "x", "cron": "0 25 * * *", "topic": "t"}], "bad_request", "25"),
        (
            "schedule_add",
            [{"id": "x", "every": 60, "topic": "t", "colour": 1}],
            "bad_request",
            "colour",
        ),
        ("schedule_add", [{"id": "x", "every": 60, "topic": "t", "ttr": -1}], "bad_request", "ttr"),
        (
            "schedule_add",
            [{"id": "x", "cron": "* * * * *", "tz": "EST", "topic": "t"}],
            "bad_request",
            "tz",
        ),
        ("schedule_update", ["nope", {}, None], "not_found", "nope"),
        ("schedule_update", ["dup", {"overlap": "never"}, None], "bad_request", "overlap"),
        ("schedule_update", ["dup", {}, "1"], "bad_request", "expected_version"),
        ("schedule_pause", ["dup", 5], "bad_request", "note"),
        ("schedule_list", [{"limit": 0}], "bad_request", "limit"),
        ("schedule_list", [{"paused": "yes"}], "bad_request", "paused"),
        ("schedule_backfill", ["dup", "a", 1], "bad_request", "start"),
        ("schedule_get", [5], "bad_request", "id"),
        ("schedule_add", [{"id": "dup", "every": 60, "topic": "t"}], "exists", "dup"),
        ("add", [{"id": "s:dup:00", "topic": "t"}], "bad_request", "s:dup:00"),
    ],
)
def test_bad_input_is_refused_naming_the_value(
    call: str, params: list[Any], code: str, named: str
) -> None:
    async def run() -> DelaywheelError:
        async with served() as dw:
            await dw.schedule_add({"id": "dup", "every": 60, "topic": "t"})
            with pytest.raises(DelaywheelError) as caught:
                await dw.call(call, *params)
            return caught.value

    error = asyncio.run(run())
    assert error.code == code and named in str(error)


@pytest.mark.slow
def test_overlap_skip_counts_occurrences_while_the_previous_is_reserved() -> None:
    async def run() -> tuple[dict[str, Any], list[str]]:
        async with served() as dw:
            await dw.schedule_add({"id": "o", "every": 1, "topic": "ov", "ttr": 60})
            first = await dw.reserve("ov", timeout=3)
            assert first is not None
            await asyncio.sleep(2.2)  # two more occurrences come due, the first still reserved
            held = await dw.schedule_get("o")
            await dw.ack(first["id"])
            later = await _drain(dw, "ov", time.time() + 1.6)
            return held, [first["id"], *later]

    held, ids = asyncio.run(run())
    assert held["counts"]["skipped"] >= 2 and held["counts"]["fired"] == 1
    assert len(ids) >= 2 and len(set(ids)) == len(ids)


@pytest.mark.slow
def test_random_updates_pauses_and_resumes_fire_nothing_retroactive() -> None:
    """A seeded random run of update (every 1 or 2 s), pause and resume while
    a worker drains the occurrences: no id twice, no occurrence whose nominal
    time lies between an edit and the ``next`` that edit answered (for a
    pause: until the resume's), none missed while the server is up, and
    ``fired`` is what the worker got. The counters balance: fired + skipped +
    missed is the number of occurrences the schedule passed while active, each
    span from a reply's ``next`` (at its ``every``) up to the following edit
    (those due in the last 0.25 s before it may or may not have been decided)."""
    rng = random.Random(1703)
    edits: list[tuple[float, float]] = []  # (sent at, next it answered; inf while paused)
    # (sent at, answered at, next it answered or None, every): the add and each edit.
    spans: list[tuple[float, float, float | None, float]] = []

    async def run() -> tuple[list[str], dict[str, Any]]:
        async with served() as dw:
            sent_s = time.time()
            added = await dw.schedule_add({"id": "r", "every": 1, "topic": "r", "ttr": 0})
            spans.append((sent_s, time.time(), added["next"], added["every"]))
            drained: list[str] = []
            worker = asyncio.ensure_future(_drain_into(dw, "r", drained))
            version, paused = 1, False
            for _ in range(12):
                await asyncio.sleep(rng.uniform(0.1, 0.7))
                sent_s = time.time()
                if paused:
                    state = await dw.schedule_resume("r")
                elif rng.random() < 0.3:
                    state = await dw.schedule_pause("r", "random")
                else:
                    changes = {"every": rng.choice([1, 2])}
                    state = await dw.schedule_update("r", changes, version)
                version, paused = state["version"], state["paused"]
                edits.append((sent_s, math.inf if paused else state["next"]))
                spans.append((sent_s, time.time(), state["next"], state["every"]))
            sent_s = time.time()
            await dw.schedule_pause("r", "end")
            edits.append((sent_s, math.inf))
            spans.append((sent_s, time.time(), None, 0))
            await asyncio.sleep(1.5)  # what was due before the pause is handed out
            worker.cancel()
            return drained, await dw.schedule_get("r")

    ids, state = asyncio.run(run())
    nominals = _nominals(ids, "r")
    assert len(nominals) == len(set(nominals)) >= 3
    for i, (sent_s, next_s) in enumerate(edits):
        following_s = edits[i + 1][0] if i + 1 < len(edits) else math.inf
        until_s = min(next_s, following_s)  # a pause holds until the next edit
        retroactive = [n for n in nominals if sent_s <= n < until_s]
        assert retroactive == [], (sent_s, next_s, retroactive)
    assert state["counts"]["fired"] == len(ids)
    assert state["counts"]["missed"] == 0
    low = high = 0
    for (_, _, next_s, every_s), (sent_s, done_s, _, _) in itertools.pairwise(spans):
        if next_s is not None:
            low += max(0, math.ceil((sent_s - 0.25 - next_s) / every_s))
            high += max(0, math.floor((done_s - next_s) / every_s) + 1)
    assert low <= sum(state["counts"].values()) <= high, (state["counts"], low, high)


async def _drain_into(dw: AsyncClient, topic: str, ids: list[str]) -> None:
    while True:
        task = await dw.reserve(topic, timeout=0.2)
        if task is not None:
            ids.append(task["id"])
